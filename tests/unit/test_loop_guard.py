"""The suite's guard against exceptions nobody retrieved in the event loop really fails a test."""

from __future__ import annotations

import asyncio

import pytest
from helpers import fail_on_loop_exceptions


async def test_a_background_task_that_dies_unseen_fails_the_test() -> None:
    async def boom() -> None:
        raise RuntimeError("a background task died")

    with pytest.raises(AssertionError, match="unhandled exceptions in the event loop"):
        async with fail_on_loop_exceptions():
            task = asyncio.get_running_loop().create_task(boom())
            await asyncio.sleep(0.01)
            del task  # dropped without anyone retrieving its exception


async def test_a_failing_callback_fails_the_test() -> None:
    def bad() -> None:
        raise ValueError("callback failed")

    with pytest.raises(AssertionError, match=r"callback failed|unhandled"):
        async with fail_on_loop_exceptions():
            asyncio.get_running_loop().call_soon(bad)
            await asyncio.sleep(0.01)


async def test_a_clean_body_passes() -> None:
    async with fail_on_loop_exceptions():
        await asyncio.gather(asyncio.sleep(0), asyncio.sleep(0))
