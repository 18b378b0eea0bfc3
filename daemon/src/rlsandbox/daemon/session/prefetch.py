"""Task-warm sandboxes: sandboxes prepared for a task ahead of the sessions (and clean rooms) that
will use it, so that starting one is a hand-out instead of a workspace copy, a git reset and the
task's setup on the trainer's clock.

``Prefetch(task, count, ttl)`` sets a target: the node keeps ``count`` sandboxes prepared for the
task, replacing each one taken, until ``ttl`` seconds after the task was last asked for (a
Prefetch, a CreateSession or a grade). Targets share one node-wide budget (``max_prefetched``):
a request over it gets what is left. A prepared sandbox that waited past the deadline, or died,
goes back to its pool (recycled there when the pool recycles). Tasks are known by a ``ref`` (its
id and a digest of its spec and workspace), so that a trainer names a prefetched task without
sending its workspace again.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rlsandbox.daemon.errors import NotFound, SandboxError
from rlsandbox.daemon.grading.task import Task
from rlsandbox.daemon.sandbox import Sandbox, prefer_warm
from rlsandbox.daemon.session.ports import SandboxPool

log = logging.getLogger(__name__)

DEFAULT_TTL = 600.0
KNOWN_TASKS = 4096  # tasks remembered by ref after their prefetch ended (least recently used go first) ...
KNOWN_BYTES = 1 << 30  # ... and the bytes of their workspaces, at most (a bundle may be 32 MB)
PREPARE_TIMEOUT = 600.0
# Replacements for prepared sandboxes handed out start this long after the first of them: a burst
# of hand-outs (a GRPO group's sessions, a fork of a fresh task session) is answered before the
# node starts preparing, which shares its event loop and cores with the answers (measured on a
# Fork(8) of prefetched sandboxes: 7.5 ms with the refills started at once, 1.7 ms deferred).
REFILL_DELAY = 0.05


def task_ref(task: Task) -> str:
    """``<id>@<digest>``: equal for the same spec and workspace, whoever sends them."""
    h = hashlib.sha256(task.spec_json().encode())
    h.update(b"\0")
    h.update(task.workspace_tar)
    return f"{task.id}@{h.hexdigest()[:20]}"


@dataclass(slots=True)
class _Warm:
    task: Task
    target: int = 0
    deadline: float = 0.0
    ttl: float = DEFAULT_TTL
    ready: collections.deque[Sandbox] = field(default_factory=collections.deque)
    preparing: int = 0
    last_error: str = ""
    failures: int = 0  # preparations failed in a row (a broken task stops being prepared)
    refill: asyncio.TimerHandle | None = None  # replacements due (REFILL_DELAY)


@dataclass(frozen=True, slots=True)
class PrefetchState:
    ref: str
    ready: int
    preparing: int
    target: int
    last_error: str


class Prefetcher:
    """Args:
    pools: where sandboxes come from (the task's pool).
    prepare: puts a task's workspace in place and runs its setup (the grader's ``prepare``).
    budget: prepared and preparing sandboxes node-wide, at most.
    acquire_timeout: seconds to wait for a pool's sandbox while preparing.
    """

    MAX_FAILURES = 3

    def __init__(
        self,
        pools: Mapping[str, SandboxPool],
        prepare: Callable[[Sandbox, Task], object],
        *,
        budget: int = 64,
        acquire_timeout: float = 60.0,
    ) -> None:
        self.pools = pools
        self._prepare = prepare
        self.budget = budget
        self.acquire_timeout = acquire_timeout
        self._warm: dict[str, _Warm] = {}
        self._known: collections.OrderedDict[str, Task] = collections.OrderedDict()
        self._known_bytes = 0
        self.known_bytes_limit = KNOWN_BYTES
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self.handed_out_total = 0  # sessions and clean rooms that got a prepared sandbox
        self.missed_total = 0  # asked for a prepared sandbox of a prefetched task, none was ready
        self.expired_total = 0

    # -- targets --------------------------------------------------------------------------------
    def prefetch(self, task: Task, count: int, ttl: float | None = None) -> PrefetchState:
        ref = task_ref(task)
        pool = self.pools.get(task.spec.pool_name)
        if pool is None:
            raise NotFound(f"the task's pool {task.spec.pool_name!r} is not configured on this node", pool=task.spec.pool_name)
        self.remember(ref, task)
        warm = self._warm.get(ref)
        if warm is None:
            warm = self._warm[ref] = _Warm(task)
        warm.ttl = ttl or warm.ttl
        warm.deadline = time.monotonic() + warm.ttl
        others = sum(w.target for r, w in self._warm.items() if r != ref)
        warm.target = max(0, min(count, self.budget - others))
        warm.failures = 0
        if not (warm.target or warm.ready or warm.preparing):
            del self._warm[ref]  # nothing kept: nothing to hold (its workspace stays known by ref, bounded)
            return self.state(ref)
        self._fill(ref, warm)
        return self.state(ref)

    def state(self, ref: str) -> PrefetchState:
        warm = self._warm.get(ref)
        if warm is None:
            return PrefetchState(ref, 0, 0, 0, "")
        return PrefetchState(ref, len(warm.ready), warm.preparing, warm.target, warm.last_error)

    def remember(self, ref: str, task: Task) -> None:
        """Know ``task`` by ``ref``; past KNOWN_TASKS or KNOWN_BYTES the least recently used tasks
        that are not kept warm are forgotten (a trainer naming thousands of tasks must not fill
        the node's memory with their workspaces)."""
        if ref not in self._known:
            self._known_bytes += len(task.workspace_tar)
        self._known[ref] = task
        self._known.move_to_end(ref)
        for old in list(self._known):  # least recently used first
            if len(self._known) <= KNOWN_TASKS and self._known_bytes <= self.known_bytes_limit:
                break
            warm = self._warm.get(old)
            if old != ref and (warm is None or not (warm.target or warm.ready or warm.preparing)):
                self._known_bytes -= len(self._known.pop(old).workspace_tar)

    def knows(self, ref: str) -> bool:
        return ref in self._known

    def known(self, ref: str) -> Task:
        task = self._known.get(ref)
        if task is None:
            raise NotFound(
                f"task ref {ref!r} is unknown on this node (never prefetched here, or forgotten); send the task itself"
            )
        self._known.move_to_end(ref)
        return task

    # -- hand-outs ------------------------------------------------------------------------------
    def take(self, ref: str, *, room: bool | None = None) -> Sandbox | None:
        """A sandbox prepared for the task, or None; asking counts as use (the deadline moves).
        ``room``: a clean room prefers one that keeps a warm interpreter, a session one without."""
        warm = self._warm.get(ref)
        if warm is None:
            return None
        warm.deadline = time.monotonic() + warm.ttl
        if room is not None:
            prefer_warm(warm.ready, room)
        while warm.ready:
            sandbox = warm.ready.popleft()
            if sandbox.alive:
                self.handed_out_total += 1
                if warm.refill is None:
                    warm.refill = asyncio.get_running_loop().call_later(REFILL_DELAY, self._refill, ref, warm)
                return sandbox
            self._pool(warm).release(sandbox, "died while prepared for its task")
        self.missed_total += 1
        self._fill(ref, warm)
        return None

    @property
    def prepared(self) -> int:
        return sum(len(w.ready) + w.preparing for w in self._warm.values())

    # -- filling --------------------------------------------------------------------------------
    def _pool(self, warm: _Warm) -> SandboxPool:
        return self.pools[warm.task.spec.pool_name]

    def _refill(self, ref: str, warm: _Warm) -> None:
        warm.refill = None
        if self._warm.get(ref) is warm:  # not expired or stopped meanwhile
            self._fill(ref, warm)

    def _fill(self, ref: str, warm: _Warm) -> None:
        if self._closing or warm.failures >= self.MAX_FAILURES:
            return
        for _ in range(max(0, warm.target - len(warm.ready) - warm.preparing)):
            warm.preparing += 1
            task = asyncio.get_running_loop().create_task(self._prepare_one(ref, warm), name=f"prefetch-{ref}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _prepare_one(self, ref: str, warm: _Warm) -> None:
        pool = self._pool(warm)
        sandbox: Sandbox | None = None
        try:
            sandbox = await pool.acquire(self.acquire_timeout)
            async with asyncio.timeout(PREPARE_TIMEOUT):
                await self._prepare(sandbox, warm.task)  # type: ignore[misc]
        except Exception as e:  # the task's trouble is reported in its state; the pool's too
            warm.failures += 1
            warm.last_error = e.message if isinstance(e, SandboxError) else f"{type(e).__name__}: {e}"
            log.warning("prefetch of %s failed (%d in a row): %s", ref, warm.failures, warm.last_error)
            if sandbox is not None:
                pool.release(sandbox, "prefetch failed")
            return
        finally:
            warm.preparing -= 1
        warm.failures = 0
        warm.last_error = ""
        if self._closing or self._warm.get(ref) is not warm or len(warm.ready) >= warm.target:
            pool.release(sandbox, "no longer wanted for its task", reuse=True)
            return
        warm.ready.append(sandbox)

    # -- expiry and shutdown --------------------------------------------------------------------
    def expire(self) -> None:
        """Targets past their deadline end; their prepared sandboxes go back to the pools."""
        now = time.monotonic()
        for ref, warm in list(self._warm.items()):
            if now < warm.deadline:
                continue
            del self._warm[ref]
            self.expired_total += len(warm.ready)
            while warm.ready:
                self._pool(warm).release(warm.ready.popleft(), "prefetched for a task that was not asked for in time", reuse=True)

    async def close(self) -> None:
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for warm in self._warm.values():
            if warm.refill is not None:
                warm.refill.cancel()
            while warm.ready:
                self._pool(warm).release(warm.ready.popleft(), "node shutting down")
        self._warm.clear()
