"""Files the daemon drops in a sandbox's host folder for one command (agent/socket_transport.py):
private to root, gone after the command, gone with the folder even after a crash, and never
written through anything already at their path."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from rlsandbox.daemon.agent.socket_transport import DROP_PREFIX, _write_new, dropped, remove_folder
from rlsandbox.daemon.runtime.container import SOCKET_MOUNT


async def test_a_dropped_file_is_private_seen_at_the_mount_and_removed_after(tmp_path: Path) -> None:
    async with dropped(tmp_path, b"tarball") as inside:
        [made] = list(tmp_path.iterdir())
        assert inside == f"{SOCKET_MOUNT}/{made.name}" and made.name.startswith(DROP_PREFIX)
        assert made.read_bytes() == b"tarball" and stat.S_IMODE(made.stat().st_mode) == 0o600
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError):
        async with dropped(tmp_path, b"x"):
            raise RuntimeError("the command failed")
    assert list(tmp_path.iterdir()) == []


def test_a_drop_never_writes_through_what_is_at_its_path(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    (tmp_path / "drop-x").symlink_to(outside)
    with pytest.raises(FileExistsError):
        _write_new(tmp_path / "drop-x", b"evil")
    assert outside.read_bytes() == b"keep"


def test_removing_a_folder_takes_drops_a_crash_left(tmp_path: Path) -> None:
    folder = tmp_path / "s-1"
    folder.mkdir()
    (folder / "agent.sock").write_bytes(b"")
    (folder / f"{DROP_PREFIX}abc").write_bytes(b"left by a crash")
    remove_folder(folder, "agent.sock")
    assert not folder.exists()
    os.makedirs(folder)  # and a folder without drops still goes
    remove_folder(folder, "agent.sock")
    assert not folder.exists()
