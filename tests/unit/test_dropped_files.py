"""Tarballs the daemon hands to sandboxes as files (agent/socket_transport.py ``Drop``): staged
once on the host whatever the number of sandboxes, linked into each sandbox's folder private to
root and gone after the command, within a node-wide budget (past it, or when the host refuses
the file, the tarball goes as stdin), gone with the folder even after a crash, and never written
through anything already at their path."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest
from rlsandbox.daemon.agent import socket_transport
from rlsandbox.daemon.agent.socket_transport import (
    DROP_PREFIX,
    STAGE_PREFIX,
    Drop,
    _write_new,
    remove_folder,
    sweep_stages,
)
from rlsandbox.daemon.runtime.container import SOCKET_MOUNT


def folders(root: Path, count: int) -> list[Path]:
    made = [root / f"s-{i}" for i in range(count)]
    for folder in made:
        folder.mkdir()
    return made


def stages(root: Path) -> list[Path]:
    return [p for p in root.iterdir() if p.name.startswith(STAGE_PREFIX)]


async def test_a_drop_is_staged_once_linked_private_into_each_folder_and_removed_after(tmp_path: Path) -> None:
    a, b = folders(tmp_path, 2)
    budget = Drop.budget_left
    async with Drop(b"tarball") as drop:
        async with drop.placed(a) as in_a, drop.placed(b) as in_b:
            [made_a], [made_b] = list(a.iterdir()), list(b.iterdir())
            assert in_a == f"{SOCKET_MOUNT}/{made_a.name}" and made_a.name.startswith(DROP_PREFIX)
            assert in_b == f"{SOCKET_MOUNT}/{made_b.name}"
            assert made_a.read_bytes() == b"tarball" and stat.S_IMODE(made_a.stat().st_mode) == 0o600
            [staged] = stages(tmp_path)  # the bytes are on the host once
            assert os.path.samefile(staged, made_a) and os.path.samefile(staged, made_b)
            assert Drop.budget_left == budget - len(b"tarball")
        assert list(a.iterdir()) == [] and list(b.iterdir()) == []
        with pytest.raises(RuntimeError):
            async with drop.placed(a):
                raise RuntimeError("the command failed")
        assert list(a.iterdir()) == []
    assert stages(tmp_path) == [] and Drop.budget_left == budget


async def test_without_a_folder_or_past_the_budget_the_tarball_goes_as_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    [folder] = folders(tmp_path, 1)
    async with Drop(b"x" * 100) as drop, drop.placed(None) as path:
        assert path is None
    monkeypatch.setattr(Drop, "budget_left", 150)
    async with Drop(b"x" * 100) as first, first.placed(folder) as path:
        assert path is not None
        async with Drop(b"y" * 100) as second, second.placed(folder) as other:
            assert other is None  # both would pass the node's budget
    assert Drop.budget_left == 150 and stages(tmp_path) == []
    async with Drop(b"y" * 100) as third, third.placed(folder) as path:  # the first has left
        assert path is not None


async def test_a_host_that_refuses_the_file_means_stdin_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    [folder] = folders(tmp_path, 1)
    budget = Drop.budget_left

    def full(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(socket_transport, "_write_new", full)
    async with Drop(b"tarball") as drop:
        async with drop.placed(folder) as path:
            assert path is None
        async with drop.placed(folder) as path:  # and it does not try again
            assert path is None
    assert Drop.budget_left == budget and stages(tmp_path) == []


async def test_a_cancelled_staging_gives_its_budget_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    [folder] = folders(tmp_path, 1)
    budget = Drop.budget_left
    started = asyncio.Event()

    async def slow(*args: object) -> None:
        started.set()
        await asyncio.sleep(60)

    monkeypatch.setattr(socket_transport.asyncio, "to_thread", slow)
    drop = Drop(b"tarball")

    async def take() -> None:
        async with drop.placed(folder):
            pass

    task = asyncio.create_task(take())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert Drop.budget_left == budget and set() == socket_transport._STAGED


async def test_a_sweep_takes_what_a_crash_staged_but_never_a_live_drop(tmp_path: Path) -> None:
    [folder] = folders(tmp_path, 1)
    (tmp_path / f"{STAGE_PREFIX}left-by-a-crash").write_bytes(b"old")
    async with Drop(b"live") as drop, drop.placed(folder):
        [live] = [p for p in stages(tmp_path) if "crash" not in p.name]
        assert sweep_stages(tmp_path) == 1
        assert stages(tmp_path) == [live] and folder.exists()
    assert sweep_stages(tmp_path) == 0 and stages(tmp_path) == []
    assert sweep_stages(tmp_path / "no-such-root") == 0


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
