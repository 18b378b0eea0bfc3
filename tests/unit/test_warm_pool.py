"""The warm pool's own logic over a fake factory (no Docker): hand-outs, refills within
max_total, release behind the caller, and verified recycling (reset proven -> ready again;
refused, failed or worn out -> destroyed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from fakes import FakeChannel
from rlsandbox.daemon.errors import ResourceExhausted, SandboxDied
from rlsandbox.daemon.model import ContainerSpec
from rlsandbox.daemon.pool import CreateLimiter, PoolSpec, WarmPool
from rlsandbox.daemon.sandbox import Sandbox


class FakeFactory:
    def __init__(self) -> None:
        self.made = 0
        self.destroyed: list[tuple[str, str]] = []
        self.destroy_gate: asyncio.Event | None = None
        self.reset_answer: dict[str, object] = {"ok": True}
        self.resets = 0

    async def create(self, spec: PoolSpec, *, session: str = "") -> Sandbox:
        self.made += 1
        return Sandbox(
            container_id=f"id{self.made}", name=f"sb{self.made}", pool=spec.name, channel=FakeChannel(lambda r: ""),  # type: ignore[arg-type]
            mode="agent", runtime="runc", image="img", transport="dial",
        )  # fmt: skip

    async def destroy(self, sandbox: Sandbox, reason: str = "released") -> None:
        if self.destroy_gate is not None:
            await self.destroy_gate.wait()
        self.destroyed.append((sandbox.name, reason))

    async def recycle(self, sandbox: Sandbox, spec: PoolSpec) -> None:
        self.resets += 1
        if not self.reset_answer.get("ok"):
            raise SandboxDied(f"reset refused: {self.reset_answer.get('why')}")


async def settle(pool: WarmPool, ready: int) -> None:
    for _ in range(500):
        if pool.stats().ready >= ready and pool.stats().creating == 0:
            return
        await asyncio.sleep(0.002)
    raise AssertionError(f"pool did not reach {ready} ready: {pool.stats()}")


@pytest.fixture
async def made() -> AsyncIterator[tuple[WarmPool, FakeFactory]]:
    factory = FakeFactory()
    spec = PoolSpec(name="p", container=ContainerSpec(image="img"), min_ready=2, max_total=3, recycle=True, max_reuses=2)
    pool = WarmPool(spec, factory, limiter=CreateLimiter(4))  # type: ignore[arg-type]
    runner = asyncio.create_task(pool.run())
    await settle(pool, 2)
    yield pool, factory
    factory.destroy_gate = None
    await pool.close(timeout=5)
    await runner


async def test_release_returns_at_once_and_dying_sandboxes_count_against_max_total(made: tuple[WarmPool, FakeFactory]) -> None:
    pool, factory = made
    factory.destroy_gate = asyncio.Event()
    a, b = await pool.acquire(1), await pool.acquire(1)
    pool.release(a, "episode over")  # not reusable: destroyed, and the caller does not wait for it
    pool.release(b, "episode over")
    assert pool.stats().destroying == 2 and not factory.destroyed
    await asyncio.sleep(0.05)
    # 3 allowed in all: 2 on their way out leave room for 1 more, whatever min_ready wants.
    assert pool.stats().ready + pool.stats().creating == 1
    factory.destroy_gate.set()
    await settle(pool, 2)
    assert sorted(factory.destroyed) == [("sb1", "episode over"), ("sb2", "episode over")]
    assert pool.stats().destroying == 0 and pool.stats().destroyed_total == 2


async def test_a_proven_reset_makes_the_sandbox_ready_again_until_max_reuses(made: tuple[WarmPool, FakeFactory]) -> None:
    pool, factory = made
    first = await pool.acquire(1)
    for round_ in (1, 2):
        pool.release(first, "closed by client", reuse=True)
        await asyncio.sleep(0.01)
        assert first.reuses == round_ and pool.stats().recycled_total == round_
        while (got := await pool.acquire(1)) is not first:  # back in line: it comes round again
            pool.release(got, "not this one", reuse=False)
        assert factory.resets == round_
    pool.release(first, "closed by client", reuse=True)  # its third episode would pass max_reuses
    await asyncio.sleep(0.01)
    assert factory.resets == 2 and (first.name, "closed by client") in factory.destroyed


async def test_a_refused_reset_destroys_the_sandbox(made: tuple[WarmPool, FakeFactory]) -> None:
    pool, factory = made
    factory.reset_answer = {"ok": False, "why": "2 processes survived SIGKILL"}
    sb = await pool.acquire(1)
    pool.release(sb, "closed by client", reuse=True)
    await asyncio.sleep(0.01)
    assert (sb.name, "recycling failed: reset refused: 2 processes survived SIGKILL") in factory.destroyed
    assert pool.stats().recycle_failures_total == 1 and pool.stats().recycled_total == 0


async def test_a_dead_sandbox_is_never_recycled(made: tuple[WarmPool, FakeFactory]) -> None:
    pool, factory = made
    sb = await pool.acquire(1)
    sb.channel.die("container exited")  # type: ignore[attr-defined]
    pool.release(sb, "closed by client", reuse=True)
    await asyncio.sleep(0.01)
    assert factory.resets == 0 and (sb.name, "closed by client") in factory.destroyed


async def test_a_sandbox_without_an_agent_is_destroyed_not_recycled(made: tuple[WarmPool, FakeFactory]) -> None:
    """A recycling pool with agent = "auto" whose image has no python3 runs its sandboxes over
    Engine API exec: nothing can prove them clean, so they go."""
    pool, factory = made
    sb = await pool.acquire(1)
    sb.mode = "exec"
    pool.release(sb, "closed by client", reuse=True)
    await asyncio.sleep(0.01)
    assert factory.resets == 0 and (sb.name, "closed by client") in factory.destroyed
    assert pool.stats().recycle_failures_total == 0


async def test_a_hand_off_to_a_waiter_never_creates_past_max_total() -> None:
    """A sandbox handed to a waiting caller is leased at once: before, the moment between the
    hand-off and the caller waking up let a refill see room that was not there."""
    factory = FakeFactory()
    spec = PoolSpec(name="one", container=ContainerSpec(image="img"), min_ready=1, max_total=1)
    pool = WarmPool(spec, factory, limiter=CreateLimiter(4))  # type: ignore[arg-type]
    runner = asyncio.create_task(pool.run())
    try:
        sb = await pool.acquire(1)  # waits: nothing was ready yet
        await asyncio.sleep(0.02)
        assert factory.made == 1 and pool.stats().creating == 0 and pool.stats().in_use == 1
        pool.release(sb, "done")
    finally:
        await pool.close(timeout=5)
        await runner


async def test_refills_wait_for_a_pause_in_hand_outs_but_never_a_waiter() -> None:
    """A burst of hand-outs is answered before refills start (they would share the loop and the
    cores with it); a caller waiting for a sandbox gets one made at once; steady hand-outs delay
    refills REFILL_MAX_DELAY at most."""
    from rlsandbox.daemon.pool.warm_pool import REFILL_MAX_DELAY, REFILL_QUIET

    factory = FakeFactory()
    spec = PoolSpec(name="p", container=ContainerSpec(image="img"), min_ready=4, max_total=400)
    pool = WarmPool(spec, factory, limiter=CreateLimiter(4))  # type: ignore[arg-type]
    runner = asyncio.create_task(pool.run())
    try:
        await settle(pool, 4)
        burst = [await pool.acquire(1) for _ in range(3)]
        for _ in range(20):  # turns of the loop: enough for refills to start, were they not held
            await asyncio.sleep(0)
        assert factory.made == 4, "refills started under the burst"
        await asyncio.sleep(REFILL_QUIET * 1.5)
        await settle(pool, 4)
        assert factory.made == 7  # the pause came: refilled
        while pool.stats().ready:  # drain it: the next caller waits, and is served at once
            burst.append(await pool.acquire(1))
        started = asyncio.get_running_loop().time()
        burst.append(await pool.acquire(1))
        assert asyncio.get_running_loop().time() - started < REFILL_QUIET
        pool.set_min_ready(150)
        await settle(pool, 150)
        await asyncio.sleep(REFILL_QUIET * 1.5)
        made, started = factory.made, asyncio.get_running_loop().time()
        while factory.made == made:  # hand-outs that never pause: refills come anyway
            if pool.stats().ready:
                burst.append(await pool.acquire(1))
            await asyncio.sleep(REFILL_QUIET / 5)
        assert asyncio.get_running_loop().time() - started <= REFILL_MAX_DELAY + 0.2
        for sb in burst:
            pool.release(sb)
    finally:
        await pool.close(timeout=5)
        await runner


async def test_clean_rooms_prefer_sandboxes_with_a_warm_interpreter_and_sessions_those_without(
    made: tuple[WarmPool, FakeFactory],
) -> None:
    """The warm interpreters stay where the grades are: a room takes a warm sandbox over an older
    cold one, a session a cold one over an older warm one, anyone else the oldest."""
    pool, _ = made
    older, newer = list(pool._ready)
    newer.warm = True
    assert await pool.acquire(1.0, warm=True) is newer
    await settle(pool, 2)
    older.warm = True
    got = await pool.acquire(1.0, warm=False)
    assert got is not older and not got.warm
    assert await pool.acquire(1.0) is older  # no preference: the oldest


async def test_clean_rooms_go_past_max_total_by_the_headroom_and_come_before_sessions() -> None:
    """Every sandbox held by a session that waits for its clean room: without headroom nothing comes
    back before the acquire timeout (found running 8 harbor trials at once on a pool of 8)."""
    factory = FakeFactory()
    spec = PoolSpec(name="p", container=ContainerSpec(image="img"), min_ready=0, max_total=2, room_headroom=1)
    pool = WarmPool(spec, factory, limiter=CreateLimiter(4))  # type: ignore[arg-type]
    runner = asyncio.create_task(pool.run())
    try:
        sessions = [await pool.acquire(1, warm=False), await pool.acquire(1, warm=False)]
        late_session = asyncio.create_task(pool.acquire(2, warm=False))  # in line before the rooms
        await asyncio.sleep(0.01)
        first_room = await pool.acquire(1, warm=True)  # made past max_total: the headroom of 1
        assert factory.made == 3 and pool.stats().in_use == 3
        second_room = asyncio.create_task(pool.acquire(2, warm=True))
        await asyncio.sleep(0.05)
        assert not second_room.done() and factory.made == 3  # the headroom is used up
        pool.release(first_room, "graded")
        pool.release(sessions[0], "episode over")
        await asyncio.sleep(0.05)
        # What came back went to the room first, although the session waited longer.
        assert second_room.done() and not late_session.done()
        pool.release(await second_room, "graded")
        pool.release(sessions[1], "episode over")
        pool.release(await late_session, "episode over")
    finally:
        await pool.close(timeout=5)
        await runner


async def test_without_headroom_a_full_pools_rooms_wait_until_the_timeout() -> None:
    factory = FakeFactory()
    spec = PoolSpec(name="p", container=ContainerSpec(image="img"), min_ready=0, max_total=1, room_headroom=0)
    pool = WarmPool(spec, factory, limiter=CreateLimiter(4))  # type: ignore[arg-type]
    runner = asyncio.create_task(pool.run())
    try:
        held = await pool.acquire(1, warm=False)
        with pytest.raises(ResourceExhausted, match="max 1"):
            await pool.acquire(0.1, warm=True)
        assert factory.made == 1
        pool.release(held)
    finally:
        await pool.close(timeout=5)
        await runner


async def test_a_room_made_past_max_total_is_destroyed_not_recycled() -> None:
    """Recycled, the room past max_total would be ready for the next session: the pool would then
    hold more sessions than max_total."""
    factory = FakeFactory()
    spec = PoolSpec(name="p", container=ContainerSpec(image="img"), min_ready=0, max_total=1, room_headroom=1, recycle=True)
    pool = WarmPool(spec, factory, limiter=CreateLimiter(4))  # type: ignore[arg-type]
    runner = asyncio.create_task(pool.run())
    try:
        session = await pool.acquire(1, warm=False)
        room = await pool.acquire(1, warm=True)
        pool.release(room, "graded", reuse=True)
        await asyncio.sleep(0.05)
        assert factory.resets == 0 and [name for name, _ in factory.destroyed] == [room.name]
        pool.release(session, "episode over", reuse=True)  # within max_total: recycled
        await settle(pool, 1)
        assert factory.resets == 1 and pool.stats().ready == 1 and factory.made == 2
    finally:
        await pool.close(timeout=5)
        await runner
