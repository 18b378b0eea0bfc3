"""What the session manager needs of a pool: the narrow interface it is written against.

:class:`rlsandbox.daemon.pool.WarmPool` is the real one; the fast tests use a fake.
"""

from __future__ import annotations

from typing import Protocol

from rlsandbox.daemon.journal import JournalEntry
from rlsandbox.daemon.pool.spec import PoolSpec
from rlsandbox.daemon.sandbox import Sandbox


class SandboxPool(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def spec(self) -> PoolSpec: ...

    async def acquire(self, timeout: float, *, warm: bool | None = None) -> Sandbox:
        """A ready sandbox, leased to the caller (typed errors when none comes in time); ``warm``:
        prefer one that keeps a warm interpreter (clean rooms) or one without (sessions)."""
        ...

    def release(self, sandbox: Sandbox, reason: str = "released", *, reuse: bool = False) -> None:
        """The lease ends at once; behind it the sandbox is destroyed, or (``reuse``, in a
        recycling pool) reset and proven clean for the next episode."""
        ...

    async def adopt(self, entry: JournalEntry, state: str | None) -> Sandbox:
        """Reconnect to the sandbox an earlier life of the daemon leased (``state``: the engine's
        state of its container, None when gone); SandboxDied saying why it cannot be."""
        ...

    async def death_cause(self, sandbox: Sandbox) -> tuple[str, str]:
        """Why a leased sandbox died: (reason, "oom" or "disk" when the episode killed it, else "")."""
        ...
