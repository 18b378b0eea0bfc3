"""Orphan hygiene: containers labelled with this daemon's owner id that it does not know go away."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from rlsandbox.daemon.agent.socket_transport import STAGE_PREFIX, sweep_stages
from rlsandbox.daemon.errors import SandboxError
from rlsandbox.daemon.pool.factory import SandboxFactory, socket_folder_name
from rlsandbox.daemon.runtime.docker import LABEL_CREATED, LABEL_MANAGED, LABEL_OWNER

log = logging.getLogger(__name__)
RETRY_INTERVAL = 5.0  # seconds between sweeps while a removal that failed is still pending


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
            if now - created < grace and c.name not in self._factory.unremoved:
                continue
            try:
                if await runtime.remove(c.id):
                    removed.append(c.name)
            except SandboxError as e:  # one stuck container never stops the sweep of the others
                log.warning("orphan %s: remove failed, will retry: %s", c.name, e)
                continue
            self._factory.unremoved.pop(c.name, None)
            await self._factory.remove_folder(c.name)
        listed = {c.name for c in owned}
        for name in [n for n in self._factory.unremoved if n not in listed]:
            self._factory.unremoved.pop(name, None)  # the engine no longer lists it: gone
        await self._sweep_folders(listed)
        if removed:
            self.removed_total += len(removed)
            log.warning(
                "removed %d orphaned sandbox containers of owner %s: %s",
                len(removed),
                runtime.owner,
                ", ".join(removed[:20]),
            )
        return removed

    async def _sweep_folders(self, listed: set[str]) -> None:
        """Socket folders of sandboxes that no longer exist (a container gone while no daemon ran)."""
        root = self._factory.socket_root
        if root is None:
            return
        await asyncio.to_thread(sweep_stages, root)
        names = await asyncio.to_thread(lambda: [p.name for p in root.iterdir()] if root.is_dir() else [])
        keep = {socket_folder_name(n) for n in (*listed, *self._factory.live)}
        for name in names:
            if name not in keep and not name.startswith(STAGE_PREFIX):
                await self._factory.remove_folder_named(name)

    async def run(self) -> None:
        """Periodic sweeps until :meth:`stop`."""
        while not self._stop.is_set():
            # Removals that failed are retried soon, not a whole interval later.
            interval = min(self._interval, RETRY_INTERVAL) if self._factory.unremoved else self._interval
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._stop.wait()
            if self._stop.is_set():
                return
            try:
                await self.sweep()
            except SandboxError as e:
                log.warning("orphan sweep failed, will retry in %.0f s: %s", self._interval, e)

    def stop(self) -> None:
        self._stop.set()
