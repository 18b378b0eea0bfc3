"""The node's pools: the configured ones, and pools made on demand per image.

Datasets like SWE-bench, SWE-Gym or R2E-Gym publish one image per instance (thousands). A
CreateSession or Prefetch may name an image no configured pool has: the catalog makes a pool for
it from the first ``image_pools.templates`` entry whose ``image`` pattern matches (limits,
runtime, recycling, ...), pulling the image from ``image_pools.registry`` when the node does not
have it. Image pools share one warm budget (ready sandboxes node-wide) by recent demand, are
removed after ``idle_evict`` seconds without use, and the images pulled for them are removed,
least recently used first, past ``disk_budget_gb``.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import logging
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any

from rlsandbox.daemon.errors import FailedPrecondition, ResourceExhausted, SandboxError
from rlsandbox.daemon.flight import SingleFlight
from rlsandbox.daemon.model import image_pool_name
from rlsandbox.daemon.pool.factory import SandboxFactory
from rlsandbox.daemon.pool.spec import PoolSpec
from rlsandbox.daemon.pool.warm_pool import CreateLimiter, WarmPool

log = logging.getLogger(__name__)

DEMAND_WINDOW = 60.0  # seconds of hand-outs that count as an image pool's recent demand
REBALANCE_INTERVAL = 2.0

Spawn = Callable[[Coroutine[Any, Any, None], str], object]


class PoolCatalog(Mapping[str, WarmPool]):
    """Every pool of the node by name (a read-only mapping), and :meth:`for_image`.

    Args:
        configured: the pools of the configuration.
        factory, limiter, max_waiters: what image pools are made with (as configured pools).
        templates: (image pattern, spec maker) pairs, first match wins; none: no image pools. A maker
            gets the pool's name, the image and the image's ``WORKDIR`` ("" when it has none).
        spawn: starts a background task owned by the daemon (an image pool's refill loop).
        warm_budget: ready sandboxes across image pools, shared by recent demand.
        max_pools, idle_evict: at most this many image pools; one unused this long is removed.
        registry, registry_auth: where missing images are pulled from, and its credentials.
        disk_budget_bytes: images pulled for image pools are removed past this (LRU, unused ones).
    """

    def __init__(
        self,
        configured: Mapping[str, WarmPool],
        *,
        factory: SandboxFactory,
        limiter: CreateLimiter,
        max_waiters: int,
        templates: list[tuple[str, Callable[[str, str, str], PoolSpec]]],
        spawn: Spawn,
        warm_budget: int = 16,
        max_pools: int = 64,
        idle_evict: float = 600.0,
        registry: str = "",
        registry_auth: dict[str, str] | None = None,
        disk_budget_bytes: int = 100 << 30,
    ) -> None:
        self._configured = dict(configured)
        self._dynamic: dict[str, WarmPool] = {}
        self._factory = factory
        self._limiter = limiter
        self._max_waiters = max_waiters
        self._templates = templates
        self._spawn = spawn
        self.warm_budget = warm_budget
        self.max_pools = max_pools
        self.idle_evict = idle_evict
        self.registry = registry.rstrip("/")
        self._auth = registry_auth
        self.disk_budget_bytes = disk_budget_bytes
        self._making: SingleFlight[str, WarmPool] = SingleFlight()
        self._demand: dict[str, list[tuple[float, int]]] = {}  # pool -> (time, acquired_total) samples
        self._pulled: dict[str, float] = {}  # images this node pulled -> last use (monotonic)
        self._sizes: dict[str, int] = {}  # ... and their size, asked of the engine once, at the pull
        self.on_evict: Callable[[str], None] | None = None  # told the name of each image pool removed
        self.made_total = 0
        self.evicted_total = 0
        self.pulled_total = 0
        self.images_removed_total = 0

    # -- the mapping ----------------------------------------------------------------------------
    def __getitem__(self, name: str) -> WarmPool:
        pool = self._configured.get(name) or self._dynamic.get(name)
        if pool is None:
            raise KeyError(name)
        return pool

    def __iter__(self) -> Iterator[str]:
        yield from list(self._configured)
        yield from list(self._dynamic)

    def __len__(self) -> int:
        return len(self._configured) + len(self._dynamic)

    @property
    def image_pools(self) -> dict[str, WarmPool]:
        return dict(self._dynamic)

    # -- pools for images -----------------------------------------------------------------------
    async def for_image(self, image: str) -> WarmPool:
        """The pool of ``image``: found, or made now (the image pulled first when missing)."""
        name = image_pool_name(image)
        pool = self._dynamic.get(name)
        if pool is not None:
            self._touch(image)
            return pool
        # One maker per image; concurrent callers wait for it.
        return await self._making.run(
            name, lambda: self._make(image, name), lambda: FailedPrecondition("making the pool was cancelled")
        )

    async def _make(self, image: str, name: str) -> WarmPool:
        maker = next((make for pattern, make in self._templates if fnmatch.fnmatchcase(image, pattern)), None)
        if maker is None:
            raise FailedPrecondition(
                f"no image_pools template matches image {image!r}: this node makes pools only for "
                f"{', '.join(p for p, _ in self._templates) or 'no images'}; use one of its pools"
            )
        if len(self._dynamic) >= self.max_pools and not await self._evict(need=1):
            raise ResourceExhausted(
                f"this node holds its maximum of {self.max_pools} image pools, all in use; retry later or on another node",
                retry_after=5.0,
            )
        config = await self._ensure_image(image)
        spec = maker(name, image, str(config.get("WorkingDir") or ""))
        pool = WarmPool(spec, self._factory, limiter=self._limiter, max_waiters=self._max_waiters)
        pool.set_min_ready(0)  # demand decides (rebalance)
        self._dynamic[name] = pool
        self._spawn(pool.run(), f"pool-{name}")
        self.made_total += 1
        log.info("made pool %s for image %s", name, image, extra={"pool": name})
        return pool

    def _touch(self, image: str) -> None:
        if image in self._pulled:
            self._pulled[image] = time.monotonic()

    async def _ensure_image(self, image: str) -> dict[str, Any]:
        """The image's ``Config``, the image pulled first when the node does not have it."""
        images = self._factory.runtime.images
        config = await images.config(image)
        if config is not None:
            return config
        if not self.registry:
            raise FailedPrecondition(
                f"image {image!r} is not on this node and no registry is configured (image_pools.registry): "
                "load or pull it on the node first, or configure a registry"
            )
        source = image if image.startswith(self.registry + "/") else f"{self.registry}/{image}"
        try:
            await images.pull(source, auth=self._auth)
            if source != image:
                await images.tag(source, image)
        except SandboxError as e:
            raise FailedPrecondition(f"image {image!r} could not be pulled from {self.registry}: {e.message}") from None
        self._pulled[image] = time.monotonic()
        self._sizes[image] = await images.size(image)
        self.pulled_total += 1
        log.info("pulled image %s from %s", image, self.registry)
        return await images.config(image) or {}

    # -- demand, eviction, disk -----------------------------------------------------------------
    async def run(self) -> None:
        """Share the warm budget by demand, remove idle pools and images past the disk budget."""
        while True:
            await asyncio.sleep(REBALANCE_INTERVAL)
            self.rebalance()
            await self._evict()
            await self._trim_images()

    def rebalance(self) -> None:
        """Each image pool keeps ready a share of the warm budget proportional to its hand-outs in
        the last DEMAND_WINDOW seconds (at least one while it has any demand, none without)."""
        now = time.monotonic()
        demand: dict[str, int] = {}
        for name, pool in self._dynamic.items():
            stats = pool.stats()
            samples = self._demand.setdefault(name, [])
            samples.append((now, stats.acquired_total))
            while len(samples) > 1 and samples[0][0] < now - DEMAND_WINDOW:
                samples.pop(0)
            demand[name] = samples[-1][1] - samples[0][1] + (1 if stats.waiting else 0)
        total = sum(demand.values())
        for name, pool in self._dynamic.items():
            share = 0
            if demand[name] and total:
                share = max(1, self.warm_budget * demand[name] // total)
            pool.set_min_ready(share)

    async def _evict(self, need: int = 0) -> int:
        """Remove image pools unused for idle_evict seconds (or, with ``need``, the longest unused
        ones regardless, that many); returns how many were removed."""
        now = time.monotonic()
        idle = sorted(((p.idle_since, n) for n, p in self._dynamic.items() if p.idle_since), key=lambda x: x[0])
        doomed = [n for since, n in idle if now - since >= self.idle_evict]
        for _, n in idle:
            if len(doomed) >= need:
                break
            if n not in doomed:
                doomed.append(n)
        for name in doomed:
            pool = self._dynamic.pop(name)
            self._demand.pop(name, None)
            await pool.close(timeout=30)
            self.evicted_total += 1
            if self.on_evict is not None:
                self.on_evict(name)
            log.info("removed idle image pool %s", name, extra={"pool": name})
        return len(doomed)

    async def _trim_images(self) -> None:
        """Remove pulled images no pool uses, least recently used first, past the disk budget."""
        if not self._pulled:
            return
        images = self._factory.runtime.images
        in_use = {p.spec.container.image for p in self._dynamic.values()}
        total = sum(self._sizes.get(i, 0) for i in self._pulled)
        for image in sorted(self._pulled, key=lambda i: self._pulled[i]):
            if total <= self.disk_budget_bytes:
                break
            if image in in_use:
                continue
            try:
                await images.remove(image)
            except SandboxError as e:  # used by a container being removed, say: next round
                log.warning("removing image %s failed: %s", image, e.message)
                continue
            total -= self._sizes.pop(image, 0)
            del self._pulled[image]
            self.images_removed_total += 1
            log.info("removed image %s (disk budget)", image)

    async def close(self, timeout: float) -> None:
        pools = [*self._configured.values(), *self._dynamic.values()]
        await asyncio.gather(*(p.close(timeout=timeout) for p in pools))


def registry_auth(path: str | None) -> dict[str, str] | None:
    """Credentials for the registry from a JSON file: {"username", "password"} (secrets stay in
    files, never in the configuration)."""
    if not path:
        return None
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or not {"username", "password"} <= set(doc):
        raise ValueError(f"{path}: expected a JSON object with username and password")
    return {"username": str(doc["username"]), "password": str(doc["password"])}
