"""Whose OOM kill it was (pool/oom.py): the kernel's summary line of each OOM kill, as this
machine's kernel wrote it for a container at its memory limit, and in the same format for a kill
because the host ran out of memory (which cannot be produced safely on a test machine)."""

from __future__ import annotations

import os
from pathlib import Path

from rlsandbox.daemon.pool.oom import OomWatch, parse_oom_kill

CID = "f953a17e4a411f74273fc22114965780f41df47d37b493182ec1e4f9654c8aec"
OTHER = "0" * 63 + "1"
# Recorded on this machine: `docker run -m 32m ...` filling its memory (cgroup v2, cgroupfs driver).
AT_ITS_LIMIT = (
    f"6,52311,71150738472,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset={CID},mems_allowed=0,"
    f"oom_memcg=/docker/{CID},task_memcg=/docker/{CID},task=tr,pid=21849,uid=0"
)
# The host's memory ran out (no oom_memcg), the systemd cgroup driver's path.
HOST_WIDE = (
    "6,52400,71200000000,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,"
    f"global_oom,task_memcg=/system.slice/docker-{CID}.scope,task=python3,pid=4242,uid=1000"
)


def test_a_kill_at_the_containers_own_limit_is_told_from_a_host_wide_one() -> None:
    assert parse_oom_kill(AT_ITS_LIMIT.split(";", 1)[1]) == (CID, False)
    assert parse_oom_kill(HOST_WIDE.split(";", 1)[1]) == (CID, True)
    assert parse_oom_kill("Memory cgroup out of memory: Killed process 21849 (tr)") is None
    assert parse_oom_kill("oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),task_memcg=/user.slice,task=x,pid=1,uid=0") is None


def test_a_kill_at_the_sandboxes_parent_cgroups_limit_is_the_nodes() -> None:
    """All sandboxes together at the memory their parent cgroup may hold (runtime/cgroups.py): a
    cgroup's limit, but not the victim's own."""
    parent = f"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset={CID},mems_allowed=0,oom_memcg=/rlsandbox,"
    assert parse_oom_kill(parent + f"task_memcg=/rlsandbox/{CID},task=python3,pid=7,uid=1000") == (CID, True)
    own = f"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset={CID},mems_allowed=0,oom_memcg=/rlsandbox/{CID},"
    assert parse_oom_kill(own + f"task_memcg=/rlsandbox/{CID},task=python3,pid=7,uid=1000") == (CID, False)
    # A task name the sandbox chose (15 bytes at most) cannot stand in for the real oom_memcg.
    forged = f"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset={CID},mems_allowed=0,oom_memcg=/docker/{CID},"
    assert parse_oom_kill(forged + f"task_memcg=/docker/{CID},task=,oom_memcg=/x,pid=7,uid=0") == (CID, False)


def test_the_watch_remembers_host_wide_kills_per_container_and_since_when() -> None:
    watch = OomWatch()
    watch.feed(AT_ITS_LIMIT)
    assert not watch.host_killed(CID) and watch.host_kills_total == 0  # the episode's own limit
    watch.feed(HOST_WIDE)
    assert watch.host_killed(CID) and not watch.host_killed(OTHER) and not watch.host_killed(None)
    assert not watch.host_killed(CID, since=float("inf"))  # not in a window that began after it


async def test_the_watch_follows_the_log_from_its_start_only(tmp_path: Path) -> None:
    """Read through the same file interface as /dev/kmsg (a FIFO: readable when written to)."""
    log = tmp_path / "kmsg"
    os.mkfifo(log)
    writer_keepalive = os.open(log, os.O_RDWR | os.O_NONBLOCK)
    watch = OomWatch(str(log))
    try:
        watch.start()
        assert watch.watching
        os.write(writer_keepalive, HOST_WIDE.encode())
        watch.drain()
        assert watch.host_killed(CID) and watch.host_kills_total == 1
    finally:
        watch.stop()
        os.close(writer_keepalive)
    assert not watch.watching


async def test_without_the_kernel_log_the_watch_says_so_and_judges_nothing(tmp_path: Path) -> None:
    watch = OomWatch(str(tmp_path / "missing"))
    watch.start()
    assert not watch.watching and not watch.host_killed(CID)
    watch.stop()


def test_a_death_is_the_hosts_only_when_its_last_oom_kill_was() -> None:
    """An episode that fills its own memory after a host-wide kill hit its sandbox does not get
    its death put down to the host: the kernel logs that last kill at the sandbox's own limit."""
    watch = OomWatch()
    watch.feed(HOST_WIDE)
    assert watch.died_of_host(CID, since=0.0)
    watch.feed(AT_ITS_LIMIT)
    assert not watch.died_of_host(CID, since=0.0) and watch.host_killed(CID, since=0.0)
    watch.feed(HOST_WIDE)
    assert watch.died_of_host(CID, since=0.0) and not watch.died_of_host(OTHER, since=0.0)


def test_a_kernel_message_quoting_what_a_sandbox_chose_cannot_forge_a_host_wide_kill() -> None:
    """The kernel quotes a path a process executed with an empty argv (fs/exec.c, once per boot):
    a sandbox picks that path, so it could carry a summary line of a host-wide kill of its own
    container, to have its death masked. Only a message that starts as the kernel's summary counts."""
    forged = f"oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),task_memcg=/docker/{CID},task=x,pid=1,uid=0"
    record = f"4,52500,71300000000,-;process 'sh' launched '/tmp/{forged}' with NULL argv: empty string added"
    assert parse_oom_kill(record.split(";", 1)[1]) is None
    watch = OomWatch()
    watch.feed(record)
    assert not watch.host_killed(CID, since=0.0) and watch.host_kills_total == 0
