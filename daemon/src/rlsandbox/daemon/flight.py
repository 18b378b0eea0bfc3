"""One computation per key at a time: concurrent callers of the same key share its outcome (an
image pool being made, a task bundle being fetched), and nobody waits on a cancelled one forever."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class SingleFlight(Generic[K, V]):
    def __init__(self) -> None:
        self._inflight: dict[K, asyncio.Future[V]] = {}

    async def run(self, key: K, make: Callable[[], Awaitable[V]], cancelled: Callable[[], Exception]) -> V:
        """``make()``'s result for ``key``, made once however many callers ask meanwhile; if the
        maker is cancelled, the others get ``cancelled()``."""
        waiting = self._inflight.get(key)
        if waiting is not None:
            return await asyncio.shield(waiting)
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            value = await make()
        except BaseException as e:
            future.set_exception(e if isinstance(e, Exception) else cancelled())
            future.exception()  # retrieved: there may be nobody else waiting
            raise
        finally:
            self._inflight.pop(key, None)
        future.set_result(value)
        return value
