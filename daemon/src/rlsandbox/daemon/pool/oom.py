"""Whose OOM kill it was: the kernel's log tells a kill at a sandbox's own memory limit from a
kill because the whole host ran out of memory.

The engine's ``OOMKilled`` (and cgroup v2's ``oom_kill`` count it comes from) is true for both:
a process of the container was killed by *an* OOM killer. Only the first is the episode's doing
(reward 0, never masked); the second is the node's, and grading it 0 would teach a policy that
its correct answer was wrong, because a neighbour or the node used the memory. The kernel writes
one summary line per OOM kill to its log::

    oom-kill:constraint=CONSTRAINT_MEMCG,...,oom_memcg=/docker/<id>,task_memcg=/docker/<id>,task=tr,pid=1,uid=0
    oom-kill:constraint=CONSTRAINT_NONE,...,task_memcg=/system.slice/docker-<id>.scope,task=python3,pid=2,uid=0

``CONSTRAINT_MEMCG`` is a cgroup's limit: the sandbox's own when ``oom_memcg`` is its container's
cgroup, the node's when it is the parent of every sandbox (runtime/cgroups.py: all sandboxes
together at the memory they may hold); ``CONSTRAINT_NONE`` (and the cpuset and mempolicy ones) is
the host's memory. Only the first is the sandbox's doing. The watch follows /dev/kmsg from the moment it starts (root only;
without it the engine's flag is all there is, as before) and remembers, per container, the OOM
kills it saw and which kind each was, bounded. A death is the node's only when the sandbox's last
OOM kill was the host's: an episode that fills its own memory after a host-wide kill hit it
(to be masked instead of scored) is still judged by its own limit's kill.
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
REMEMBERED = 4096  # containers whose OOM kills are kept (the oldest forgotten first)
_SUMMARY = re.compile(
    r"oom-kill:constraint=(?P<constraint>CONSTRAINT_\w+)\b(?:.*?,oom_memcg=(?P<oom>[^,]*))?.*?,task_memcg=(?P<memcg>[^,]*)"
)
_CONTAINER = re.compile(r"(?<![0-9a-f])([0-9a-f]{64})(?![0-9a-f])")


def parse_oom_kill(line: str) -> tuple[str, bool] | None:
    """(container id, whether memory beyond the container's own limit was out: the host's, or
    the sandboxes' parent's) of a kernel OOM-kill summary line whose victim was in a container's
    cgroup; None for any other line. Only a message that *starts* so
    counts: some kernel messages quote what a sandbox chose (a path it executed), and one could
    otherwise carry a forged summary of a host-wide kill of its own container."""
    if not line.startswith("oom-kill:"):  # nearly every line: no regex
        return None
    m = _SUMMARY.match(line)
    if m is None:
        return None
    container = _CONTAINER.search(m.group("memcg"))
    if container is None:
        return None
    own_limit = m.group("constraint") == "CONSTRAINT_MEMCG" and container.group(1) in (m.group("oom") or container.group(1))
    return container.group(1), not own_limit


class OomWatch:
    """Host OOM kills per container, from the kernel's log (see the module's doc)."""

    def __init__(self, path: str = KMSG) -> None:
        self.path = path
        # Container id -> its OOM kills: (time.monotonic(), whether the host's memory was out).
        self.kills: collections.OrderedDict[str, list[tuple[float, bool]]] = collections.OrderedDict()
        self.host_kills_total = 0
        self._fd: int | None = None

    @property
    def watching(self) -> bool:
        return self._fd is not None

    def start(self) -> None:
        """Follow the kernel's log from now on (nothing older); without it, log why and go on."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
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
        if found is None:
            return
        container, host = found
        if host:
            self.host_kills_total += 1
            log.warning(
                "the host ran out of memory for sandboxes: the kernel's OOM killer killed a process of container %s; "
                "its sandboxes use more memory than it has for them: lower the pools' max_total or memory_mb",
                container[:12],
            )
        kills = self.kills.pop(container, [])
        kills.append((time.monotonic(), host))
        self.kills[container] = kills[-16:]
        while len(self.kills) > REMEMBERED:
            self.kills.popitem(last=False)

    def host_killed(self, container_id: str | None, since: float = 0.0) -> bool:
        """Whether the host's OOM killer killed a process of this container at or after ``since``
        (time.monotonic()); what the kernel logged until now is read first."""
        return any(host for _, host in self._since(container_id, since))

    def died_of_host(self, container_id: str | None, since: float) -> bool:
        """Whether the last OOM kill of this container at or after ``since`` was the host's: a kill
        at the container's own limit after a host-wide one (the episode filling its memory once
        the host had killed something of it) is the episode's doing, not the node's."""
        kills = self._since(container_id, since)
        return bool(kills) and kills[-1][1]

    def _since(self, container_id: str | None, since: float) -> list[tuple[float, bool]]:
        if not container_id:
            return []
        self.drain()
        return [k for k in self.kills.get(container_id, ()) if k[0] >= since]
