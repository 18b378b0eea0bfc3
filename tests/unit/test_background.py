"""The daemon's background tasks: a crashed loop is reported (the daemon stops on it), a
cancelled one is not, and closing cancels and awaits them all."""

from __future__ import annotations

import asyncio

from rlsandbox.daemon.background import Background


async def test_a_crashed_loop_is_reported_and_close_cancels_the_rest() -> None:
    crashes: list[tuple[str, str]] = []
    group = Background(lambda name, e: crashes.append((name, str(e))))

    async def forever() -> None:
        await asyncio.Event().wait()

    async def crash() -> None:
        await asyncio.sleep(0)
        raise ValueError("reaper bug")

    group.spawn(forever(), "pool-a")
    group.spawn(crash(), "session-reaper")
    await asyncio.sleep(0.01)
    assert crashes == [("session-reaper", "reaper bug")]
    assert group.names == ["pool-a"]
    assert await group.aclose(timeout=1) == []
    assert group.names == [] and len(crashes) == 1  # cancellation at close is not a crash


async def test_close_reports_tasks_that_do_not_stop() -> None:
    group = Background(lambda name, e: None)
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    task = group.spawn(stubborn(), "stubborn")
    await asyncio.sleep(0)  # running, inside its loop
    assert await group.aclose(timeout=0.05) == ["stubborn"]
    release.set()
    await task
