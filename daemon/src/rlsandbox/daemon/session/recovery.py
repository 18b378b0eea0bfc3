"""Recovery: the journal of an earlier life of this daemon -> sessions READY again, or tombstones.

A session whose sandbox still answers is READY again under its old id (its files, shells and
processes intact); any other ends with a tombstone and a ``failed`` event saying why. Containers
not adopted are left to the reconciler's sweep.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from rlsandbox.daemon.errors import SandboxDied, SandboxError
from rlsandbox.daemon.grading.task import Task
from rlsandbox.daemon.journal import JournalEntry
from rlsandbox.daemon.model import image_pool_name
from rlsandbox.daemon.session.state import Session, SessionOptions, SessionState

if TYPE_CHECKING:
    from rlsandbox.daemon.session.manager import SessionManager

log = logging.getLogger(__name__)


async def recover(manager: SessionManager, containers: Mapping[str, str], *, concurrency: int = 32) -> tuple[int, int]:
    """Re-adopt what the journal holds; ``containers`` maps this node's container names to their
    state as the engine lists them. Returns (adopted, lost)."""
    journal = manager.recorder.journal
    if journal is None:
        return 0, 0
    entries = await asyncio.to_thread(journal.load)
    slots = asyncio.Semaphore(concurrency)

    async def one(entry: JournalEntry) -> bool:
        async with slots:
            return await _adopt(manager, entry, containers.get(entry.container))

    outcomes = await asyncio.gather(*(one(e) for e in entries))
    adopted = sum(outcomes)
    return adopted, len(outcomes) - adopted


async def _adopt(manager: SessionManager, entry: JournalEntry, state: str | None) -> bool:
    pool = manager.pools.get(entry.pool)
    try:
        if pool is None and manager.image_pool is not None and entry.pool == image_pool_name(entry.image):
            pool = await manager.image_pool(entry.image)  # an image pool of the earlier life: made again
        if pool is None:
            raise SandboxDied(f"its pool {entry.pool!r} is no longer configured")
        task = Task.from_wire(entry.task_spec, entry.task_tar) if entry.task_spec else None
        sandbox = await pool.adopt(entry, state)
    except Exception as e:  # whatever one sandbox does, recovery ends its session and goes on
        detail = e.message if isinstance(e, SandboxError) else f"{type(e).__name__}: {e}"
        reason = f"lost when the daemon restarted: {detail}"
        manager.lost_total += 1
        manager.bury_entry(entry.session, reason, str(entry.options.get("idempotency_key", "")))
        manager.recorder.lost(entry, reason)
        log.warning("session %s: %s", entry.session, reason, extra={"session": entry.session, "pool": entry.pool})
        return False
    options = replace(SessionOptions.from_journal(entry.pool, entry.options, task), task_ref=entry.task_ref)
    session = Session(entry.session, options, pool)
    session.sandbox = sandbox
    session.created_at = entry.created_at
    session.started = time.monotonic() - max(0.0, time.time() - entry.started_at)
    session.steps = entry.steps
    session.event_seq = entry.seq_reserved
    session.transition(SessionState.READY)
    session.touch()  # the restart counts as activity: the idle timeout starts again
    session.settled.set_result(None)
    manager.admit(session)
    await manager.recorder.readopted(session, entry)
    manager.adopted_total += 1
    log.info("session re-adopted on %s", sandbox.name, extra={"session": session.id, "pool": pool.name})
    return True
