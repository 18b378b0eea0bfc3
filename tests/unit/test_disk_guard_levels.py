"""The disk guard's levels (pool/disk.py) against the real statvfs of a folder: what the disk
lacks to be above the critical level, and that the critical level never exceeds the floor."""

from __future__ import annotations

import os
from pathlib import Path

from rlsandbox.daemon.pool.disk import DiskGuard

GiB = 1 << 30


def free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_the_shortfall_is_what_the_disk_lacks_to_reach_the_critical_level(tmp_path: Path) -> None:
    now = free(tmp_path)
    guard = DiskGuard(None, floor_bytes=4 * now, critical_bytes=2 * now, interval=1, path=str(tmp_path))  # type: ignore[arg-type]
    assert abs(guard.shortfall() - now) < GiB  # 2 * free - free, give or take what others write meanwhile
    assert guard.low() is not None


def test_no_shortfall_above_the_critical_level_or_without_one(tmp_path: Path) -> None:
    roomy = DiskGuard(None, floor_bytes=1 << 20, critical_bytes=1 << 20, interval=1, path=str(tmp_path))  # type: ignore[arg-type]
    assert roomy.shortfall() == 0
    off = DiskGuard(None, floor_bytes=1 << 60, critical_bytes=0, interval=1, path=str(tmp_path))  # type: ignore[arg-type]
    assert off.shortfall() == 0 and off.low() is not None


def test_the_critical_level_is_at_most_the_floor(tmp_path: Path) -> None:
    guard = DiskGuard(None, floor_bytes=1 << 20, critical_bytes=1 << 60, interval=1, path=str(tmp_path))  # type: ignore[arg-type]
    assert guard.critical == 1 << 20 and guard.shortfall() == 0
