"""Node-wide caps on what every sandbox together may hold: PIDs and memory.

Each sandbox has its own ``pids`` and ``memory_mb`` limits, but the pools' limits add up to far
more than the host has: the defaults allow 256 x 1,024 + 2,000 x 128 tasks against a host's
``kernel.pid_max`` (often 32,768), and 256 GB + 125 GB of memory against a host's tens. Fork bombs
in a few dozen sandboxes at once (a runaway ``make -j``, a policy's loop) would take every PID on
the host, and with them the daemon's threads, the engine's and sshd's; sandboxes really using the
memory they were promised would drive the host into OOM kills that may take the daemon or the
engine. So every sandbox is created under one parent cgroup (the engine's ``CgroupParent``) whose
``pids`` and ``memory`` limits leave the host its share: past them a fork fails with EAGAIN, and
the kernel's OOM killer picks among the sandboxes' processes, never outside them (the kill is the
node's doing, as a host-wide one: pool/oom.py).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)
CGROUP_ROOT = Path("/sys/fs/cgroup")
HOST_PIDS_SHARE = 0.25  # of the host's PIDs, kept out of the sandboxes' reach by default
HOST_MEMORY_SHARE = 0.10  # of the host's memory, kept for the daemon, the engine and the host ...
HOST_MEMORY_MIN = 2 << 30  # ... at least this much
SANDBOX_SHARE_OF_CAP = 0.9  # a sandbox's own memory limit, at most, of the node's cap on all of them
# Each capped controller's knob under cgroup v1 and v2, and what it says for "no limit" there.
KNOBS = {"pids": ("pids.max", "pids.max", "max"), "memory": ("memory.limit_in_bytes", "memory.max", "-1")}


def parent_name(parent: str, driver: str) -> str:
    """The engine's ``CgroupParent`` for ``parent`` under its cgroup driver: the systemd driver
    takes a slice's name; cgroupfs an absolute path (a relative one is runc's own cgroup's child)."""
    if driver == "systemd":
        return parent if parent.endswith(".slice") else f"{parent}.slice"
    return "/" + parent.strip("/")


def controller_folder(parent: str, version: str, controller: str, root: Path = CGROUP_ROOT) -> Path:
    """The parent cgroup's folder for ``controller``: in its own hierarchy (cgroup v1) or the
    unified one."""
    name = parent.strip("/")
    return root / controller / name if version == "1" else root / name


def knob(parent: str, version: str, controller: str, root: Path = CGROUP_ROOT) -> Path:
    """The file that holds the parent cgroup's limit of ``controller``."""
    v1, v2, _ = KNOBS[controller]
    return controller_folder(parent, version, controller, root) / (v1 if version == "1" else v2)


def host_pids() -> int:
    """The most tasks (processes and threads, each taking a PID) the host can have at once."""
    limits = []
    for path in ("/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"):
        try:
            limits.append(int(Path(path).read_text()))
        except (OSError, ValueError):
            continue
    return min(limits, default=0)


def host_memory() -> int:
    """The host's memory in bytes (MemTotal); 0 when unreadable."""
    try:
        with open("/proc/meminfo") as f:
            return int(next(line for line in f if line.startswith("MemTotal:")).split()[1]) * 1024
    except (OSError, StopIteration, ValueError, IndexError):
        return 0


def default_caps() -> dict[str, int]:
    """What all sandboxes together may hold by default: the host's PIDs less ``HOST_PIDS_SHARE``,
    its memory less ``HOST_MEMORY_SHARE`` (at least ``HOST_MEMORY_MIN``)."""
    memory = host_memory()
    return {
        "pids": int(host_pids() * (1 - HOST_PIDS_SHARE)),
        "memory": max(memory - max(int(memory * HOST_MEMORY_SHARE), HOST_MEMORY_MIN), 0),
    }


def sandbox_ceiling(memory_cap: int) -> int:
    """The most memory one sandbox may be given under a node cap of ``memory_cap`` (0: none).
    Below the cap, so that a sandbox alone meets its own limit first: a kill there is the
    episode's doing, a kill at the node's cap the node's (pool/oom.py), and a sandbox allowed the
    whole cap could otherwise have its own memory bomb counted as the node's and masked."""
    return int(memory_cap * SANDBOX_SHARE_OF_CAP)


def cap(parent: str, version: str, controller: str, value: int, root: Path = CGROUP_ROOT) -> Path:
    """Create the parent cgroup (before any sandbox is in it) and set its limit of ``controller``
    (``value``; 0: none); returns the knob. Raises OSError when the host's cgroups cannot be
    written here."""
    path = knob(parent, version, controller, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() and version != "1":
        # cgroup v2: the controller must be on in the parent's parent for the parent to have it.
        (path.parent.parent / "cgroup.subtree_control").write_text(f"+{controller}")
    path.write_text(str(value) if value > 0 else KNOBS[controller][2])
    return path


def read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def remove_parent(parent: str, root: Path = CGROUP_ROOT) -> None:
    """Remove an empty parent cgroup from every hierarchy that has it (tests: their own parent)."""
    name = parent.strip("/")
    for folder in [root / name, *(p / name for p in root.iterdir() if p.is_dir())]:
        if folder.is_dir():
            try:
                os.rmdir(folder)
            except OSError as e:
                log.debug("cgroup %s not removed: %s", folder, e)
