"""Task-warm sandboxes (session/prefetch.py) over a fake pool: targets kept, hand-outs refilled,
one node-wide budget, expiry back to the pool, broken tasks reported and no longer prepared."""

from __future__ import annotations

import asyncio
import json

import pytest
from fakes import FakePool
from rlsandbox.daemon.errors import NotFound
from rlsandbox.daemon.grading.task import Task
from rlsandbox.daemon.sandbox import Sandbox
from rlsandbox.daemon.session.prefetch import REFILL_DELAY, Prefetcher, task_ref


def task(tid: str, pool: str = "default") -> Task:
    spec = {"id": tid, "pool": pool, "evaluation": {"test_command": "true", "report_format": "exit-code"}}
    return Task.from_wire(json.dumps(spec))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_target_is_kept_and_refilled_as_sandboxes_are_taken() -> None:
    pool = FakePool()
    prepared: list[tuple[str, str]] = []

    async def prepare(sb: Sandbox, t: Task) -> None:
        prepared.append((sb.name, t.id))

    pf = Prefetcher({"default": pool}, prepare, budget=10)
    t = task("t1")
    state = pf.prefetch(t, 3)
    assert state.ref == task_ref(t) and state.target == 3 and state.preparing == 3
    await settle()
    assert pf.state(state.ref).ready == 3 and len(prepared) == 3
    got = pf.take(state.ref)
    assert got is not None and (got.name, "t1") in prepared
    more = [pf.take(state.ref), pf.take(state.ref)]  # a burst: its answers come before the refills
    await settle()
    assert pf.state(state.ref).ready == 0 and pf.state(state.ref).preparing == 0 and None not in more
    await asyncio.sleep(REFILL_DELAY * 1.5)
    await settle()
    assert pf.state(state.ref).ready == 3 and pf.handed_out_total == 3  # replaced, all three
    assert len(prepared) == 6
    assert pf.known(state.ref) is t
    with pytest.raises(NotFound, match="send the task itself"):
        pf.known("nope@0")
    await pf.close()
    assert len(pool.leased) == 3  # only those handed out are still leased


async def test_the_budget_is_shared_and_expiry_returns_sandboxes_for_recycling() -> None:
    pool = FakePool()
    pf = Prefetcher({"default": pool}, lambda sb, t: asyncio.sleep(0), budget=4)
    a = pf.prefetch(task("a"), 3, ttl=0.05)
    b = pf.prefetch(task("b"), 3, ttl=60)
    assert (a.target, b.target) == (3, 1)  # what the budget leaves
    await settle()
    assert pf.prepared == 4
    await asyncio.sleep(0.06)
    pf.expire()
    assert pf.state(a.ref).target == 0 and pf.prepared == 1 and pf.expired_total == 3
    assert pool.reused.count(True) == 3  # back to the pool, recyclable
    await pf.close()


async def test_a_broken_task_is_reported_and_no_longer_prepared() -> None:
    pool = FakePool()
    tries = 0

    async def broken(sb: Sandbox, t: Task) -> None:
        nonlocal tries
        tries += 1
        raise OSError("setup exited with 2")

    pf = Prefetcher({"default": pool}, broken, budget=10)
    ref = pf.prefetch(task("bad"), 2).ref
    for _ in range(4):
        await settle()
        pf.take(ref)  # asking again would refill, were it not broken
    await settle()
    state = pf.state(ref)
    assert state.ready == 0 and "setup exited with 2" in state.last_error
    # Two rounds of two: the second started after 2 failures (< MAX_FAILURES), then no more.
    assert tries == 4 and pf.state(ref).preparing == 0
    assert not pool.leased and all(reason == "prefetch failed" for _, reason in pool.released)
    await pf.close()


async def test_an_unknown_pool_is_a_clear_error() -> None:
    pf = Prefetcher({"default": FakePool()}, lambda sb, t: asyncio.sleep(0))
    with pytest.raises(NotFound, match="pool 'gpu' is not configured"):
        pf.prefetch(task("t", pool="gpu"), 1)


async def test_known_tasks_are_bounded_in_bytes_and_warm_ones_stay() -> None:
    """A trainer naming many tasks must not fill the node's memory with their workspaces, and
    tasks kept warm are never forgotten (nor can they make forgetting loop forever)."""
    pool = FakePool()
    pf = Prefetcher({"default": pool}, lambda sb, t: asyncio.sleep(0), budget=1)
    pf.known_bytes_limit = 250

    def bundle(tid: str) -> Task:
        spec = {"id": tid, "pool": "default", "workspace": {"source": "bundle", "path": "/w"},
                "evaluation": {"test_command": "true", "report_format": "exit-code"}}  # fmt: skip
        from rlsandbox.daemon.grading.task import tar_files

        return Task.from_wire(json.dumps(spec), tar_files({"f": "x" * 10}))

    size = len(bundle("x").workspace_tar)
    pf.known_bytes_limit = 2 * size
    warm = pf.prefetch(bundle("warm"), 1).ref
    refs = [pf.prefetch(bundle(f"t{i}"), 0).ref for i in range(5)]
    assert pf.known(warm).id == "warm" and pf.known(refs[-1]).id == "t4"
    with pytest.raises(NotFound):
        pf.known(refs[0])
    assert pf._known_bytes <= 2 * size
    await pf.close()
