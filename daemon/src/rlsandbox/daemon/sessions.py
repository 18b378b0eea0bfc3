"""Episode sessions: a sandbox leased from a pool, multi-turn state, and its lifecycle.

A session is a small state machine (CREATING -> READY -> CLOSING -> CLOSED, or FAILED); an
illegal transition is a typed error. Idle and lifetime reaping run in one loop; an ended session
leaves a tombstone so that later calls learn when and why it ended instead of a bare NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import functools
import hashlib
import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rlsandbox.daemon.agent.channel import ChunkCallback
from rlsandbox.daemon.errors import (
    FailedPrecondition,
    IllegalTransition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SandboxDied,
    SandboxError,
    Unavailable,
)
from rlsandbox.daemon.events import model as ev
from rlsandbox.daemon.events.publisher import EventPublisher
from rlsandbox.daemon.grading.grader import Grader
from rlsandbox.daemon.grading.rewards import GradeResult
from rlsandbox.daemon.grading.task import Task
from rlsandbox.daemon.journal import SEQ_BLOCK, JournalEntry, SessionJournal
from rlsandbox.daemon.model import ExecRequest, ExecResult, FileRead, FileWrite, FileWriteResult
from rlsandbox.daemon.pool import SandboxFactory, WarmPool
from rlsandbox.daemon.sandbox import Sandbox

log = logging.getLogger(__name__)

TOMBSTONES = 100_000
STEP_CACHE = 256  # per session: retried steps older than this many steps are not deduplicated
JOURNAL_WAIT = 1.0  # seconds a step waits at most for its journal row (a stalled disk costs that, not an error)


def step_fingerprint(req: ExecRequest) -> bytes:
    """What a step runs (not its timeout or output caps): equal for a retry of the same step."""
    h = hashlib.sha256()
    for part in (repr(req.argv), repr(req.shell), repr(req.shell_session), repr(req.cwd), repr(sorted(req.env.items()))):
        h.update(part.encode("utf-8", "surrogateescape") + b"\x00")
    h.update(req.stdin)
    return h.digest()


class SessionState(enum.Enum):
    CREATING = 1
    READY = 2
    CLOSING = 3
    CLOSED = 4
    FAILED = 5


_ALLOWED = {
    SessionState.CREATING: {SessionState.READY, SessionState.FAILED, SessionState.CLOSING},
    SessionState.READY: {SessionState.CLOSING, SessionState.FAILED},
    SessionState.CLOSING: {SessionState.CLOSED, SessionState.FAILED},
    SessionState.CLOSED: set(),
    SessionState.FAILED: set(),
}


@dataclass(frozen=True, slots=True)
class SessionOptions:
    pool: str
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str = ""
    idle_timeout: float = 600.0
    max_lifetime: float = 6 * 3600.0
    labels: Mapping[str, str] = field(default_factory=dict)
    idempotency_key: str = ""
    acquire_timeout: float = 30.0
    task: Task | None = None


@dataclass(frozen=True, slots=True)
class Tombstone:
    session_id: str
    ended_at: float
    reason: str
    idempotency_key: str = ""


class Session:
    def __init__(self, session_id: str, options: SessionOptions, pool: WarmPool) -> None:
        self.id = session_id
        self.options = options
        self.pool = pool
        self.state = SessionState.CREATING
        self.sandbox: Sandbox | None = None
        self.created_at = time.time()
        self.started = self.last_used = time.monotonic()
        self.steps = 0
        self.event_seq = 0  # events emitted for this session (numbered from 1, no holes)
        self.seq_reserved = 0  # event numbers up to here are reserved in the journal
        self.seq_durable = 0  # ... and up to here durably so: events numbered above it wait
        self.held: list[ev.Event] = []
        self.awaiting_reservation = False
        self.acked_seq = 0  # events up to here are durable (acknowledged by JetStream, or in the outbox)
        self.durable_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self.end_reason = ""
        self.in_flight = 0
        # seq -> (what the step ran, its result): a retried step gets the first result.
        self._step_results: collections.OrderedDict[int, tuple[bytes, asyncio.Future[ExecResult]]] = collections.OrderedDict()
        # Resolved when CREATING ends either way, for idempotent retries that arrive meanwhile.
        self.settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def transition(self, new: SessionState) -> None:
        if new not in _ALLOWED[self.state]:
            raise IllegalTransition(f"session {self.id} cannot go from {self.state.name} to {new.name}", session_id=self.id)
        self.state = new

    def touch(self) -> None:
        self.last_used = time.monotonic()

    @property
    def last_used_at(self) -> float:
        """Wall-clock time of the last call (derived from the monotonic clock)."""
        return time.time() - (time.monotonic() - self.last_used)

    @property
    def workdir(self) -> str:
        if self.options.workdir:
            return self.options.workdir
        if self.options.task is not None:
            return self.options.task.spec.workspace.path
        return self.pool.spec.container.workdir

    def require_ready(self) -> Sandbox:
        if self.state is not SessionState.READY or self.sandbox is None:
            raise FailedPrecondition(f"session {self.id} is {self.state.name.lower()}", session_id=self.id)
        if not self.sandbox.alive:
            raise SandboxDied(
                f"the sandbox of session {self.id} died ({self.sandbox.channel.closed_reason}); start a new session",
                session_id=self.id,
            )
        return self.sandbox


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
        journal: where READY sessions are recorded so that a restarted daemon re-adopts them
            (:meth:`recover`); None: a restart loses them.
    """

    def __init__(
        self,
        node_id: str,
        pools: Mapping[str, WarmPool],
        *,
        max_sessions: int,
        reap_interval: float = 1.0,
        grader: Grader | None = None,
        events: EventPublisher | None = None,
        events_output_cap: int = 0,
        events_confirm_timeout: float = 0.25,
        journal: SessionJournal | None = None,
    ) -> None:
        self.node_id = node_id
        self.journal = journal
        self.grader = grader
        self.events = events
        if events is not None:
            events.on_durable = self._on_durable
        self.events_unconfirmed_total = 0  # calls answered before their events were durable (bound hit)
        self.events_confirm_timeout = events_confirm_timeout
        self.events_output_cap = events_output_cap
        self._timeouts: collections.deque[float] = collections.deque()
        self._storm_alerted_at = 0.0
        self.pools = pools
        self.max_sessions = max_sessions
        self.reap_interval = reap_interval
        self.sessions: dict[str, Session] = {}
        self._tombstones: collections.OrderedDict[str, Tombstone] = collections.OrderedDict()
        self._by_key: dict[str, str] = {}
        self._accepting = True
        self._stop = asyncio.Event()
        self.execs_total = 0
        self.reaped_total = 0
        self.adopted_total = 0
        self.lost_total = 0

    # -- lifecycle ------------------------------------------------------------------------------
    async def create(self, options: SessionOptions) -> Session:
        if not self._accepting:
            raise Unavailable("node is shutting down; create the session on another node")
        pool = self.pools.get(options.pool)
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
        if options.task is not None and "task" not in options.labels:
            options = replace(options, labels={**options.labels, "task": options.task.id})
        session = Session(f"{self.node_id}-{secrets.token_hex(8)}", options, pool)
        self.sessions[session.id] = session
        if options.idempotency_key:
            self._by_key[options.idempotency_key] = session.id
        if options.task is not None and self.grader is None:
            raise FailedPrecondition("this node has no grader; it cannot start sessions from tasks")
        try:
            session.sandbox = await pool.acquire(options.acquire_timeout)
            try:
                if options.task is not None:
                    assert self.grader is not None
                    await self.grader.prepare(session.sandbox, options.task)
                # Durable before the session is handed out: a crash right after must re-adopt it.
                await self._journal_record(session)
            except BaseException:
                self._journal_forget(session)
                await pool.release(session.sandbox, "session setup failed")
                raise
        except BaseException as e:
            self.sessions.pop(session.id, None)
            self._by_key.pop(options.idempotency_key, None)
            session.transition(SessionState.FAILED)
            self._bury(session, f"failed to start: {e}")
            session.settled.set_exception(e if isinstance(e, Exception) else Unavailable("session creation cancelled"))
            session.settled.exception()  # retrieved: there may be no retry waiting on it
            raise
        session.transition(SessionState.READY)
        session.touch()
        session.settled.set_result(None)
        log.info("session %s ready on %s (pool %s)", session.id, session.sandbox.name, pool.name)
        self._emit(
            session,
            ev.CREATED,
            {
                "pool": pool.name,
                "image": pool.spec.container.image,
                "mode": session.sandbox.mode,
                "container": session.sandbox.name,
                "task": options.task.id if options.task else None,
                "workdir": session.workdir,
            },
        )
        await self._confirm(session)
        return session

    # -- the journal and recovery -------------------------------------------------------------------
    async def _journal_record(self, session: Session) -> None:
        if self.journal is None or session.sandbox is None:
            return
        o = session.options
        session.seq_reserved = session.event_seq + SEQ_BLOCK
        await self.journal.record(
            JournalEntry(
                session=session.id,
                pool=session.pool.name,
                container=session.sandbox.name,
                container_id=session.sandbox.container_id,
                transport=session.sandbox.transport,
                runtime=session.sandbox.runtime,
                image=session.sandbox.image,
                options={
                    "env": dict(o.env),
                    "workdir": o.workdir,
                    "idle_timeout": o.idle_timeout,
                    "max_lifetime": o.max_lifetime,
                    "labels": dict(o.labels),
                    "idempotency_key": o.idempotency_key,
                    "acquire_timeout": o.acquire_timeout,
                },
                task_spec=o.task.spec_json() if o.task is not None else None,
                task_tar=o.task.workspace_tar if o.task is not None else b"",
                created_at=session.created_at,
                started_at=time.time() - (time.monotonic() - session.started),
                seq_reserved=session.seq_reserved,
                steps=session.steps,
                emitted=session.acked_seq,
            )
        )
        session.seq_durable = session.seq_reserved

    def _journal_forget(self, session: Session) -> None:
        if self.journal is not None:
            self.journal.forget(session.id)

    async def recover(self, factory: SandboxFactory, containers: Mapping[str, str], *, concurrency: int = 32) -> tuple[int, int]:
        """Re-adopt the sessions an earlier life of this daemon left in the journal.

        ``containers`` maps this node's container names to their state as the engine lists them.
        A session whose sandbox still answers is READY again under its old id (its files, shells
        and processes intact); any other ends with a tombstone and a ``failed`` event saying why.
        Returns (adopted, lost). Containers not adopted are left to the reconciler's sweep.
        """
        if self.journal is None:
            return 0, 0
        entries = self.journal.load()
        slots = asyncio.Semaphore(concurrency)

        async def one(entry: JournalEntry) -> bool:
            async with slots:
                return await self._adopt(factory, entry, containers.get(entry.container))

        outcomes = await asyncio.gather(*(one(e) for e in entries))
        adopted = sum(outcomes)
        return adopted, len(outcomes) - adopted

    async def _adopt(self, factory: SandboxFactory, entry: JournalEntry, state: str | None) -> bool:
        o = entry.options
        pool = self.pools.get(entry.pool)
        try:
            if pool is None:
                raise SandboxDied(f"its pool {entry.pool!r} is no longer configured")
            task = Task.from_wire(entry.task_spec, entry.task_tar) if entry.task_spec else None
            sandbox = await factory.adopt(entry, state)
        except Exception as e:  # whatever one sandbox does, recovery ends its session and goes on
            detail = e.message if isinstance(e, SandboxError) else f"{type(e).__name__}: {e}"
            self._lost(entry, f"lost when the daemon restarted: {detail}")
            return False
        options = SessionOptions(
            pool=entry.pool,
            env=o.get("env", {}),
            workdir=o.get("workdir", ""),
            idle_timeout=float(o.get("idle_timeout", 600.0)),
            max_lifetime=float(o.get("max_lifetime", 6 * 3600.0)),
            labels=o.get("labels", {}),
            idempotency_key=o.get("idempotency_key", ""),
            acquire_timeout=float(o.get("acquire_timeout", 30.0)),
            task=task,
        )
        session = Session(entry.session, options, pool)
        session.sandbox = sandbox
        session.created_at = entry.created_at
        session.started = time.monotonic() - max(0.0, time.time() - entry.started_at)
        session.steps = entry.steps
        session.event_seq = entry.seq_reserved
        pool.adopt(sandbox)
        session.transition(SessionState.READY)
        session.touch()  # the restart counts as activity: the idle timeout starts again
        session.settled.set_result(None)
        self.sessions[session.id] = session
        if options.idempotency_key:
            self._by_key[options.idempotency_key] = session.id
        assert self.journal is not None  # the row is there; its next block is reserved before any event
        session.seq_reserved = session.event_seq + SEQ_BLOCK
        session.acked_seq = session.event_seq  # nothing of this life yet; below it, the window says
        await self.journal.progress(
            session.id, seq_reserved=session.seq_reserved, emitted=session.acked_seq, steps=session.steps, urgent=True
        )
        session.seq_durable = session.seq_reserved
        self.adopted_total += 1
        log.info("session %s re-adopted on %s (pool %s)", session.id, sandbox.name, pool.name)
        self._emit(
            session,
            ev.ADOPTED,
            {"container": sandbox.name, "transport": sandbox.transport, "unused_seq_window": _window(entry)},
        )
        return True

    def _lost(self, entry: JournalEntry, reason: str) -> None:
        """A journalled session that cannot be re-adopted: tombstone, journal row gone, an event."""
        self.lost_total += 1
        assert self.journal is not None
        self.journal.forget(entry.session)
        key = str(entry.options.get("idempotency_key", ""))
        self._tombstones[entry.session] = Tombstone(entry.session, time.time(), reason, key)
        if key:
            self._by_key[key] = entry.session
        log.warning("session %s: %s", entry.session, reason)
        if self.events is not None:
            labels = dict(entry.options.get("labels", {}))
            data = {"reason": reason, "steps": entry.steps, "unused_seq_window": _window(entry)}
            self.events.emit(ev.Event(ev.FAILED, self.node_id, entry.session, entry.seq_reserved + 1, data, labels))

    # -- events ---------------------------------------------------------------------------------
    def _on_durable(self, events: list[ev.Event]) -> None:
        """The publisher says these events are durable: wake the calls waiting for them."""
        top: dict[str, int] = {}
        for e in events:
            if e.session and e.seq > top.get(e.session, 0):
                top[e.session] = e.seq
        for sid, seq in top.items():
            session = self.sessions.get(sid)
            if session is None or seq <= session.acked_seq:
                continue
            session.acked_seq = seq
            waiting = session.durable_waiters
            if waiting:
                session.durable_waiters = [(n, f) for n, f in waiting if n > seq]
                for n, f in waiting:
                    if n <= seq and not f.done():
                        f.set_result(None)
            if self.journal is not None and session.state is SessionState.READY:
                self.journal.progress(sid, seq_reserved=session.seq_reserved, emitted=seq, steps=session.steps)

    async def _confirm(self, session: Session) -> None:
        """Wait (at most ``events_confirm_timeout``) until the session's events so far are durable, so that
        what a caller was told cannot be missing from the events after a crash. A stalled NATS
        costs the call that bound, not an error; such calls are counted."""
        seq = session.event_seq
        if self.events is None or seq <= session.acked_seq or self.events_confirm_timeout <= 0:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        session.durable_waiters.append((seq, future))
        self.events.flush_soon()
        try:
            async with asyncio.timeout(self.events_confirm_timeout):
                await asyncio.shield(future)
        except TimeoutError:
            self.events_unconfirmed_total += 1

    def _emit(self, session: Session, type_: str, data: dict[str, Any]) -> None:
        if self.events is None:
            return
        session.event_seq += 1
        event = ev.Event(type_, self.node_id, session.id, session.event_seq, data, dict(session.options.labels))
        if self.journal is not None and session.state is SessionState.READY:
            urgent = session.event_seq > session.seq_reserved - SEQ_BLOCK // 2
            if urgent:  # reserve the next block ahead of use
                session.seq_reserved = max(session.seq_reserved, session.event_seq) + SEQ_BLOCK
            durable = self.journal.progress(
                session.id, seq_reserved=session.seq_reserved, emitted=session.acked_seq, steps=session.steps, urgent=urgent
            )
            if session.event_seq > session.seq_durable:
                # Its number is not durably reserved yet: it waits (a next life could reuse it).
                if not session.awaiting_reservation:
                    session.awaiting_reservation = True
                    reserved = session.seq_reserved
                    durable.add_done_callback(functools.partial(self._on_reserved, session, reserved))
                session.held.append(event)
                return
        if session.held:
            session.held.append(event)  # behind the held ones, in order
            return
        self.events.emit(event)

    def _on_reserved(self, session: Session, durable: int, _: asyncio.Future[None]) -> None:
        self._release_held(session, durable)

    def _release_held(self, session: Session, durable: int) -> None:
        """Emit the held events whose numbers are now durably reserved (all of them once the
        session's row is gone: nothing can be re-adopted to reuse them)."""
        session.awaiting_reservation = False
        session.seq_durable = max(session.seq_durable, durable)
        assert self.events is not None
        while session.held and (session.held[0].seq <= session.seq_durable or session.state is not SessionState.READY):
            self.events.emit(session.held.pop(0))
        if session.held and self.journal is not None:
            session.awaiting_reservation = True
            reserved = session.seq_reserved
            self.journal.progress(
                session.id, seq_reserved=reserved, emitted=session.acked_seq, steps=session.steps, urgent=True
            ).add_done_callback(functools.partial(self._on_reserved, session, reserved))

    def _step_event(self, session: Session, req: ExecRequest, result: ExecResult, seq: int) -> None:
        if self.events is None:
            return
        data: dict[str, Any] = {
            "argv": list(req.argv) if req.argv is not None else None,
            "shell": req.shell[:2000] if req.shell is not None else None,
            "shell_session": req.shell_session,
            "step_seq": seq or None,
            "exit_code": result.exit_code,
            "signal": result.signal,
            "timed_out": result.timed_out,
            "duration": round(result.duration, 6),
            "stdout_bytes": result.stdout_total,
            "stderr_bytes": result.stderr_total,
            "truncated": result.stdout_truncated or result.stderr_truncated,
        }
        if self.events_output_cap:
            cap = self.events_output_cap
            data["stdout"] = result.stdout[:cap].decode("utf-8", errors="replace")
            data["stderr"] = result.stderr[:cap].decode("utf-8", errors="replace")
        self._emit(session, ev.STEP, data)
        if result.timed_out:
            self._timeout_storm()

    def _timeout_storm(self, window: float = 60.0, threshold: int = 50) -> None:
        """A node alert when many commands time out at once (a hung dependency, an overloaded node)."""
        now = time.monotonic()
        self._timeouts.append(now)
        while self._timeouts and self._timeouts[0] < now - window:
            self._timeouts.popleft()
        if len(self._timeouts) >= threshold and now - self._storm_alerted_at > window and self.events is not None:
            self._storm_alerted_at = now
            self.events.emit_node(ev.ALERT, {"kind": "timeout_storm", "timeouts": len(self._timeouts), "window_s": window})

    async def write_files(self, session_id: str, files: Sequence[FileWrite], *, timeout: float) -> list[FileWriteResult]:
        """Write files into a session's sandbox (counted in flight, so the idle reaper waits for
        it); a ``files`` event lists what was written, and the call returns once it is durable."""
        session = self.get(session_id)
        sandbox = session.require_ready()
        session.touch()
        session.in_flight += 1
        try:
            results = await sandbox.write_files(files, timeout)
        finally:
            session.in_flight -= 1
            session.touch()
        written = [(f.path, len(f.data)) for f, r in zip(files, results, strict=True) if not r.error]
        self._emit(session, ev.FILES, {"files": [{"path": p, "bytes": n} for p, n in written[:1000]], "count": len(written)})
        await self._confirm(session)
        return results

    async def read_files(self, session_id: str, paths: Sequence[str], *, max_bytes: int, timeout: float) -> list[FileRead]:
        """Read files from a session's sandbox (counted in flight, like every session operation)."""
        session = self.get(session_id)
        sandbox = session.require_ready()
        session.touch()
        session.in_flight += 1
        try:
            return await sandbox.read_files(paths, max_bytes, timeout)
        finally:
            session.in_flight -= 1
            session.touch()

    def get(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is not None:
            return session
        tomb = self._tombstones.get(session_id)
        if tomb is not None:
            ago = time.time() - tomb.ended_at
            raise NotFound(f"session {session_id} not found (ended {ago:.0f} s ago: {tomb.reason})", session_id=session_id)
        if not session_id:
            raise InvalidArgument("session_id is empty")
        raise NotFound(f"session {session_id} not found on node {self.node_id}", session_id=session_id)

    async def close(self, session_id: str, reason: str = "closed by client") -> bool:
        """End a session and destroy its sandbox. False when it had already ended."""
        session = self.sessions.get(session_id)
        if session is None:
            if session_id in self._tombstones:
                return False
            self.get(session_id)  # raises the precise NOT_FOUND
            return False
        if session.state in (SessionState.CLOSING, SessionState.CLOSED, SessionState.FAILED):
            return False
        session.transition(SessionState.CLOSING)
        self._journal_forget(session)
        try:
            if session.sandbox is not None:
                await session.pool.release(session.sandbox, reason)
        finally:
            session.transition(SessionState.CLOSED)
            self.sessions.pop(session.id, None)
            self._bury(session, reason)
            self._emit(session, ev.CLOSED, {"reason": reason, "steps": session.steps})
        log.info("session %s closed: %s", session.id, reason)
        return True

    def _bury(self, session: Session, reason: str) -> None:
        session.end_reason = reason
        key = session.options.idempotency_key
        self._tombstones[session.id] = Tombstone(session.id, time.time(), reason, key)
        while len(self._tombstones) > TOMBSTONES:
            _, old = self._tombstones.popitem(last=False)
            if old.idempotency_key and self._by_key.get(old.idempotency_key) == old.session_id:
                del self._by_key[old.idempotency_key]

    # -- steps ----------------------------------------------------------------------------------
    async def exec(
        self, session_id: str, req: ExecRequest, *, seq: int = 0, on_chunk: ChunkCallback | None = None
    ) -> tuple[ExecResult, bool]:
        """Run one step; returns (result, replayed). A repeated ``seq`` with the same command returns
        the first result; with another command it is FailedPrecondition (never a silent replay)."""
        session = self.get(session_id)
        sandbox = session.require_ready()
        session.touch()
        if seq:
            # Hashing megabytes of stdin is CPU work: off the event loop when it is large.
            fingerprint = step_fingerprint(req) if len(req.stdin) < 1 << 20 else await asyncio.to_thread(step_fingerprint, req)
            earlier = session._step_results.get(seq)
            if earlier is not None:
                if earlier[0] != fingerprint:
                    raise FailedPrecondition(
                        f"step seq {seq} of session {session.id} already ran a different command; a retry must send the "
                        "same command, a new command needs a new seq",
                        session_id=session.id,
                    )
                return await asyncio.shield(earlier[1]), True
            future: asyncio.Future[ExecResult] = asyncio.get_running_loop().create_future()
            session._step_results[seq] = (fingerprint, future)
            while len(session._step_results) > STEP_CACHE:
                session._step_results.popitem(last=False)
        if session.options.env:
            req = replace(req, env={**session.options.env, **req.env})
        if not req.cwd and not req.shell_session:  # a persistent shell keeps its own cwd
            req = replace(req, cwd=session.workdir)
        session.in_flight += 1
        try:
            result = await self._run_step(session, sandbox, req, on_chunk)
        except BaseException as e:
            if seq:
                # A failed step may be retried for real: forget it (and wake any concurrent twin).
                entry = session._step_results.pop(seq, None)
                failed = entry[1] if entry is not None else None
                if failed is not None and not failed.done():
                    if isinstance(e, Exception):
                        failed.set_exception(e)
                        failed.exception()  # retrieved: a twin may never await it
                    else:
                        failed.cancel()
            raise
        finally:
            session.in_flight -= 1
            session.touch()
        session.steps += 1
        self.execs_total += 1
        if seq:
            future.set_result(result)
        self._step_event(session, req, result, seq)
        if self.journal is not None and self.events is not None and self.events_confirm_timeout > 0:
            # With events confirmed, the journal's step count is exact for every answered step
            # (the closed event after a re-adoption says it), written while the event is confirmed.
            row = self.journal.progress(
                session.id, seq_reserved=session.seq_reserved, emitted=session.acked_seq, steps=session.steps, urgent=True
            )
            await asyncio.gather(self._confirm(session), _within(row, JOURNAL_WAIT))
        else:
            await self._confirm(session)
        return result, False

    async def evaluate(
        self, session_id: str, task: Task | None, *, mode: str, timeout: float | None
    ) -> tuple[Session, Task, GradeResult]:
        """Grade a session against ``task`` (default: the task it was started from)."""
        session = self.get(session_id)
        sandbox = session.require_ready()
        task = task or session.options.task
        if task is None:
            raise FailedPrecondition(f"session {session_id} was not started from a task; pass the task to grade against")
        if self.grader is None:
            raise FailedPrecondition("this node has no grader")
        if task.spec.pool != session.pool.name:
            raise InvalidArgument(f"the task runs in pool {task.spec.pool!r}, the session is in {session.pool.name!r}")
        session.touch()
        session.in_flight += 1
        try:
            result = await self.grader.grade(sandbox, task, mode=mode, timeout=timeout)
        finally:
            session.in_flight -= 1
            session.touch()
        counts = result.counts()
        self._emit(
            session,
            ev.REWARD,
            {
                "task": task.id,
                "status": result.status.value,
                "reward": result.reward,
                "resolved": result.resolved,
                "mode": result.mode,
                "counts": counts,
                "tampering": result.tampering[:50],
                "duration": round(result.duration, 6),
                "exit_code": result.exit_code,
                "message": result.message[:2000],
            },
        )
        if result.tampering:
            self._emit(session, ev.ALERT, {"kind": "tampering", "task": task.id, "details": result.tampering[:50]})
        return session, task, result

    async def _run_step(self, session: Session, sandbox: Sandbox, req: ExecRequest, on_chunk: ChunkCallback | None) -> ExecResult:
        try:
            return await sandbox.exec(req, on_chunk)
        except SandboxDied as e:
            reason = await self._fail(session, e.message)
            raise SandboxDied(f"the {reason}; start a new session", session_id=session.id) from None

    async def _fail(self, session: Session, detail: str) -> str:
        """End a session whose sandbox died; returns the reason it now carries (from the engine)."""
        if session.state is not SessionState.READY:
            return f"sandbox of session {session.id} died: {session.end_reason or detail}"
        session.transition(SessionState.FAILED)
        self._journal_forget(session)
        self.sessions.pop(session.id, None)
        self._bury(session, f"sandbox died: {detail}")  # until the engine says more
        cause, oom = await session.pool.death_cause(session.sandbox) if session.sandbox is not None else (detail, False)
        reason = f"sandbox of session {session.id} died: {cause}"
        self._bury(session, f"sandbox died: {cause}")
        alert = {"kind": "oom_killed" if oom else "sandbox_died", "reason": cause, "detail": detail, "oom_killed": oom}
        self._emit(session, ev.ALERT, alert)
        self._emit(session, ev.FAILED, {"reason": f"sandbox died: {cause}", "steps": session.steps, "oom_killed": oom})
        if session.sandbox is not None:
            await session.pool.release(session.sandbox, f"sandbox died: {cause}")
        return reason

    # -- reaping and shutdown -----------------------------------------------------------------------
    async def run_reaper(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.reap_interval):
                    await self._stop.wait()
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

    async def close_all(self, reason: str) -> None:
        self._stop.set()
        await asyncio.gather(*(self.close(sid, reason) for sid in list(self.sessions)), return_exceptions=True)

    def list(self, labels: Mapping[str, str], pool: str = "") -> list[Session]:
        return [
            s
            for s in self.sessions.values()
            if (not pool or s.pool.name == pool) and all(s.options.labels.get(k) == v for k, v in labels.items())
        ]


def _window(entry: JournalEntry) -> list[int] | None:
    """Event numbers an earlier life did not journal as emitted: never used, or used in the last
    moment before it died (see journal.py); None when there are none."""
    return [entry.emitted + 1, entry.seq_reserved] if entry.emitted < entry.seq_reserved else None


async def _within(future: asyncio.Future[None], timeout: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await asyncio.shield(future)
