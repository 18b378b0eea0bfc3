"""Each call's deadline and retry rule, in one table shared by the async and the blocking client.

A deadline is the client's ``timeout`` plus the time the call may legitimately take on the node
(a command's own timeout, an acquire wait, a task's setup, grading). A call is retried on
UNAVAILABLE only when repeating it cannot do anything twice: reads, closes, grading (it does not
change the agent's sandbox), a CreateSession with an idempotency key, steps with a ``seq``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlsandbox.client._errors import SandboxRPCError, UnavailableError

RETRY_ATTEMPTS = 4
COMMAND_TIMEOUT = 300.0  # seconds the daemon gives a command that names no timeout
TASK_SETUP = 600.0  # seconds a session from a task may spend copying its workspace and running setup
GRADE_TIMEOUT = 900.0  # seconds a grade may take when the caller names no timeout


@dataclass(frozen=True)
class CallPolicy:
    extra: Callable[[Any], float]  # request -> seconds on top of the client's timeout
    retry: Callable[[Any], bool]  # request -> safe to repeat on UNAVAILABLE


def _always(_: Any) -> bool:
    return True


def _none(_: Any) -> float:
    return 0.0


def _command(r: Any) -> float:
    return float(r.timeout or COMMAND_TIMEOUT)


POLICIES: dict[str, CallPolicy] = {
    "CreateSession": CallPolicy(
        lambda r: r.acquire_timeout + (TASK_SETUP if r.HasField("task") else 0.0), lambda r: bool(r.idempotency_key)
    ),
    "Exec": CallPolicy(_command, lambda r: r.seq > 0),
    "ExecStream": CallPolicy(_command, lambda r: False),  # output already yielded cannot be taken back
    "ExecBatch": CallPolicy(
        lambda r: max((_command(x) for x in r.requests), default=0.0), lambda r: all(x.seq > 0 for x in r.requests)
    ),
    "WriteFiles": CallPolicy(_none, _always),  # the same bytes to the same paths
    "ReadFiles": CallPolicy(_none, _always),
    "CloseSession": CallPolicy(_none, _always),
    "GetSession": CallPolicy(_none, _always),
    "ListSessions": CallPolicy(_none, _always),
    "Evaluate": CallPolicy(lambda r: r.timeout or GRADE_TIMEOUT, _always),
    "GetNodeStatus": CallPolicy(_none, _always),
    "Prefetch": CallPolicy(_none, _always),  # sets a target: asking twice is asking once
    "Fork": CallPolicy(lambda r: FORK_EXTRA, lambda r: False),  # a retry would fork twice
    "GetCluster": CallPolicy(_none, _always),
    "Drain": CallPolicy(_none, _always),  # sets a state: asking twice is asking once
}


FORK_EXTRA = 60.0  # seconds on top of the default deadline: the forks may wait for sandboxes


def deadline(method: str, request: Any, timeout: float) -> float:
    return timeout + POLICIES[method].extra(request)


def retry_after(method: str, request: Any, error: SandboxRPCError, attempt: int) -> float | None:
    """Seconds to wait before attempt ``attempt + 1``, or None: raise ``error``."""
    if not isinstance(error, UnavailableError) or attempt >= RETRY_ATTEMPTS or not POLICIES[method].retry(request):
        return None
    return min(2.0, 0.1 * 2**attempt) * (0.5 + random.random())
