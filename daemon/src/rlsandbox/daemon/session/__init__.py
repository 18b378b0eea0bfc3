"""Episode sessions: a sandbox leased from a pool, multi-turn state, and its lifecycle.

- ``state``: the session, its options and transitions (pure, no I/O);
- ``manager``: every operation on sessions (create, exec, files, evaluate, close, list, reap);
- ``recorder``: the one place a lifecycle change becomes an event and a journal row;
- ``recovery``: the journal of an earlier life -> sessions again, or tombstones;
- ``ports``: the narrow interface of a pool the manager is written against.
"""

from rlsandbox.daemon.session.manager import SessionManager
from rlsandbox.daemon.session.ports import SandboxPool
from rlsandbox.daemon.session.state import Session, SessionOptions, SessionState, Tombstone

__all__ = ["SandboxPool", "Session", "SessionManager", "SessionOptions", "SessionState", "Tombstone"]
