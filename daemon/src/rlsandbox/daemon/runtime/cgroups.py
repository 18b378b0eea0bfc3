"""A node-wide cap on the PIDs of every sandbox together.

Each sandbox has its own ``pids`` limit, but the pools' limits add up to far more than the host
has: the defaults allow 256 x 1,024 + 2,000 x 128 tasks, and a host's ``kernel.pid_max`` is often
32,768. A fork bomb in a few dozen sandboxes at once (a runaway ``make -j``, a policy's loop)
would take every PID on the host, and with them the daemon's threads, the engine's and sshd's.
So every sandbox is created under one parent cgroup (the engine's ``CgroupParent``), whose
``pids.max`` leaves the host a share of its PIDs: a fork there fails with EAGAIN in the sandboxes,
never outside them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)
CGROUP_ROOT = Path("/sys/fs/cgroup")
HOST_SHARE = 0.25  # of the host's PIDs, kept out of the sandboxes' reach by default


def parent_name(parent: str, driver: str) -> str:
    """The engine's ``CgroupParent`` for ``parent`` under its cgroup driver: the systemd driver
    takes a slice's name; cgroupfs an absolute path (a relative one is runc's own cgroup's child)."""
    if driver == "systemd":
        return parent if parent.endswith(".slice") else f"{parent}.slice"
    return "/" + parent.strip("/")


def pids_folder(parent: str, version: str, root: Path = CGROUP_ROOT) -> Path:
    """Where the parent's ``pids.max`` is: in the pids hierarchy (cgroup v1) or the unified one."""
    name = parent.strip("/")
    return root / "pids" / name if version == "1" else root / name


def host_pids() -> int:
    """The most tasks (processes and threads, each taking a PID) the host can have at once."""
    limits = []
    for knob in ("/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"):
        try:
            limits.append(int(Path(knob).read_text()))
        except (OSError, ValueError):
            continue
    return min(limits, default=0)


def default_cap() -> int:
    """What all sandboxes together may hold by default: the host's PIDs less ``HOST_SHARE``."""
    return int(host_pids() * (1 - HOST_SHARE))


def cap_pids(folder: Path, cap: int, version: str) -> None:
    """Create the parent cgroup (before any sandbox is in it) and set its ``pids.max`` (``cap``;
    0: no cap); raises OSError when the host's cgroups cannot be written here."""
    folder.mkdir(parents=True, exist_ok=True)
    knob = folder / "pids.max"
    if not knob.exists() and version != "1":
        # cgroup v2: the pids controller must be on in the parent's parent for it to have one.
        (folder.parent / "cgroup.subtree_control").write_text("+pids")
    knob.write_text(str(cap) if cap > 0 else "max")


def read_cap(folder: Path) -> str:
    try:
        return (folder / "pids.max").read_text().strip()
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
