"""The daemon's background tasks, owned in one place.

Every long-lived loop of the node (each pool's refill, the reaper, the reconciler, the health
watch) runs here under its name. A loop that ends with an exception is a bug that would leave
the node quietly degraded (no reaping, no refills): it is logged with its traceback and
``on_crash`` is called, which stops the daemon so that systemd restarts it whole.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


class Background:
    def __init__(self, on_crash: Callable[[str, BaseException], None]) -> None:
        self._on_crash = on_crash
        self._tasks: dict[asyncio.Task[None], str] = {}
        self._closing = False

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        if self._closing:
            coro.close()
            raise RuntimeError(f"background task {name!r} spawned while the daemon stops")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks[task] = name
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        name = self._tasks.pop(task, task.get_name())
        if task.cancelled() or self._closing:
            return
        error = task.exception()
        if error is None:
            return
        log.critical("background task %s crashed; stopping the node", name, exc_info=error)
        self._on_crash(name, error)

    @property
    def names(self) -> list[str]:
        return sorted(self._tasks.values())

    async def aclose(self, timeout: float = 5.0) -> list[str]:
        """Cancel every task and wait for them (at most ``timeout``); returns the names of tasks
        that did not end in time."""
        self._closing = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if not tasks:
            return []
        _, stuck = await asyncio.wait(tasks, timeout=timeout)
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.warning("background task %s failed while stopping: %r", task.get_name(), task.exception())
        return sorted(t.get_name() for t in stuck)
