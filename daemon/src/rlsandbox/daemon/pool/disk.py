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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time

from rlsandbox.daemon.errors import SandboxError
from rlsandbox.daemon.pool.factory import SandboxFactory
from rlsandbox.daemon.runtime.docker import LABEL_DISK, LABEL_MANAGED, LABEL_OWNER

log = logging.getLogger(__name__)
MiB = 1 << 20
WARN_EVERY = 60.0  # seconds between warnings of a low disk that no sandbox is to blame for


class DiskGuard:
    """Args:
    factory: the sandboxes' maker; it learns why the guard killed one (``faults``).
    floor_bytes: free bytes on the engine's data-root below which the guard acts (0: never).
    interval: seconds between looks at the free space.
    path: the engine's data-root as this process sees it (default: asked of the engine).
    """

    def __init__(self, factory: SandboxFactory, *, floor_bytes: int, interval: float, path: str = "") -> None:
        self._factory = factory
        self.floor = floor_bytes
        self.interval = interval
        self.path = path
        self.killed_total = 0
        self._warned = 0.0
        self._stop = asyncio.Event()

    def free(self) -> int | None:
        """Free bytes on the data-root (for unprivileged writers), None when it cannot be read."""
        try:
            st = os.statvfs(self.path)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    async def check(self) -> list[str]:
        """One look; returns the names of the sandboxes it ended."""
        free = self.free()
        if free is None or free >= self.floor:
            return []
        runtime = self._factory.runtime
        owned = await runtime.list_containers({LABEL_MANAGED: "1", LABEL_OWNER: runtime.owner}, timeout=60, size=True)
        over = [c for c in owned if c.state == "running" and 0 < int(c.labels.get(LABEL_DISK) or 0) < c.size_rw]
        killed = []
        for c in sorted(over, key=lambda c: -c.size_rw):
            budget = int(c.labels[LABEL_DISK])
            why = (
                f"the episode wrote {c.size_rw // MiB} MB to its sandbox's file system, past its pool's disk_mb of "
                f"{budget // MiB} MB, while the node's disk ran low ({free // MiB} MB free)"
            )
            self._factory.faults[c.id] = why  # before the kill: whoever finds it dead asks why
            if await runtime.kill(c.id):
                killed.append(c.name)
                self.killed_total += 1
                log.warning("disk guard: ended %s: %s", c.name, why)
            else:
                self._factory.faults.pop(c.id, None)
        if not over and time.monotonic() - self._warned > WARN_EVERY:
            self._warned = time.monotonic()
            log.warning("disk guard: %d MB free on %s and no sandbox past its disk_mb", free // MiB, self.path)
        return killed

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
        if self.free() is None:
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
