"""Whose OOM kill it was: the kernel's log tells a kill at a sandbox's own memory limit from a
kill because the whole host ran out of memory.

The engine's ``OOMKilled`` (and cgroup v2's ``oom_kill`` count it comes from) is true for both:
a process of the container was killed by *an* OOM killer. Only the first is the episode's doing
(reward 0, never masked); the second is the node's, and grading it 0 would teach a policy that
its correct answer was wrong, because a neighbour or the node used the memory. The kernel writes
one summary line per OOM kill to its log::

    oom-kill:constraint=CONSTRAINT_MEMCG,...,oom_memcg=/docker/<id>,task_memcg=/docker/<id>,task=tr,pid=1,uid=0
    oom-kill:constraint=CONSTRAINT_NONE,...,task_memcg=/system.slice/docker-<id>.scope,task=python3,pid=2,uid=0

``CONSTRAINT_MEMCG`` is a cgroup's limit; ``CONSTRAINT_NONE`` (and the cpuset and mempolicy
ones) is the host's memory. The watch follows /dev/kmsg from the moment it starts (root only;
without it the engine's flag is all there is, as before) and remembers, per container, the host
OOM kills it saw, bounded.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import logging
import os
import re
import time

log = logging.getLogger(__name__)
KMSG = "/dev/kmsg"
RECENT = 30.0  # seconds: a death judged this soon after a host OOM kill of the sandbox is put down to it
REMEMBERED = 4096  # containers whose host OOM kills are kept (the oldest forgotten first)
_SUMMARY = re.compile(r"oom-kill:constraint=(?P<constraint>CONSTRAINT_\w+)\b.*?,task_memcg=(?P<memcg>[^,]*)")
_CONTAINER = re.compile(r"(?<![0-9a-f])([0-9a-f]{64})(?![0-9a-f])")


def parse_oom_kill(line: str) -> tuple[str, bool] | None:
    """(container id, whether the host's memory was out) of a kernel OOM-kill summary line whose
    victim was in a container's cgroup; None for any other line."""
    if "oom-kill:" not in line:  # nearly every line: no regex
        return None
    m = _SUMMARY.search(line)
    if m is None:
        return None
    container = _CONTAINER.search(m.group("memcg"))
    if container is None:
        return None
    return container.group(1), m.group("constraint") != "CONSTRAINT_MEMCG"


class OomWatch:
    """Host OOM kills per container, from the kernel's log (see the module's doc)."""

    def __init__(self, path: str = KMSG) -> None:
        self.path = path
        self.host_kills: collections.OrderedDict[str, list[float]] = collections.OrderedDict()
        self.host_kills_total = 0
        self._fd: int | None = None

    @property
    def watching(self) -> bool:
        return self._fd is not None

    def start(self) -> None:
        """Follow the kernel's log from now on (nothing older); without it, log why and go on."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            log.warning(
                "cannot read the kernel log %s (%s): a host-wide OOM kill will count as the episode's doing", self.path, e
            )
            return
        with contextlib.suppress(OSError):  # a pipe has no past to skip
            os.lseek(fd, 0, os.SEEK_END)
        self._fd = fd
        asyncio.get_running_loop().add_reader(fd, self.drain)

    def stop(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None

    def drain(self) -> None:
        """Take in what the kernel logged since the last look (called when the log is readable,
        and before a death is judged, so that its OOM line is not still unread)."""
        while self._fd is not None:
            try:
                record = os.read(self._fd, 8192)  # /dev/kmsg: one record per read
            except BlockingIOError:
                return
            except OSError as e:  # EPIPE: records overwritten before they were read; go on
                if e.errno == errno.EPIPE:
                    continue
                log.warning("kernel log %s: %s; no longer watching for host OOM kills", self.path, e)
                self.stop()
                return
            if not record:
                return
            self.feed(record.decode("utf-8", "replace"))

    def feed(self, record: str) -> None:
        """One record of the kernel's log (``<prefix>;<message>``, or a bare message)."""
        found = parse_oom_kill(record.split(";", 1)[-1])
        if found is None or not found[1]:
            return
        container, _ = found
        self.host_kills_total += 1
        log.warning(
            "the host ran out of memory: the kernel's OOM killer killed a process of container %s; "
            "its sandboxes use more memory than it has: lower the pools' max_total or memory_mb",
            container[:12],
        )
        kills = self.host_kills.pop(container, [])
        kills.append(time.monotonic())
        self.host_kills[container] = kills[-16:]
        while len(self.host_kills) > REMEMBERED:
            self.host_kills.popitem(last=False)

    def host_killed(self, container_id: str | None, since: float = 0.0) -> bool:
        """Whether the host's OOM killer killed a process of this container at or after ``since``
        (time.monotonic()); what the kernel logged until now is read first."""
        if not container_id:
            return False
        self.drain()
        return any(t >= since for t in self.host_kills.get(container_id, ()))
