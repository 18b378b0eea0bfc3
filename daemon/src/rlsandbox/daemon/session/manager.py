"""The session manager: every session operation of the node goes through here.

Create (admission, idempotency), exec (step dedup), files, evaluate, close, list and reaping.
Every operation on a live session is counted in flight, so the idle reaper never closes a session
that is busy. Events and journal rows are the recorder's business (session/recorder.py); the pool
is reached through the narrow interface of session/ports.py.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import replace

from rlsandbox.daemon import tracing
from rlsandbox.daemon.agent.channel import ChunkCallback
from rlsandbox.daemon.agent.socket_transport import Drop
from rlsandbox.daemon.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, SandboxDied, Unavailable
from rlsandbox.daemon.events.publisher import EventPublisher
from rlsandbox.daemon.grading.grader import Grader
from rlsandbox.daemon.grading.rewards import GradeResult, episodes_mess
from rlsandbox.daemon.grading.task import Task
from rlsandbox.daemon.journal import SessionJournal
from rlsandbox.daemon.metrics import Metrics
from rlsandbox.daemon.model import ExecRequest, ExecResult, FileRead, FileWrite, FileWriteResult
from rlsandbox.daemon.pool import EPISODES_DOING, HOST_OOM
from rlsandbox.daemon.sandbox import Sandbox
from rlsandbox.daemon.session import recovery
from rlsandbox.daemon.session.fork import Forker, Snapshot
from rlsandbox.daemon.session.ports import SandboxPool
from rlsandbox.daemon.session.prefetch import Prefetcher, PrefetchState, task_ref
from rlsandbox.daemon.session.recorder import Recorder
from rlsandbox.daemon.session.state import ENDED, Session, SessionOptions, SessionState, Tombstone, step_fingerprint

log = logging.getLogger(__name__)

TOMBSTONES = 100_000
# Told with a sandbox that died of its episode's own doing (out of memory at its limit, past its
# disk budget while the node's disk ran low).
FAULT_NOTE = "; the episode's own doing: Evaluate scores it reward 0, do not mask it as an infra error"
MAX_FORK = 64  # forks of one call
BIG_STDIN = 1 << 20  # bytes: hashing more than this for step dedup happens off the event loop


async def _no_grader(sandbox: Sandbox, task: Task) -> None:
    raise FailedPrecondition("this node has no grader; it cannot prepare sandboxes for tasks")


class SessionManager:
    """Owns every live session of the node.

    Args:
        node_id: this node's id (part of every session id, so ids are unique across nodes).
        pools: the node's pools by name.
        max_sessions: admission limit; CreateSession beyond it is RESOURCE_EXHAUSTED.
        reap_interval: seconds between idle/lifetime checks.
        grader: prepares task workspaces and grades (sessions from tasks need one).
        events: where session events go (docs/events.md); None: no events.
        events_output_cap: bytes of each stream put in step events (0: none).
        events_confirm_timeout: seconds a call waits at most for its events to be durable.
        journal: where READY sessions are recorded so that a restarted daemon re-adopts them
            (:meth:`recover`); None: a restart loses them.
    """

    def __init__(
        self,
        node_id: str,
        pools: Mapping[str, SandboxPool],
        *,
        max_sessions: int,
        reap_interval: float = 1.0,
        grader: Grader | None = None,
        events: EventPublisher | None = None,
        events_output_cap: int = 0,
        events_confirm_timeout: float = 0.25,
        journal: SessionJournal | None = None,
        max_prefetched: int = 64,
        image_pool: Callable[[str], Awaitable[SandboxPool]] | None = None,
        metrics: Metrics | None = None,
        forker: Forker | None = None,
    ) -> None:
        self.node_id = node_id
        self.pools = pools
        self.image_pool = image_pool  # makes (or finds) the pool of an image on demand
        self.metrics = metrics
        self.forker = forker
        self.grader = grader
        self.max_sessions = max_sessions
        self.reap_interval = reap_interval
        self.sessions: dict[str, Session] = {}
        self.recorder = Recorder(
            node_id,
            self.sessions,
            events=events,
            journal=journal,
            output_cap=events_output_cap,
            confirm_timeout=events_confirm_timeout,
        )
        self.prefetcher = Prefetcher(pools, grader.prepare if grader else _no_grader, budget=max_prefetched)
        self._tombstones: collections.OrderedDict[str, Tombstone] = collections.OrderedDict()
        self._by_key: dict[str, str] = {}
        self._accepting = True
        self.draining = False  # no new sessions, the open ones go on (Drain)
        self._stop = asyncio.Event()
        self.execs_total = 0
        self.reaped_total = 0
        self.adopted_total = 0
        self.lost_total = 0

    # -- the table of sessions ------------------------------------------------------------------
    def admit(self, session: Session) -> None:
        self.sessions[session.id] = session
        if session.options.idempotency_key:
            self._by_key[session.options.idempotency_key] = session.id

    def _bury(self, session: Session, reason: str, fault: str = "", *, dying: bool = False) -> None:
        """``dying``: the engine has not told why yet; the tombstone keeps the session meanwhile,
        so that calls wait for its account (``settled``)."""
        session.end_reason = reason
        self.sessions.pop(session.id, None)
        keep = session if fault or dying else None
        self.bury_entry(session.id, reason, session.options.idempotency_key, fault=fault, session=keep)

    def bury_entry(
        self, session_id: str, reason: str, idempotency_key: str = "", *, fault: str = "", session: Session | None = None
    ) -> None:
        """A tombstone for an ended session: later calls learn when and why it ended (and, for a
        sandbox its own episode killed, grading scores it)."""
        self._tombstones[session_id] = Tombstone(session_id, time.time(), reason, idempotency_key, fault, session)
        if idempotency_key:
            self._by_key[idempotency_key] = session_id
        while len(self._tombstones) > TOMBSTONES:
            _, old = self._tombstones.popitem(last=False)
            if old.idempotency_key and self._by_key.get(old.idempotency_key) == old.session_id:
                del self._by_key[old.idempotency_key]

    async def settled(self, session_id: str) -> Session:
        """``get``, once the engine has told why the session's sandbox died if it is being found
        dead this moment: a call then learns whether that was the episode's doing (its fault)."""
        tomb = self._tombstones.get(session_id)
        death = tomb.session.death if tomb is not None and tomb.session is not None else None
        if death is not None and not death.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(death)
        return self.get(session_id)

    def get(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is not None:
            return session
        tomb = self._tombstones.get(session_id)
        if tomb is not None:
            ago = time.time() - tomb.ended_at
            why = f"{tomb.reason}{FAULT_NOTE if tomb.fault else ''}"
            message = f"session {session_id} not found (ended {ago:.0f} s ago: {why})"
            raise NotFound(message, session_id=session_id, **tomb.fields())
        if not session_id:
            raise InvalidArgument("session_id is empty")
        raise NotFound(f"session {session_id} not found on node {self.node_id}", session_id=session_id)

    @contextlib.asynccontextmanager
    async def _busy(self, session_id: str, *, changes: bool = True) -> AsyncIterator[tuple[Session, Sandbox]]:
        """A READY session and its sandbox, counted in flight for the idle reaper. ``changes``:
        the operation may change the sandbox (only reads and clean-room grades may not)."""
        session = await self.settled(session_id)
        sandbox = await self._ready(session)
        if changes:
            session.pristine = False
        session.touch()
        session.in_flight += 1
        try:
            yield session, sandbox
        finally:
            session.in_flight -= 1
            session.touch()

    # -- lifecycle ------------------------------------------------------------------------------
    async def create(self, options: SessionOptions, *, setup: Callable[[Sandbox], Awaitable[None]] | None = None) -> Session:
        """A session on a sandbox of its pool; with a task, the task's workspace and setup in
        place (or a sandbox prefetched for it). ``setup`` replaces that preparation (a fork's)."""
        if not self._accepting:
            raise Unavailable("node is shutting down; create the session on another node")
        if self.draining:
            raise Unavailable(f"node {self.node_id} is draining (no new sessions); create the session on another node")
        pool = self.pools.get(options.pool)
        if pool is None and options.image:
            pool = await self._image_pool(options.image)
        if pool is None:
            raise NotFound(
                f"unknown pool {options.pool!r}; this node has: {', '.join(sorted(self.pools)) or 'no pools'}",
                pool=options.pool,
            )
        if options.idempotency_key:
            known = self._by_key.get(options.idempotency_key)
            if known is not None:
                existing = self.sessions.get(known)
                if existing is not None:
                    # A retry while the first attempt still waits for a sandbox gets its outcome.
                    await asyncio.shield(existing.settled)
                    return existing
                tomb = self._tombstones.get(known)
                raise FailedPrecondition(
                    f"idempotency key {options.idempotency_key!r} belongs to session {known}, which ended"
                    + (f": {tomb.reason}" if tomb else ""),
                    session_id=known,
                )
        if len(self.sessions) >= self.max_sessions:
            raise ResourceExhausted(
                f"node {self.node_id} holds its maximum of {self.max_sessions} sessions; retry later or elsewhere",
                retry_after=1.0,
            )
        if options.task is not None and self.grader is None:
            raise FailedPrecondition("this node has no grader; it cannot start sessions from tasks")
        if options.task is not None and options.task.spec.env:
            options = replace(options, env={**options.task.spec.env, **options.env})
        if options.task is not None and "task" not in options.labels:
            options = replace(options, labels={**options.labels, "task": options.task.id})
        if options.task is not None and not options.task_ref:
            big = len(options.task.workspace_tar) >= BIG_STDIN
            ref = await asyncio.to_thread(task_ref, options.task) if big else task_ref(options.task)
            options = replace(options, task_ref=ref)
        session = Session(f"{self.node_id}-{secrets.token_hex(8)}", options, pool)
        self.admit(session)
        started = time.perf_counter()
        try:
            prepared = self.prefetcher.take(options.task_ref, room=False) if options.task is not None and setup is None else None
            with tracing.span("pool.acquire", **{"rlsandbox.pool": pool.name, "rlsandbox.prefetched": prepared is not None}):
                session.sandbox = prepared or await pool.acquire(options.acquire_timeout, warm=False)
            try:
                if setup is not None:
                    with tracing.span("fork.apply"):
                        await setup(session.sandbox)
                elif options.task is not None and prepared is None:
                    assert self.grader is not None
                    with tracing.span("task.prepare", **{"rlsandbox.task": options.task.id}):
                        await self.grader.prepare(session.sandbox, options.task)
                # Durable before the session is handed out: a crash right after must re-adopt it.
                await self.recorder.record(session)
            except BaseException:
                self.recorder.forget(session.id)
                pool.release(session.sandbox, "session setup failed")
                raise
        except BaseException as e:
            session.transition(SessionState.FAILED)
            self._bury(session, f"failed to start: {e}")
            if options.idempotency_key:  # a retry may try again
                self._by_key.pop(options.idempotency_key, None)
            session.settled.set_exception(e if isinstance(e, Exception) else Unavailable("session creation cancelled"))
            session.settled.exception()  # retrieved: there may be no retry waiting on it
            raise
        session.transition(SessionState.READY)
        session.pristine = setup is None
        session.touch()
        session.settled.set_result(None)
        if self.metrics is not None:
            source = "prefetched" if prepared is not None else "pool"
            self.metrics.create_seconds.labels(pool.name, source).observe(time.perf_counter() - started)
        log.info("session ready on %s", session.sandbox.name, extra={"session": session.id, "pool": pool.name})
        self.recorder.created(session)
        await self.recorder.confirm_created(session)
        return session

    async def recover(self, containers: Mapping[str, str], *, concurrency: int = 32) -> tuple[int, int]:
        """Re-adopt the sessions an earlier life of this daemon left in the journal (session/recovery.py)."""
        return await recovery.recover(self, containers, concurrency=concurrency)

    async def fork(self, session_id: str, count: int, labels: Mapping[str, str]) -> tuple[list[Session], Snapshot]:
        """``count`` new sessions whose filesystem equals the source's now (session/fork.py), each
        its own sandbox of the source's pool, with the source's options, task and labels (``labels``
        on top). All or nothing: if one cannot be made, the others are closed."""
        if self.forker is None:
            raise FailedPrecondition("this node cannot fork sessions")
        if not 1 <= count <= MAX_FORK:
            raise InvalidArgument(f"count must be 1 to {MAX_FORK} (got {count}); fork again for more")
        if len(self.sessions) + count > self.max_sessions:
            raise ResourceExhausted(
                f"node {self.node_id} cannot hold {count} more sessions ({len(self.sessions)} of {self.max_sessions}); "
                "fork fewer, or retry later",
                retry_after=1.0,
            )
        async with self._busy(session_id, changes=False) as (source, sandbox):
            new = self._forks_as_new_sessions(source, count)
            snapshot = Snapshot(source.id)
            if new < count:
                with tracing.span("fork.snapshot", **{"rlsandbox.count": count}):
                    snapshot = await self.forker.snapshot(sandbox, source.workdir)
        options = replace(
            source.options,
            labels={**source.options.labels, **labels},
            idempotency_key="",
            forked_from=source.id,
        )
        log.info(
            "forking into %d (%d of them new sessions): %d paths, %d deleted, %d bytes",
            count,
            new,
            len(snapshot.roots),
            len(snapshot.deletes),
            snapshot.bytes,
            extra={"session": source.id},
        )
        async with Drop(snapshot.tar) as drop:  # on the host once, however many forks take it
            setup = functools.partial(self.forker.apply, snapshot, drop)
            made = await asyncio.gather(
                *(self.create(options) for _ in range(new)),
                *(self.create(options, setup=setup) for _ in range(count - new)),
                return_exceptions=True,
            )
        forks = [s for s in made if isinstance(s, Session)]
        failed = [e for e in made if isinstance(e, BaseException)]
        if failed:
            for s in forks:
                await self.close(s.id, f"fork of {source.id} failed: {type(failed[0]).__name__}")
            raise failed[0]
        return forks, snapshot

    def _forks_as_new_sessions(self, source: Session, count: int) -> int:
        """How many of ``count`` forks of ``source`` are new sessions of its pool or task instead
        of copies: all when nothing has run in it since its hand-out (a fresh sandbox of the pool is
        one), and for a task as many as it has prefetched sandboxes ready (preparing the task again
        in each fork costs more than copying the source's workspace once: 638 against 520 ms for a
        group of 8, docs/BENCHMARKS.md "Fork")."""
        if not source.pristine:
            return 0
        if source.options.task is None:
            return count
        return min(count, self.prefetcher.state(source.options.task_ref).ready) if source.options.task_ref else 0

    async def close(self, session_id: str, reason: str = "closed by client") -> bool:
        """End a session and destroy its sandbox. False when it had already ended."""
        session = self.sessions.get(session_id)
        if session is None:
            if session_id in self._tombstones:
                return False
            self.get(session_id)  # raises the precise NOT_FOUND
            return False
        if session.state in ENDED:
            return False
        session.transition(SessionState.CLOSING)
        await self.recorder.before_forget(session)
        self.recorder.forget(session.id)
        if session.sandbox is not None:  # destroyed or recycled behind the answer
            session.pool.release(session.sandbox, reason, reuse=True)
        session.transition(SessionState.CLOSED)
        self._bury(session, reason)
        self.recorder.closed(session, reason)
        log.info("session closed: %s", reason, extra={"session": session.id, "pool": session.pool.name})
        return True

    async def _fail(self, session: Session, detail: str) -> str:
        """End a session whose sandbox died; returns the reason it now carries (from the engine),
        once the engine told it: callers at once (the reaper, a step, a grade) learn the same."""
        if session.death is None:
            if session.state is not SessionState.READY:
                return f"sandbox of session {session.id} died: {session.end_reason or detail}"
            session.death = asyncio.ensure_future(self._die(session, detail))
        return await asyncio.shield(session.death)

    def _died(self, session: Session, reason: str) -> SandboxDied:
        """The error a call on a session whose sandbox died gets: the fault field (trailing metadata
        rlsandbox-fault) when the episode killed it, which a trainer must not mask."""
        tomb = self._tombstones.get(session.id)
        fields = tomb.fields() if tomb is not None else {}
        return SandboxDied(f"the {reason}; start a new session", session_id=session.id, **fields)

    async def _die(self, session: Session, detail: str) -> str:
        session.transition(SessionState.FAILED)
        await self.recorder.before_forget(session)  # while the session is still known to the recorder
        self.recorder.forget(session.id)
        self._bury(session, f"sandbox died: {detail}", dying=True)  # until the engine says more
        cause, whose = await session.pool.death_cause(session.sandbox) if session.sandbox is not None else (detail, "")
        # Out of memory at the sandbox's own limit, past its disk budget on a node whose disk ran
        # low, or its agent's stream tampered with: its processes did it, the episode's doing.
        fault = f"the sandbox died of the episode's own doing: {cause}" if whose in EPISODES_DOING else ""
        self._bury(session, f"sandbox died: {cause}", fault)
        self.recorder.died(session, cause, detail, whose)
        if self.metrics is not None:
            kinds = {"oom": "oom_killed", "disk": "disk_exceeded", "tamper": "tampered", HOST_OOM: "host_oom_killed"}
            kind = kinds.get(whose, "died")
            self.metrics.sandbox_deaths.labels(session.pool.name, kind).inc()
        if session.sandbox is not None:
            session.pool.release(session.sandbox, f"sandbox died: {cause}")
        if fault:  # kept in its tombstone to be graded: without what it no longer needs
            session.step_results.clear()
            session.sandbox = None
        return f"sandbox of session {session.id} died: {cause}{FAULT_NOTE if fault else ''}"

    async def _end_if_dead(self, session: Session) -> str | None:
        """A ready session whose sandbox is found dead ends (the engine says why): the reason it
        then carries; None while its sandbox lives."""
        sandbox = session.sandbox
        if session.state is SessionState.READY and sandbox is not None and not sandbox.alive:
            return await self._fail(session, sandbox.channel.closed_reason or "its channel closed")
        return None

    async def _ready(self, session: Session) -> Sandbox:
        """The session's sandbox; a sandbox found dead ends the session first (the engine says why)."""
        reason = await self._end_if_dead(session)
        if reason is not None:
            raise self._died(session, reason)
        return session.require_ready()

    # -- operations on a live session -----------------------------------------------------------
    async def exec(
        self, session_id: str, req: ExecRequest, *, seq: int = 0, on_chunk: ChunkCallback | None = None
    ) -> tuple[ExecResult, bool]:
        """Run one step; returns (result, replayed). A repeated ``seq`` with the same command returns
        the first result; with another command it is FailedPrecondition (never a silent replay)."""
        async with self._busy(session_id) as (session, sandbox):
            if seq:
                big = len(req.stdin) >= BIG_STDIN
                fingerprint = await asyncio.to_thread(step_fingerprint, req) if big else step_fingerprint(req)
                future, replay = session.remember_step(seq, fingerprint)
                if replay:
                    return await asyncio.shield(future), True
            if session.options.env:
                req = replace(req, env={**session.options.env, **req.env})
            if not req.cwd and not req.shell_session:  # a persistent shell keeps its own cwd
                req = replace(req, cwd=session.workdir)
            started = time.perf_counter()
            try:
                result = await self._run_step(session, sandbox, req, on_chunk)
            except BaseException as e:
                if seq:
                    session.forget_step(seq, e)
                raise
        session.steps += 1
        self.execs_total += 1
        if self.metrics is not None:
            self.metrics.exec_seconds.labels(session.pool.name).observe(time.perf_counter() - started)
        if seq:
            future.set_result(result)
        await self.recorder.stepped(session, req, result, seq)
        return result, False

    async def _run_step(self, session: Session, sandbox: Sandbox, req: ExecRequest, on_chunk: ChunkCallback | None) -> ExecResult:
        try:
            return await sandbox.exec(req, on_chunk)
        except SandboxDied as e:
            raise self._died(session, await self._fail(session, e.message)) from None

    async def write_files(self, session_id: str, files: Sequence[FileWrite], *, timeout: float) -> list[FileWriteResult]:
        """Write files into a session's sandbox; a ``files`` event lists what was written, and the
        call returns once it is durable."""
        async with self._busy(session_id) as (session, sandbox):
            results = await sandbox.write_files(files, timeout)
        self.recorder.files_written(session, [(f.path, len(f.data)) for f, r in zip(files, results, strict=True) if not r.error])
        await self.recorder.confirm(session)
        return results

    async def read_files(self, session_id: str, paths: Sequence[str], *, max_bytes: int, timeout: float) -> list[FileRead]:
        async with self._busy(session_id, changes=False) as (_, sandbox):
            return await sandbox.read_files(paths, max_bytes, timeout)

    async def evaluate(
        self, session_id: str, task: Task | None, *, mode: str, timeout: float | None
    ) -> tuple[Session, Task, GradeResult]:
        """Grade a session against ``task`` (default: the task it was started from). A session whose
        sandbox its own episode killed (tombstone.fault) scores reward 0 with that as its limit,
        never an infra error a trainer would mask: dying must not pay better than failing."""
        live = self.sessions.get(session_id)
        if live is not None:
            await self._end_if_dead(live)  # a sandbox found dead: whose doing, first
        with contextlib.suppress(NotFound):
            await self.settled(session_id)  # another caller is finding it dead: its account first
        tomb = self._tombstones.get(session_id)
        if tomb is not None and tomb.session is not None and tomb.fault:
            session = tomb.session
            task, _ = self._grading_task(session, task)
            result = episodes_mess(tomb.fault)
            result.mode = mode
            self._graded(session, task, result)
            return session, task, result
        session = self.get(session_id)
        session.require_ready()
        task, grader = self._grading_task(session, task)
        rooms = None
        if task is session.options.task and session.options.task_ref:
            ref = session.options.task_ref
            rooms = lambda: self.prefetcher.take(ref, room=True)  # noqa: E731 - a clean room prepared ahead, if any
        async with self._busy(session_id, changes=mode == "in_place") as (_, sandbox):
            result = await grader.grade(sandbox, task, mode=mode, timeout=timeout, rooms=rooms)
        self._graded(session, task, result)
        return session, task, result

    def _grading_task(self, session: Session, task: Task | None) -> tuple[Task, Grader]:
        task = task or session.options.task
        if task is None:
            raise FailedPrecondition(f"session {session.id} was not started from a task; pass the task to grade against")
        if self.grader is None:
            raise FailedPrecondition("this node has no grader")
        if task.spec.pool_name != session.pool.name:
            raise InvalidArgument(f"the task runs in pool {task.spec.pool_name!r}, the session is in {session.pool.name!r}")
        return task, self.grader

    def _graded(self, session: Session, task: Task, result: GradeResult) -> None:
        self.recorder.graded(session, task.id, result)
        if self.metrics is not None:
            self.metrics.observe_grade(result.status.value, result.mode, result.duration, len(result.tampering))

    # -- reaping and shutdown -------------------------------------------------------------------
    async def run_reaper(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.reap_interval):
                    await self._stop.wait()
            await self.reap()

    async def reap(self) -> None:
        """One pass: end sessions whose sandbox died, close idle ones and those past their lifetime;
        prefetch targets past their deadline end."""
        self.prefetcher.expire()
        now = time.monotonic()
        dead = {
            s: s.sandbox.channel.closed_reason or "its channel closed"
            for s in self.sessions.values()
            if s.state is SessionState.READY and s.sandbox is not None and not s.sandbox.alive
        }
        # Together: each asks the engine why its sandbox died, which may take a moment.
        for outcome in await asyncio.gather(*(self._fail(s, why) for s, why in dead.items()), return_exceptions=True):
            if isinstance(outcome, Exception):
                log.warning("ending a session whose sandbox died failed: %s", outcome)
        for session in list(self.sessions.values()):
            if session.state is not SessionState.READY:
                continue
            idle = now - session.last_used
            if session.in_flight == 0 and idle > session.options.idle_timeout:
                self.reaped_total += 1
                await self.close(session.id, f"closed by idle timeout after {session.options.idle_timeout:g} s")
            elif now - session.started > session.options.max_lifetime:
                self.reaped_total += 1
                await self.close(session.id, f"closed at its maximum lifetime of {session.options.max_lifetime:g} s")

    def stop_accepting(self) -> None:
        self._accepting = False

    async def let_go(self, reason: str) -> None:
        """Drop every session without ending it: channels closed, sandboxes and journal rows kept
        (a daemon whose start failed after recovery leaves them to its next start)."""
        sessions = list(self.sessions.values())
        self.sessions.clear()
        for s in sessions:
            if s.sandbox is not None:
                with contextlib.suppress(Exception):
                    await s.sandbox.channel.close(reason)

    async def prefetch(self, task: Task, count: int, ttl: float | None) -> PrefetchState:
        """Keep ``count`` sandboxes prepared for ``task`` (session/prefetch.py)."""
        if self.grader is None:
            raise FailedPrecondition("this node has no grader; it cannot prepare sandboxes for tasks")
        if not self._accepting or self.draining:
            raise Unavailable(
                f"node {self.node_id} is {'draining' if self._accepting else 'shutting down'}; prefetch on another node"
            )
        if task.spec.image and task.spec.pool_name not in self.pools:
            await self._image_pool(task.spec.image)
        return self.prefetcher.prefetch(task, count, ttl)

    async def _image_pool(self, image: str) -> SandboxPool:
        if self.image_pool is None:
            raise FailedPrecondition(f"this node makes no pools for images (image {image!r}); use one of its pools")
        return await self.image_pool(image)

    async def close_all(self, reason: str) -> None:
        self._stop.set()
        await self.prefetcher.close()
        await asyncio.gather(*(self.close(sid, reason) for sid in list(self.sessions)), return_exceptions=True)

    # Last in the class: below it, ``list`` would name this method, not the type.
    def list(self, labels: Mapping[str, str], pool: str = "") -> list[Session]:
        return [
            s
            for s in self.sessions.values()
            if (not pool or s.pool.name == pool) and all(s.options.labels.get(k) == v for k, v in labels.items())
        ]
