"""The daemon as a process: signals, systemd notification and watchdog, process limits, GC."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import resource
import signal
import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlsandbox.daemon.server import NodeDaemon

log = logging.getLogger(__name__)


def raise_open_files_limit(max_sessions: int) -> int:
    """Raise the soft limit on open files to the hard one: every agent socket is a descriptor of
    the daemon, and a shell's default of 1,024 stops a node at about a thousand sessions (the
    systemd unit sets LimitNOFILE; `rlsandbox up` from a shell does not)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    if soft < 2 * max_sessions + 256:
        log.warning("open files limit %d is low for max_sessions %d: raise LimitNOFILE / ulimit -n", soft, max_sessions)
    return soft


DAEMON_OOM_SCORE_ADJ = -500  # as docker.service sets for dockerd
NO_FILE_TABLE_LIMIT = (1 << 63) - 1  # fs.file-max as systemd (>= 240) sets it


def lift_host_file_table(path: str = "/proc/sys/fs/file-max") -> int | None:
    """Make the host's table of open files (``fs.file-max``) unlimited, as systemd does, so that
    each sandbox's open files are bounded by its memory cgroup alone (~250 bytes each, charged
    to it): with a finite table one sandbox of 1 GB can hold ~4 M open files and leave every
    other sandbox's open() failing with ENFILE (root, with CAP_SYS_ADMIN, is exempt; the episodes
    are not). Only raises it; returns it, None when it cannot be read or written."""
    try:
        with open(path) as f:
            current = int(f.read())
        if current < NO_FILE_TABLE_LIMIT:
            with open(path, "w") as f:
                f.write(str(NO_FILE_TABLE_LIMIT))
            log.info("fs.file-max raised from %d to unlimited: a sandbox's open files are bounded by its memory", current)
            current = NO_FILE_TABLE_LIMIT
    except (OSError, ValueError) as e:
        log.warning(
            "fs.file-max not raised (%s): one sandbox's open files can fill the host's table and fail other "
            "sandboxes' opens; set it as systemd does: sysctl -w fs.file-max=%d",
            e,
            NO_FILE_TABLE_LIMIT,
        )
        return None
    return current


def shield_from_oom_killer(path: str = "/proc/self/oom_score_adj") -> int | None:
    """A host out of memory: make the kernel's OOM killer take sandboxes' processes (score 0 and
    up) before the daemon's, whose loss would end every session on the node. Lowers the daemon's
    ``oom_score_adj`` to -500 (root only; never raises it); returns it, None when unreadable."""
    try:
        with open(path) as f:
            current = int(f.read())
        if current > DAEMON_OOM_SCORE_ADJ:
            with open(path, "w") as f:
                f.write(str(DAEMON_OOM_SCORE_ADJ))
            current = DAEMON_OOM_SCORE_ADJ
    except (OSError, ValueError) as e:
        log.warning("the daemon's OOM score is not lowered (%s): a host out of memory may kill it before sandboxes", e)
        return None
    return current


def tune_gc() -> None:
    """Freeze what start-up made (modules, grpc, protobuf, pools) out of the collector's way.

    Measured under a 600 commands/s soak over 256 sessions: full collections in the daemon took
    14-32 ms (each one a pause of every call in flight) with everything tracked, at most 7 ms
    frozen. Raising the young threshold instead made things worse: grpc's server leaves five
    objects in reference cycles per call, and 20,000 of them at once took 10-15 ms to collect.
    """
    gc.freeze()


def sd_notify(message: str) -> None:
    """Tell systemd (Type=notify) about READY/STOPPING/WATCHDOG; a no-op outside systemd."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    if path.startswith("@"):
        path = "\0" + path[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock, contextlib.suppress(OSError):
        sock.sendto(message.encode(), path)


async def run_until_signalled(daemon: NodeDaemon, *, on_ready: Any = None) -> None:
    """Serve until SIGTERM/SIGINT; a second signal cuts the grace period to zero. A signal during
    start-up cancels the start, which undoes what it had done."""
    loop = asyncio.get_running_loop()
    signals = 0
    stop_task: list[asyncio.Task[None]] = []
    starting = loop.create_task(daemon.start(), name="start")

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        if not starting.done():
            log.warning("%s during start-up: undoing the start", signal.Signals(signum).name)
            starting.cancel()
        elif signals == 1:
            log.info("%s: shutting down gracefully (again to force)", signal.Signals(signum).name)
            sd_notify("STOPPING=1")
            stop_task.append(loop.create_task(daemon.stop()))
        else:
            log.warning("%s again: forcing shutdown", signal.Signals(signum).name)
            stop_task.append(loop.create_task(_force(daemon)))

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await starting
    except BaseException:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        raise
    tune_gc()
    sd_notify("READY=1")
    watchdog = _watchdog_interval()
    try:
        if on_ready is not None:
            await on_ready(daemon)
        while not daemon._stopped.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(watchdog or 3600):
                    await daemon._stopped.wait()
            if watchdog:
                sd_notify("WATCHDOG=1")
        await asyncio.gather(*stop_task, return_exceptions=True)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await daemon.stop()


async def _force(daemon: NodeDaemon) -> None:
    for server in (daemon.server, daemon.unix_server):
        if server is not None:
            await server.stop(0)
    await daemon.stop(0)


def _watchdog_interval() -> float | None:
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec:
        return None
    return max(1.0, int(usec) / 2e6)


__all__ = ["raise_open_files_limit", "run_until_signalled", "sd_notify", "tune_gc"]
