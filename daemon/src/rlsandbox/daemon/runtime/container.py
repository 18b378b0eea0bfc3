"""The Engine API configuration of a sandbox container: limits, isolation, the agent's mounts.

Pure (no I/O): what a pool's spec means for the engine, in one place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlsandbox.daemon.model import ContainerSpec

AGENT_MOUNT = "/.rlsandbox/agent.py"
SOCKET_MOUNT = "/.rlsandbox/sock"
AGENT_SOCKET = "agent.sock"
# No .pyc files: an agent that edits a module twice within one second (same size) would otherwise
# run stale bytecode, since pyc invalidation compares whole-second mtimes and sizes.
SANDBOX_ENV = {"PYTHONDONTWRITEBYTECODE": "1"}
READ_ONLY_WORKSPACE_MB = 2048  # the workdir volume of a read-only-root pool without workspace_mb
READ_ONLY_TMP_MB = 512
# Capabilities a sandbox keeps: enough for package managers and file ownership inside the
# container, nothing that reaches the host (no NET_RAW, SYS_*, MKNOD, AUDIT_WRITE, SETFCAP).
KEPT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")


def container_config(
    spec: ContainerSpec,
    *,
    labels: Mapping[str, str],
    use_agent: bool,
    agent_path: Path | None,
    socket_dir: Path | None = None,
    image_volumes: Sequence[str] = (),
    cgroup_parent: str = "",
) -> dict[str, Any]:
    """The create body of a sandbox: hardened (capabilities, no new privileges, limits, no
    network unless asked), and the agent mounted read-only (dialing out through ``socket_dir``,
    or on the attach stream), or, without an agent, an init and a sleep for Engine API execs."""
    lim = spec.limits
    host: dict[str, Any] = {
        "Memory": lim.memory_bytes,
        "MemorySwap": lim.memory_bytes,  # no swap on top: an OOM is an OOM
        "NanoCpus": int(lim.cpus * 1e9),
        "PidsLimit": lim.pids,
        "Ulimits": [{"Name": "nofile", "Soft": lim.nofile, "Hard": lim.nofile}],
        "NetworkMode": "bridge" if spec.network else "none",
        "SecurityOpt": ["no-new-privileges:true"],
        "CapDrop": ["ALL"],
        "CapAdd": list(KEPT_CAPABILITIES),
        "Runtime": spec.runtime,
        "ReadonlyRootfs": spec.read_only_root,
        "AutoRemove": False,
        # Under the node's parent cgroup, whose pids.max caps all sandboxes together (runtime/cgroups.py).
        **({"CgroupParent": cgroup_parent} if cgroup_parent else {}),
        # What reaches PID 1's stdout and stderr (a root episode can write there; the attach
        # transport's frames pass there) is logged by the engine on the host's disk, outside the
        # writable layer: 1 MB at most, the tail kept for a look at a dead agent.
        "LogConfig": {"Type": "json-file", "Config": {"max-size": "1m", "max-file": "1"}},
    }
    workspace_mb = spec.workspace_mb or (READ_ONLY_WORKSPACE_MB if spec.read_only_root else 0)
    if workspace_mb:
        # A tmpfs-backed anonymous volume, not a plain tmpfs mount: the Engine's archive API
        # (task workspaces in, the grader's snapshots out) sees volumes but not tmpfs mounts.
        # Writes past the size fail with ENOSPC inside the sandbox; the pages count against
        # the sandbox's memory limit. Removed with the container (remove(v=True)).
        tmpfs = {"type": "tmpfs", "device": "tmpfs", "o": f"size={workspace_mb}m"}
        volume = {"DriverConfig": {"Name": "local", "Options": tmpfs}}
        host["Mounts"] = [{"Type": "volume", "Target": spec.workdir, "VolumeOptions": volume}]
    # A folder the image declares a VOLUME would be an anonymous volume on the host's disk: outside
    # the writable layer (the disk guard never sees it), writable under a read-only root. It is a
    # tmpfs-backed volume instead (the image's files still copied in), bounded by the sandbox's
    # memory like every other writable place.
    memory_mb = max(lim.memory_bytes >> 20, 1)
    for target in image_volumes:
        if any(m["Target"] == target for m in host.get("Mounts", ())):
            continue
        options = {"type": "tmpfs", "device": "tmpfs", "o": f"size={memory_mb}m"}
        mount = {"Type": "volume", "Target": target, "VolumeOptions": {"DriverConfig": {"Name": "local", "Options": options}}}
        host.setdefault("Mounts", []).append(mount)
    if spec.read_only_root:
        host["Tmpfs"] = {"/tmp": f"rw,exec,size={READ_ONLY_TMP_MB}m"}
    env = {**SANDBOX_ENV, **({"HOME": "/tmp"} if spec.run_as else {}), **spec.env}
    config: dict[str, Any] = {
        "Image": spec.image,
        "Labels": dict(labels),
        "Env": [f"{k}={v}" for k, v in env.items()],
        "WorkingDir": spec.workdir,
        "NetworkDisabled": not spec.network,
        "HostConfig": host,
        "StopSignal": "SIGKILL",
    }
    if use_agent:
        assert agent_path is not None
        host["Binds"] = [f"{agent_path}:{AGENT_MOUNT}:ro"]
        user = ["--user", spec.run_as] if spec.run_as else []
        if socket_dir is not None:
            # The agent dials the daemon's unix socket in a host folder that the sandbox sees
            # read-only (nothing it does lands on the host): no stdin, no attach.
            host["Binds"].append(f"{socket_dir}:{SOCKET_MOUNT}:ro")
            config.update(Cmd=["python3", "-u", AGENT_MOUNT, *user, "--connect", f"{SOCKET_MOUNT}/{AGENT_SOCKET}"], Entrypoint=[])
        else:
            config.update(
                Cmd=["python3", "-u", AGENT_MOUNT, *user],
                Entrypoint=[],
                OpenStdin=True,
                StdinOnce=False,
                AttachStdin=True,
                AttachStdout=True,
                AttachStderr=True,
                Tty=False,
            )
    else:
        # No agent: an init (docker-init) reaps zombies and a sleep keeps the sandbox alive
        # for Engine API execs.
        host["Init"] = True
        config.update(Cmd=["sleep", "2147483647"], Entrypoint=[])
    return config
