"""Orphan hygiene: containers labelled with this daemon's owner id that it does not know go away."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time

from rlsandbox.daemon.errors import SandboxError
from rlsandbox.daemon.pool.factory import SandboxFactory
from rlsandbox.daemon.runtime.docker import LABEL_CREATED, LABEL_MANAGED, LABEL_OWNER

log = logging.getLogger(__name__)


class Reconciler:
    """Removes containers of this owner that no live sandbox accounts for.

    Args:
        factory: knows every container this process has made and not yet removed.
        interval: seconds between periodic sweeps.
        grace: containers younger than this are left alone by periodic sweeps, so that a create
            that has not reported its name back yet is never raced.
    """

    def __init__(self, factory: SandboxFactory, *, interval: float = 60.0, grace: float = 120.0) -> None:
        self._factory = factory
        self._interval = interval
        self._grace = grace
        self.removed_total = 0
        self._stop = asyncio.Event()

    async def sweep(self, *, grace: float | None = None) -> list[str]:
        """One pass; returns the names of the containers removed."""
        runtime = self._factory.runtime
        grace = self._grace if grace is None else grace
        owned = await runtime.list_containers({LABEL_MANAGED: "1", LABEL_OWNER: runtime.owner})
        now = time.time()
        removed = []
        for c in owned:
            if c.name in self._factory.live:
                continue
            created = float(c.labels.get(LABEL_CREATED) or c.created or 0)
            if now - created < grace:
                continue
            if await runtime.remove(c.id):
                removed.append(c.name)
            if self._factory.socket_root is not None:  # its agent's socket folder, if it had one
                shutil.rmtree(self._factory.socket_root / c.name, ignore_errors=True)
        if removed:
            self.removed_total += len(removed)
            log.warning(
                "removed %d orphaned sandbox containers of owner %s: %s",
                len(removed),
                runtime.owner,
                ", ".join(removed[:20]),
            )
        return removed

    async def run(self) -> None:
        """Periodic sweeps until :meth:`stop`."""
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await self._stop.wait()
            if self._stop.is_set():
                return
            try:
                await self.sweep()
            except SandboxError as e:
                log.warning("orphan sweep failed, will retry in %.0f s: %s", self._interval, e)

    def stop(self) -> None:
        self._stop.set()
