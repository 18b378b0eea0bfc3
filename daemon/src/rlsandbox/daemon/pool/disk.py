"""The node's disk guard: once the engine's disk runs low, a sandbox may keep on its writable layer
(what it writes outside its tmpfs places) only what its pool's ``disk_mb`` allows.

overlay2 caps a writable layer only on XFS mounted with project quotas (Docker's ``storage-opt
size``); an ext4 data-root has no such cap, and this machine's kernel has no XFS quota support at
all. So the guard acts instead: every ``interval`` it reads the free space of the engine's
data-root (statvfs: cheap); below ``floor`` it asks the engine for every sandbox's writable layer
size (the engine walks the layers: costly, so only then) and SIGKILLs each sandbox past its
budget, the largest first, telling the factory why: its session ends as the episode's own doing,
which grades reward 0 and is never masked (docs/GRADING.md), and so does a clean room the
episode's code filled (grading/grader.py).

Budgets alone do not keep the disk: a pool's ``disk_mb`` times its ``max_total`` is far more
than a node has, so sandboxes each within budget can fill it together. Below ``critical`` (or
half the inode share) the guard then also ends the sandboxes holding the most, the largest first,
until what they hold would bring the disk back to ``critical``: on a disk about to run out, the
largest holders are the likeliest cause, and the episode's doing as well (reward 0, not masked: a
policy must not be able to write its way into a masked episode).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from rlsandbox.daemon.errors import FileTooLarge, SandboxError
from rlsandbox.daemon.pool.factory import SandboxFactory
from rlsandbox.daemon.runtime.docker import LABEL_DISK, LABEL_MANAGED, LABEL_OWNER

log = logging.getLogger(__name__)
MiB = 1 << 20
WARN_EVERY = 60.0  # seconds between warnings of a low disk that no sandbox is to blame for
INODE_FLOOR = 0.05  # the data-root's inodes free, as a share, below which its disk counts as low
FILE_COST = 4096  # bytes of a pool's disk_mb each file or folder in a sandbox's layer counts for
MIN_HOLDING = 1 << 20  # a sandbox holding less is never ended for a critically low disk: it frees nothing


class DiskGuard:
    """Args:
    factory: the sandboxes' maker; it learns why the guard killed one (``faults``).
    floor_bytes: free bytes on the engine's data-root below which the guard acts (0: never).
    critical_bytes: free bytes below which the largest holders are ended even within their
        budgets (0: never; at most ``floor_bytes``).
    in_use: the container ids of the sandboxes in use; only those are ended for a critically
        low disk (a ready sandbox holds its pool's setup, which its refill would write again).
    interval: seconds between looks at the free space.
    path: the engine's data-root as this process sees it (default: asked of the engine).
    """

    def __init__(
        self,
        factory: SandboxFactory,
        *,
        floor_bytes: int,
        interval: float,
        path: str = "",
        critical_bytes: int = 0,
        in_use: Callable[[], set[str]] = set,
    ) -> None:
        self._factory = factory
        self._in_use = in_use
        self.floor = floor_bytes
        self.critical = min(critical_bytes, floor_bytes)
        self.interval = interval
        self.path = path
        self.killed_total = 0
        self._warned = 0.0
        self._info: dict[str, dict[str, Any]] = {}  # container id -> its inspect (the layers' folders)
        self._stop = asyncio.Event()

    def low(self) -> str | None:
        """What is running low on the data-root ("N MB free", "N files free": its bytes, or its
        inodes, which a sandbox's empty files use up without a byte to show), None when neither
        is or it cannot be read."""
        st = self._statvfs()
        if st is None:
            return None
        free = st.f_bavail * st.f_frsize
        if free < self.floor:
            return f"{free // MiB} MB free"
        if st.f_files and st.f_favail < st.f_files * INODE_FLOOR:
            return f"{st.f_favail} files free"
        return None

    def shortfall(self) -> int:
        """What the data-root lacks to be above ``critical`` again, in the budgets' measure (bytes,
        FILE_COST per missing inode); 0 when it is not critically low (or cannot be read)."""
        st = self._statvfs() if self.critical else None
        if st is None:
            return 0
        inodes = int(st.f_files * INODE_FLOOR / 2) - st.f_favail if st.f_files else 0
        return max(0, self.critical - st.f_bavail * st.f_frsize, inodes * FILE_COST)

    def _statvfs(self) -> os.statvfs_result | None:
        try:
            return os.statvfs(self.path)
        except OSError:
            return None

    async def check(self) -> list[str]:
        """One look; returns the names of the sandboxes it ended."""
        low = self.low()
        if low is None:
            return []
        runtime = self._factory.runtime
        owned = await runtime.list_containers({LABEL_MANAGED: "1", LABEL_OWNER: runtime.owner}, timeout=60, size=True)
        live = {c.id for c in owned}
        self._info = {cid: info for cid, info in self._info.items() if cid in live}
        held = []
        for c in owned:
            budget = int(c.labels.get(LABEL_DISK) or 0)
            if c.state != "running" or not budget:
                continue
            files = 0 if c.size_rw > budget else await self._files(c.id, budget)
            held.append((c.size_rw + files * FILE_COST, c, budget, files))
        held.sort(key=lambda h: -h[0])
        killed: list[str] = []
        freed = 0
        for holding, c, budget, files in held:
            if holding > budget:
                why = f"the episode kept {_kept(c.size_rw, files)} in its sandbox's file system, past its pool's disk_mb of "
                why += f"{budget // MiB} MB, while the node's disk ran low ({low})"
                freed += await self._end(c.id, c.name, why, killed, holding)
        need = self.shortfall()
        in_use = self._in_use() if need else set()
        for holding, c, budget, files in held:
            if freed >= need or holding < MIN_HOLDING:
                break
            if holding <= budget and c.id in in_use:
                why = f"the node's disk was critically low ({low}) and the episode held among the most of it: "
                why += f"{_kept(c.size_rw, files)} in its sandbox's file system (within its pool's disk_mb of {budget // MiB} MB)"
                freed += await self._end(c.id, c.name, why, killed, holding)
        if not killed and time.monotonic() - self._warned > WARN_EVERY:
            self._warned = time.monotonic()
            log.warning("disk guard: %s on %s and no sandbox past its disk_mb", low, self.path)
        return killed

    async def _end(self, container_id: str, name: str, why: str, killed: list[str], holding: int) -> int:
        """SIGKILL a sandbox as its episode's doing; what it held (0 when it could not be ended)."""
        self._factory.faults[container_id] = why  # before the kill: whoever finds it dead asks why
        if not await self._factory.runtime.kill(container_id):
            self._factory.faults.pop(container_id, None)
            return 0
        killed.append(name)
        self.killed_total += 1
        log.warning("disk guard: ended %s: %s", name, why)
        return holding

    async def _files(self, container_id: str, budget: int) -> int:
        """Entries the sandbox added or changed in its layer, counted up to what its budget allows
        (the engine's diff, walked on the host where it can be: runtime/overlay.py, no link
        followed, bounded); past it, one more than the budget allows."""
        allowed = budget // FILE_COST
        runtime = self._factory.runtime
        try:
            if container_id not in self._info:
                self._info[container_id] = await runtime.inspect(container_id, timeout=10)
            changed = await runtime.changes(container_id, timeout=30, max_bytes=allowed * 64, info=self._info[container_id])
        except FileTooLarge:
            return allowed + 1
        except SandboxError:
            return 0  # gone meanwhile
        return len(changed)

    async def run(self) -> None:
        """Looks every ``interval`` until :meth:`stop`; off where the data-root cannot be read."""
        if not self.floor:
            return
        if not self.path:
            try:
                self.path = await self._factory.runtime.data_root()
            except SandboxError as e:
                log.warning("disk guard off: the engine did not say where its data-root is: %s", e)
                return
        if self._statvfs() is None:
            log.warning("disk guard off: %s (the engine's data-root) cannot be read here", self.path)
            return
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self._stop.wait()
            if self._stop.is_set():
                return
            try:
                await self.check()
            except SandboxError as e:
                log.warning("disk guard: %s", e)

    def stop(self) -> None:
        self._stop.set()


def _kept(size_rw: int, files: int) -> str:
    return f"{size_rw // MiB} MB" + (f" in {files} files and folders (each counts {FILE_COST} bytes)" if files else "")
