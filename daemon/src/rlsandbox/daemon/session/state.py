"""A session's state: pure data and transitions, no I/O.

A session is a small state machine (CREATING -> READY -> CLOSING -> CLOSED, or FAILED); an
illegal transition is a typed error. An ended session leaves a :class:`Tombstone` so that later
calls learn when and why it ended instead of a bare NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlsandbox.daemon.errors import FailedPrecondition, IllegalTransition, SandboxDied
from rlsandbox.daemon.grading.task import Task
from rlsandbox.daemon.model import ExecRequest, ExecResult

if TYPE_CHECKING:
    from rlsandbox.daemon.events import model as ev
    from rlsandbox.daemon.sandbox import Sandbox
    from rlsandbox.daemon.session.ports import SandboxPool

STEP_CACHE = 256  # per session: retried steps older than this many steps are not deduplicated


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


ALLOWED = {
    SessionState.CREATING: {SessionState.READY, SessionState.FAILED, SessionState.CLOSING},
    SessionState.READY: {SessionState.CLOSING, SessionState.FAILED},
    SessionState.CLOSING: {SessionState.CLOSED, SessionState.FAILED},
    SessionState.CLOSED: set(),
    SessionState.FAILED: set(),
}
ENDED = (SessionState.CLOSING, SessionState.CLOSED, SessionState.FAILED)


@dataclass(frozen=True, slots=True)
class SessionOptions:
    pool: str
    image: str = ""  # the pool is the one made on demand for this image (image_pools)
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str = ""
    idle_timeout: float = 600.0
    max_lifetime: float = 6 * 3600.0
    labels: Mapping[str, str] = field(default_factory=dict)
    idempotency_key: str = ""
    acquire_timeout: float = 30.0
    task: Task | None = None
    task_ref: str = ""  # the task's ref (session/prefetch.py), when known: prepared sandboxes are found by it
    forked_from: str = ""  # the session this one is a fork of (session/fork.py)

    def journal_form(self) -> dict[str, object]:
        """What the journal keeps of these options (the task is kept apart)."""
        return {
            "env": dict(self.env),
            "workdir": self.workdir,
            "idle_timeout": self.idle_timeout,
            "max_lifetime": self.max_lifetime,
            "labels": dict(self.labels),
            "idempotency_key": self.idempotency_key,
            "acquire_timeout": self.acquire_timeout,
        }

    @classmethod
    def from_journal(cls, pool: str, o: Mapping[str, object], task: Task | None) -> SessionOptions:
        return cls(
            pool=pool,
            env=dict(o.get("env", {})),  # type: ignore[call-overload]
            workdir=str(o.get("workdir", "")),
            idle_timeout=float(o.get("idle_timeout", 600.0)),  # type: ignore[arg-type]
            max_lifetime=float(o.get("max_lifetime", 6 * 3600.0)),  # type: ignore[arg-type]
            labels=dict(o.get("labels", {})),  # type: ignore[call-overload]
            idempotency_key=str(o.get("idempotency_key", "")),
            acquire_timeout=float(o.get("acquire_timeout", 30.0)),  # type: ignore[arg-type]
            task=task,
        )


@dataclass(frozen=True, slots=True)
class Tombstone:
    session_id: str
    ended_at: float
    reason: str
    idempotency_key: str = ""
    # Set when the sandbox died of the episode's own doing (its processes used up its memory):
    # the ended session, which grading scores reward 0 with this as its limit.
    fault: str = ""
    session: Session | None = None

    def fields(self) -> dict[str, str]:
        """The error fields (trailing metadata) of a call on the ended session: its fault, if any."""
        return {"fault": self.fault} if self.fault else {}


class Session:
    """One episode: its options, its sandbox once leased, its state, counters and event numbers."""

    def __init__(self, session_id: str, options: SessionOptions, pool: SandboxPool) -> None:
        self.id = session_id
        self.options = options
        self.pool = pool
        self.state = SessionState.CREATING
        self.sandbox: Sandbox | None = None
        self.created_at = time.time()
        self.started = self.last_used = time.monotonic()
        self.steps = 0
        # Nothing has run in the sandbox since it was handed out as a new session of its pool or
        # task (set by SessionManager.create; a fork's or a re-adopted session's is never so): it is
        # what another new session of the same options would be, so a fork of it is one.
        self.pristine = False
        self.end_reason = ""
        # Set by the first caller that found the sandbox dead: the engine's account of why (the
        # reason told), which every other caller awaits (SessionManager._fail).
        self.death: asyncio.Future[str] | None = None
        self.in_flight = 0
        # Event numbering, kept by the recorder (session/recorder.py).
        self.event_seq = 0  # events emitted for this session (numbered from 1, no holes)
        self.seq_reserved = 0  # event numbers up to here are reserved in the journal
        self.created_journaled = False  # the journal row holds the ``created`` event (recorder.py)
        self.seq_durable = 0  # ... and up to here durably so: events numbered above it wait
        self.held: list[ev.Event] = []
        self.awaiting_reservation = False
        self.acked_seq = 0  # events up to here are durable (acknowledged by JetStream, or in the outbox)
        self.durable_waiters: list[tuple[int, asyncio.Future[None]]] = []
        # seq -> (what the step ran, its result): a retried step gets the first result.
        self.step_results: collections.OrderedDict[int, tuple[bytes, asyncio.Future[ExecResult]]] = collections.OrderedDict()
        # Resolved when CREATING ends either way, for idempotent retries that arrive meanwhile.
        self.settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def transition(self, new: SessionState) -> None:
        if new not in ALLOWED[self.state]:
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

    def remember_step(self, seq: int, fingerprint: bytes) -> tuple[asyncio.Future[ExecResult], bool]:
        """Register step ``seq``: (a new future to resolve with its result, False), or for a retry
        of the same command (the first run's future, True). FailedPrecondition when ``seq``
        already ran another command."""
        earlier = self.step_results.get(seq)
        if earlier is not None:
            if earlier[0] != fingerprint:
                raise FailedPrecondition(
                    f"step seq {seq} of session {self.id} already ran a different command; a retry must send the "
                    "same command, a new command needs a new seq",
                    session_id=self.id,
                )
            return earlier[1], True
        future: asyncio.Future[ExecResult] = asyncio.get_running_loop().create_future()
        self.step_results[seq] = (fingerprint, future)
        while len(self.step_results) > STEP_CACHE:
            self.step_results.popitem(last=False)
        return future, False

    def forget_step(self, seq: int, error: BaseException) -> None:
        """A failed step may be retried for real: forget it (and wake any concurrent twin)."""
        entry = self.step_results.pop(seq, None)
        failed = entry[1] if entry is not None else None
        if failed is not None and not failed.done():
            if isinstance(error, Exception):
                failed.set_exception(error)
                failed.exception()  # retrieved: a twin may never await it
            else:
                failed.cancel()
