"""A warm pool of ready sandboxes, modelled on asyncpg's connection pool.

``acquire`` hands out a ready sandbox in microseconds when one is there, otherwise waits (bounded
in time and in number of waiters) for the refill loop to make one. A released sandbox is never
reused: it is destroyed and the refill loop replaces it. Creating is the expensive, engine-bound
part, so all pools of a node share one :class:`CreateLimiter`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any

from rlsandbox.daemon.errors import PoolUnhealthy, ResourceExhausted, SandboxError, Unavailable
from rlsandbox.daemon.journal import JournalEntry
from rlsandbox.daemon.pool.factory import SandboxFactory
from rlsandbox.daemon.pool.spec import PoolSpec
from rlsandbox.daemon.sandbox import Sandbox, prefer_warm

log = logging.getLogger(__name__)

BACKOFF_BASE = 0.5
BACKOFF_MAX = 30.0
FAIL_WAITERS_AFTER = 3  # consecutive create failures after which waiters get an error at once
PROBE_INTERVAL = 30.0
PROBE_TIMEOUT = 5.0
# Hand-outs first: while a pool has ready sandboxes and nobody waits, its refills start once
# hand-outs pause for REFILL_QUIET, and REFILL_MAX_DELAY after they were due at the latest. A
# refill (engine calls, the agent's handshake) shares the event loop and the cores with the
# answers: 400 CreateSession at once from 400 ready sandboxes took p99 572-788 ms with refills
# starting under them, 271-364 ms without (docs/BENCHMARKS.md, "Episodes per second").
REFILL_QUIET = 0.05
REFILL_MAX_DELAY = 1.0


class CreateLimiter:
    """Node-wide cap on concurrent sandbox creations, so refills never flood the engine.

    The Docker engine serialises container creation (~8 per second on the reference machine);
    more parallel creates only add queueing inside dockerd and slow down live traffic that also
    goes through it.
    """

    def __init__(self, concurrency: int = 4) -> None:
        self.concurrency = concurrency
        self._sem = asyncio.Semaphore(concurrency)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        async with self._sem:
            yield


@dataclass(frozen=True, slots=True)
class PoolStats:
    name: str
    ready: int
    in_use: int
    creating: int
    waiting: int
    min_ready: int
    max_total: int
    created_total: int
    failed_total: int
    destroyed_total: int
    acquired_total: int
    acquired_waited_total: int  # hand-outs that had to wait for a sandbox (pool misses)
    acquire_timeouts: int
    consecutive_failures: int
    last_error: str | None
    backing_off_for: float
    recycling: int = 0  # released, being reset for the next episode
    destroying: int = 0  # released, being removed (both count against max_total)
    recycled_total: int = 0  # hand-backs of a reset, proven-clean sandbox
    recycle_failures_total: int = 0  # resets refused or failed (the sandbox was destroyed)


class WarmPool:
    """Keeps ``spec.min_ready`` sandboxes ready and hands them out.

    Args:
        spec: what to keep ready.
        factory: creates and destroys the sandboxes.
        limiter: node-wide cap on concurrent creations.
        max_waiters: callers allowed to wait at once; more get RESOURCE_EXHAUSTED at once.
    """

    def __init__(self, spec: PoolSpec, factory: SandboxFactory, *, limiter: CreateLimiter, max_waiters: int = 1024) -> None:
        self.spec = spec
        self._factory = factory
        self._limiter = limiter
        self._max_waiters = max_waiters
        self._ready: collections.deque[Sandbox] = collections.deque()
        self._leased: set[Sandbox] = set()
        self._waiters: collections.deque[asyncio.Future[Sandbox]] = collections.deque()
        self._rooms: set[asyncio.Future[Sandbox]] = set()  # waiters that are clean rooms: served first
        self._creating = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._closing = False
        self._closed = asyncio.Event()
        self._consecutive_failures = 0
        self._backoff_until = 0.0
        self._last_error: str | None = None
        self._created_total = 0
        self._failed_total = 0
        self._destroyed_total = 0
        self._acquired_total = 0
        self._acquired_waited = 0
        self._acquire_timeouts = 0
        self.min_ready = spec.min_ready  # image pools: set by demand (pool/catalog.py)
        self._last_activity = time.monotonic()
        self._last_lease = 0.0
        self._recycling = 0  # released sandboxes being reset for the next episode
        self._destroying = 0  # released sandboxes being removed
        self._recycled_total = 0
        self._recycle_failures = 0
        self._said_no_agent = False

    @property
    def name(self) -> str:
        return self.spec.name

    def set_min_ready(self, n: int) -> None:
        """Keep ``n`` ready from now on (ready ones above it stay until handed out)."""
        if n != self.min_ready:
            self.min_ready = max(0, min(n, self.spec.max_total))
            self._wake.set()

    @property
    def idle_since(self) -> float:
        """Monotonic time of the last hand-out or release; 0 while anything is leased or awaited."""
        if self._leased or self._waiters or self._creating:
            return 0.0
        return self._last_activity

    # -- handing out ----------------------------------------------------------------------------
    async def acquire(self, timeout: float, *, warm: bool | None = None) -> Sandbox:
        """A ready sandbox, now or within ``timeout`` seconds. ``warm``: True for a clean room,
        which prefers a sandbox whose agent keeps a warm interpreter (docs/GRADING.md, "Warm
        pytest"); False for a session, which prefers one without (so those interpreters stay
        where the grades are, and the others exit idle); None: the oldest ready.

        Raises:
            ResourceExhausted: none became ready in time, or too many callers are waiting.
            PoolUnhealthy: the pool keeps failing to create sandboxes.
            Unavailable: the pool is closing.
        """
        if self._closing:
            raise Unavailable(f"pool {self.name} is shutting down")
        if warm is not None:
            prefer_warm(self._ready, warm)
        while self._ready:
            candidate = self._ready.popleft()
            if candidate.alive:
                return self._lease(candidate)
            self._spawn(self._destroy(candidate, "died while ready"))
        if self._consecutive_failures >= FAIL_WAITERS_AFTER and self._backoff_remaining() > 0:
            raise self._unhealthy()
        if len(self._waiters) >= self._max_waiters:
            raise ResourceExhausted(
                f"pool {self.name}: {len(self._waiters)} callers already waiting for a sandbox; retry later or raise max_waiters",
                pool=self.name,
                retry_after=self._retry_hint(),
            )
        future: asyncio.Future[Sandbox] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        if warm:
            self._rooms.add(future)
        self._wake.set()
        sandbox: Sandbox | None = None
        try:
            async with asyncio.timeout(timeout):
                sandbox = await asyncio.shield(future)
        except TimeoutError:
            self._acquire_timeouts += 1
            raise ResourceExhausted(
                f"no sandbox of pool {self.name} became ready within {timeout:.1f} s "
                f"(ready {len(self._ready)}, creating {self._creating}, in use {len(self._leased)} "
                f"of max {self.spec.max_total}); retry in ~{self._retry_hint():.0f} s",
                pool=self.name,
                retry_after=self._retry_hint(),
            ) from None
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(future)
            self._rooms.discard(future)
            if sandbox is None:
                if not future.done():
                    future.cancel()
                elif not future.cancelled() and future.exception() is None:
                    # Handed a sandbox while leaving (timeout or cancellation): it was never
                    # used, so it goes back to the front of the line.
                    self._leased.discard(future.result())
                    self._ready.appendleft(future.result())
                    self._deliver()
        self._acquired_waited += 1
        return self._lease(sandbox)

    def _lease(self, sandbox: Sandbox) -> Sandbox:
        self._last_activity = self._last_lease = time.monotonic()
        self._leased.add(sandbox)
        self._acquired_total += 1
        self._wake.set()
        return sandbox

    async def death_cause(self, sandbox: Sandbox) -> tuple[str, str]:
        """Why a sandbox of this pool died: (reason, whose doing); see :meth:`SandboxFactory.death_cause`."""
        return await self._factory.death_cause(sandbox)

    def leased_containers(self) -> set[str]:
        """The container ids of the sandboxes in use (sessions' and clean rooms')."""
        return {sb.container_id for sb in self._leased}

    def host_oom_killed(self, sandbox: Sandbox, since: float) -> bool:
        """Whether the host running out of memory (not the sandbox's own limit) cost the sandbox
        a process at or after ``since`` (time.monotonic()): the node's doing (pool/oom.py)."""
        return self._factory.oom.host_killed(sandbox.container_id, since)

    async def adopt(self, entry: JournalEntry, state: str | None) -> Sandbox:
        """Reconnect to a sandbox an earlier life of the daemon leased (see
        :meth:`SandboxFactory.adopt`) and count it as leased here."""
        sandbox = await self._factory.adopt(entry, state)
        self._leased.add(sandbox)
        self._wake.set()
        return sandbox

    def release(self, sandbox: Sandbox, reason: str = "released", *, reuse: bool = False) -> None:
        """End a lease. Returns at once: behind it the sandbox is destroyed, or, with ``reuse`` in
        a recycling pool, reset and proven clean by its agent and made ready again (any doubt,
        or ``max_reuses`` reached, destroys it). Sandboxes on their way out count against
        ``max_total`` until they are gone, so a slow engine slows refills instead of piling up
        containers."""
        self._leased.discard(sandbox)
        self._last_activity = time.monotonic()
        recycle = reuse and self.spec.recycle and sandbox.alive and sandbox.reuses < self.spec.max_reuses
        if recycle and sandbox.mode != "agent":
            # agent = "auto" on an image without python3: no agent, so no reset to prove it clean.
            recycle = False
            if not self._said_no_agent:
                self._said_no_agent = True
                log.warning(
                    "pool %s recycles, but its image %s runs no agent (no python3): its sandboxes are "
                    "destroyed after each episode, not recycled",
                    self.name,
                    sandbox.image,
                )
        # A room made past max_total (room_headroom) goes: kept, it would be a session's next.
        recycle = recycle and self._total() < self.spec.max_total
        if recycle:
            self._recycling += 1
        else:
            self._destroying += 1
        self._spawn(self._after_release(sandbox, reason, recycle))

    async def _after_release(self, sandbox: Sandbox, reason: str, recycle: bool) -> None:
        try:
            if recycle and not self._closing:
                try:
                    await self._factory.recycle(sandbox, self.spec)
                except Exception as e:  # whatever went wrong, the sandbox is not trusted again
                    self._recycle_failures += 1
                    why = e.message if isinstance(e, SandboxError) else f"{type(e).__name__}: {e}"
                    log.warning("pool %s: %s not recycled (%s); destroying it", self.name, sandbox.name, why)
                    reason = f"recycling failed: {why}"
                else:
                    if not self._closing:
                        sandbox.reuses += 1
                        self._recycled_total += 1
                        self._ready.append(sandbox)
                        self._deliver()
                        return
            await self._destroy(sandbox, reason)
        finally:
            if recycle:
                self._recycling -= 1
            else:
                self._destroying -= 1
            self._wake.set()

    @contextlib.asynccontextmanager
    async def lease(self, timeout: float) -> AsyncIterator[Sandbox]:
        """``async with pool.lease(timeout) as sandbox:``; the sandbox is destroyed on exit."""
        sandbox = await self.acquire(timeout)
        try:
            yield sandbox
        finally:
            self.release(sandbox)

    def _deliver(self) -> None:
        while self._ready and self._waiters:
            waiter = self._next_waiter()
            if not waiter.done():
                # Leased from this moment, not when the waiter wakes up: in between, a refill
                # would see room that is not there and create past max_total.
                sandbox = self._ready.popleft()
                self._leased.add(sandbox)
                waiter.set_result(sandbox)

    def _total(self) -> int:
        """Every sandbox of the pool: ready, leased, on its way in or out (max_total bounds it)."""
        return len(self._ready) + len(self._leased) + self._creating + self._recycling + self._destroying

    def _next_waiter(self) -> asyncio.Future[Sandbox]:
        """The next in line: a clean room before a session (a room ends an episode and gives back
        two sandboxes; a session would start one and take its own)."""
        if self._rooms:
            for waiter in self._waiters:
                if waiter in self._rooms and not waiter.done():
                    self._waiters.remove(waiter)
                    return waiter
        return self._waiters.popleft()

    def _backoff_remaining(self) -> float:
        return max(0.0, self._backoff_until - time.monotonic())

    def _retry_hint(self) -> float:
        return max(1.0, self._backoff_remaining())

    def _unhealthy(self) -> PoolUnhealthy:
        return PoolUnhealthy(
            f"pool {self.name} failed to create {self._consecutive_failures} sandboxes in a row "
            f"(last error: {self._last_error}); backing off {self._backoff_remaining():.1f} s",
            pool=self.name,
        )

    # -- refilling ------------------------------------------------------------------------------
    async def run(self) -> None:
        """The refill and health loop; returns when the pool is closed."""
        next_probe = time.monotonic() + PROBE_INTERVAL
        while not self._closing:
            await self._lull()  # may take the wake-up of close(): looked at next
            if self._closing:
                break
            self._refill()
            wait = max(0.0, next_probe - time.monotonic())
            if self._backoff_remaining():
                wait = min(wait, self._backoff_remaining() + 0.01)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()
            self._wake.clear()
            if time.monotonic() >= next_probe:
                next_probe = time.monotonic() + PROBE_INTERVAL
                self._spawn(self._probe_ready())

    async def _lull(self) -> None:
        """Wait for a pause in hand-outs (REFILL_QUIET), REFILL_MAX_DELAY at most, while the pool
        has ready sandboxes and nobody waits for one."""
        deadline = time.monotonic() + REFILL_MAX_DELAY
        while self._ready and not self._closing and not any(not w.done() for w in self._waiters):
            now = time.monotonic()
            until = min(self._last_lease + REFILL_QUIET, deadline)
            if now >= until:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(until - now):
                    await self._wake.wait()  # a waiter, a close: look again
            self._wake.clear()

    def _refill(self) -> None:
        if self._closing or self._backoff_remaining() > 0:
            return
        live_waiters = sum(1 for w in self._waiters if not w.done())
        wanted = self.min_ready + live_waiters - len(self._ready) - self._creating - self._recycling
        total = self._total()
        room = self.spec.max_total - total
        rooms = sum(1 for w in self._rooms if not w.done())
        if rooms:
            # Clean rooms may go past max_total by room_headroom: with every sandbox held by a
            # session that waits for its room, nothing would come back before the acquire timeout.
            uncovered = rooms - len(self._ready) - self._creating - self._recycling
            over = max(0, total - self.spec.max_total)
            room = max(room, min(uncovered, self.spec.room_headroom - over))
        # While failing, probe with one creation at a time instead of a burst.
        cap = 1 if self._consecutive_failures else wanted
        for _ in range(max(0, min(wanted, room, cap))):
            self._creating += 1
            self._spawn(self._create_one())

    async def _create_one(self) -> None:
        try:
            async with self._limiter.slot():
                if self._closing:
                    return
                sandbox = await self._factory.create(self.spec)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._on_create_failed(e)
            return
        finally:
            self._creating -= 1
            self._wake.set()
        self._created_total += 1
        self._consecutive_failures = 0
        self._last_error = None
        if self._closing:
            await self._destroy(sandbox, "pool closed")
            return
        self._ready.append(sandbox)
        self._deliver()

    def _on_create_failed(self, error: Exception) -> None:
        self._failed_total += 1
        self._consecutive_failures += 1
        message = str(error) if isinstance(error, SandboxError) else f"{type(error).__name__}: {error}"
        self._last_error = message
        delay = min(BACKOFF_MAX, BACKOFF_BASE * 2 ** (self._consecutive_failures - 1))
        self._backoff_until = time.monotonic() + delay
        log.warning(
            "pool %s: sandbox creation failed (%d in a row, backing off %.1f s): %s",
            self.name,
            self._consecutive_failures,
            delay,
            message,
            exc_info=not isinstance(error, SandboxError),
        )
        if self._consecutive_failures >= FAIL_WAITERS_AFTER:
            error_for_waiters = self._unhealthy()
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(error_for_waiters)

    async def revalidate(self) -> None:
        """Probe every ready sandbox now (the engine came back: some may have died meanwhile)."""
        await self._probe_ready()

    async def _probe_ready(self) -> None:
        for sandbox in list(self._ready):
            try:
                await sandbox.channel.ping(PROBE_TIMEOUT)
            except SandboxError as e:
                if sandbox in self._ready:
                    self._ready.remove(sandbox)
                    await self._destroy(sandbox, f"failed health probe: {e}")

    async def _destroy(self, sandbox: Sandbox, reason: str) -> None:
        await self._factory.destroy(sandbox, reason)
        self._destroyed_total += 1

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- closing --------------------------------------------------------------------------------
    async def close(self, timeout: float = 30.0) -> None:
        """Stop refilling, fail waiters, destroy every sandbox (ready and leased). Idempotent."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        self._wake.set()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(Unavailable(f"pool {self.name} is shutting down"))
        try:
            async with asyncio.timeout(timeout):
                while self._tasks:  # creations in flight finish (and destroy what they made)
                    await asyncio.gather(*list(self._tasks), return_exceptions=True)
        except TimeoutError:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        doomed = list(self._ready) + list(self._leased)
        self._ready.clear()
        self._leased.clear()
        await asyncio.gather(*(self._destroy(s, "pool closed") for s in doomed), return_exceptions=True)
        self._closed.set()

    def stats(self) -> PoolStats:
        return PoolStats(
            name=self.name,
            ready=len(self._ready),
            in_use=len(self._leased),
            creating=self._creating,
            waiting=sum(1 for w in self._waiters if not w.done()),
            min_ready=self.min_ready,
            max_total=self.spec.max_total,
            created_total=self._created_total,
            failed_total=self._failed_total,
            destroyed_total=self._destroyed_total,
            acquired_total=self._acquired_total,
            acquired_waited_total=self._acquired_waited,
            acquire_timeouts=self._acquire_timeouts,
            consecutive_failures=self._consecutive_failures,
            last_error=self._last_error,
            backing_off_for=self._backoff_remaining(),
            recycling=self._recycling,
            destroying=self._destroying,
            recycled_total=self._recycled_total,
            recycle_failures_total=self._recycle_failures,
        )
