"""Creates and destroys sandboxes: the only place containers come from and go to."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import secrets
import time
from pathlib import Path

from rlsandbox.daemon.agent import AGENT_PATH
from rlsandbox.daemon.agent.channel import AgentChannel
from rlsandbox.daemon.agent.protocol import EXIT_TAMPERED
from rlsandbox.daemon.agent.socket_transport import AgentListener, accept_agent, prepare_folder, remove_folder
from rlsandbox.daemon.errors import SandboxDied, SandboxError
from rlsandbox.daemon.journal import JournalEntry
from rlsandbox.daemon.model import AgentMode, ContainerSpec, ExecRequest
from rlsandbox.daemon.pool.oom import RECENT, OomWatch
from rlsandbox.daemon.pool.spec import PoolSpec
from rlsandbox.daemon.runtime.container import AGENT_SOCKET, container_config
from rlsandbox.daemon.runtime.docker import (
    LABEL_CREATED,
    LABEL_DISK,
    LABEL_INSTANCE,
    LABEL_MANAGED,
    LABEL_OWNER,
    LABEL_POOL,
    LABEL_SESSION,
    DockerRuntime,
)
from rlsandbox.daemon.runtime.exec_channel import ExecChannel
from rlsandbox.daemon.sandbox import Sandbox, SandboxChannel

log = logging.getLogger(__name__)

REMOVE_TIMEOUT = 30.0
RESET_TIMEOUT = 15.0  # seconds an agent may take to reset its sandbox for the next episode
# Removals the engine is asked for at once. dockerd serialises them (~40 ms each here); a storm of
# 1,000 concurrent removes made every one of them miss its deadline (measured with api_bench),
# while a short queue on our side lets each one finish well within it.
REMOVE_CONCURRENCY = 8
DEFAULT_SOCKET_ROOT = Path("/run/rlsandbox/sockets")
ADOPT_TIMEOUT = 5.0  # seconds for a surviving agent to answer a restarted daemon


class SetupFailed(SandboxError):
    """A pool's setup command failed in a new sandbox."""


OOM_EVENT_SETTLE = 1.5  # seconds a SIGKILLed sandbox's OOM event may come after its exit

# What ``death_cause`` calls a death: the episode's doing (its reward is 0, never masked) ...
EPISODES_DOING = frozenset({"oom", "disk", "tamper"})
# ... or the node's: "host" (the host, or all sandboxes together, ran out of memory), "" (anything else).
HOST_OOM = "host"


def socket_folder_name(container: str) -> str:
    """The name of a sandbox's socket folder under its node's folder (see SandboxFactory.socket_folder)."""
    return "s-" + hashlib.sha256(container.encode()).hexdigest()[:16]


def node_socket_folder(owner: str) -> str:
    """The folder of one node's agent sockets under the shared root: short (a unix socket's path
    has at most 107 bytes), and safe whatever the node id holds."""
    return "n-" + hashlib.sha256(owner.encode()).hexdigest()[:10]


class SandboxFactory:
    """Creates ready sandboxes and removes them; knows every container it has made.

    ``live`` maps container name to container id (``None`` while the create call is in flight) for
    every container this daemon made and has not removed yet: what the reconciler must not touch.
    """

    def __init__(
        self,
        runtime: DockerRuntime,
        *,
        agent_path: Path = AGENT_PATH,
        remove_concurrency: int = REMOVE_CONCURRENCY,
        socket_root: Path | None = DEFAULT_SOCKET_ROOT,
    ) -> None:
        """Args:
        socket_root: host folder for the agents' unix sockets (runc sandboxes); None keeps
            every agent on the container's attach stream. Each node keeps its sockets in a
            folder of its own under it (:func:`node_socket_folder`): daemons of several nodes
            on one host share the root, and each sweeps only what it owns.
        """
        self.runtime = runtime
        self.agent_path = agent_path
        self.socket_root = socket_root / node_socket_folder(runtime.owner) if socket_root is not None else None
        self.live: dict[str, str | None] = {}
        # Containers whose removal failed or timed out: the reconciler retries them until gone.
        self.unremoved: dict[str, str] = {}
        # Container id -> why the node ended it for its episode's doing (pool/disk.py), until asked.
        self.faults: dict[str, str] = {}
        # Host-wide OOM kills by container, from the kernel's log (started with the node).
        self.oom = OomWatch()
        # The parent cgroup of every sandbox (runtime/cgroups.py; set at the node's start), and the
        # most memory one sandbox may have under its memory cap (cgroups.sandbox_ceiling; 0: none).
        self.cgroup_parent = ""
        self.memory_ceiling = 0
        self.remove_failures_total = 0
        self._remove_slots = asyncio.Semaphore(remove_concurrency)

    def labels(self, pool: str, session: str = "", disk_bytes: int = 0) -> dict[str, str]:
        labels = {
            LABEL_MANAGED: "1",
            LABEL_OWNER: self.runtime.owner,
            LABEL_INSTANCE: self.runtime.instance,
            LABEL_POOL: pool,
            LABEL_SESSION: session,
            LABEL_CREATED: str(int(time.time())),
        }
        if disk_bytes:
            labels[LABEL_DISK] = str(disk_bytes)
        return labels

    def _within_node(self, cspec: ContainerSpec) -> ContainerSpec:
        """A sandbox's memory limit at most ``memory_ceiling``, below the node's cap on all
        sandboxes (runtime/cgroups.py ``sandbox_ceiling``: why)."""
        if not self.memory_ceiling or cspec.limits.memory_bytes <= self.memory_ceiling:
            return cspec
        return dataclasses.replace(cspec, limits=dataclasses.replace(cspec.limits, memory_bytes=self.memory_ceiling))

    async def create(self, spec: PoolSpec, *, session: str = "") -> Sandbox:
        """Create, start, connect to and set up one sandbox. Nothing is left behind on failure."""
        cspec = self._within_node(spec.container)
        name = f"rls-{spec.name}-{secrets.token_hex(6)}"
        self.live[name] = None
        cid: str | None = None
        channel: SandboxChannel | None = None
        listener: AgentListener | None = None
        try:
            if cspec.agent is AgentMode.AUTO:
                use_agent = await self.runtime.image_has_python(cspec.image, cspec.runtime)
            else:
                use_agent = cspec.agent is AgentMode.AGENT
            socket_dir = None
            if use_agent and self.socket_root is not None and cspec.runtime == "runc":
                socket_dir = self.socket_folder(name)
                prepare_folder(socket_dir)
                listener = await AgentListener.open(socket_dir / AGENT_SOCKET)  # before the agent dials
            config = container_config(
                cspec,
                labels=self.labels(spec.name, session, spec.container.limits.disk_bytes),
                use_agent=use_agent,
                agent_path=self.agent_path,
                socket_dir=socket_dir,
                image_volumes=await self.runtime.image_volumes(cspec.image),
                cgroup_parent=self.cgroup_parent,
            )
            cid = await self.runtime.create_and_start(config, name=name)
            self.live[name] = cid
            if listener is not None:
                channel = await accept_agent(listener, name, spec.start_timeout)
            else:
                # The attach stream is keyed: under gVisor a root process in the sandbox can open it.
                channel = (
                    AgentChannel(await self.runtime.attach(cid), name=name, keyed=True)
                    if use_agent
                    else ExecChannel(self.runtime, cid)
                )
                await channel.start(timeout=spec.start_timeout)
            sandbox = Sandbox(
                container_id=cid,
                name=name,
                pool=spec.name,
                channel=channel,
                mode="agent" if use_agent else "exec",
                runtime=cspec.runtime,
                image=cspec.image,
                transport="dial" if socket_dir is not None else "attach" if use_agent else "exec",
                host_folder=socket_dir,
                run_as=cspec.run_as,
            )
            await self._setup(sandbox, spec)
            return sandbox
        except BaseException:
            await asyncio.shield(self._remove(name, cid, channel, "failed setup"))
            raise
        finally:
            if listener is not None:
                await listener.close()

    async def adopt(self, entry: JournalEntry, state: str | None, timeout: float = ADOPT_TIMEOUT) -> Sandbox:
        """Reconnect to a sandbox that an earlier life of this daemon handed out.

        ``state`` is the container's state as the engine lists it (None: not found). Raises
        :class:`SandboxDied` saying why the sandbox cannot be adopted; the caller leaves the
        container to the reconciler.
        """
        if state is None:
            raise SandboxDied("its container is gone")
        if state != "running":
            raise SandboxDied(f"its container is {state}")
        channel: SandboxChannel
        if entry.transport == "dial":
            if self.socket_root is None:
                raise SandboxDied("its agent socket is not kept by this configuration (agent_socket_root is empty)")
            # The episode's programs run: only the container's init, the agent, may answer.
            try:
                info = await self.runtime.inspect(entry.container_id, timeout=timeout)
            except SandboxError as e:
                raise SandboxDied(f"its container cannot be inspected: {e.message}") from None
            agent_pid = (info.get("State") or {}).get("Pid")
            if not agent_pid:
                raise SandboxDied("its container has no running init process")
            folder = self.socket_folder(entry.container)
            prepare_folder(folder)
            listener = await AgentListener.open(folder / AGENT_SOCKET)
            try:
                channel = await accept_agent(listener, entry.container, timeout, agent_pid=int(agent_pid))
            finally:
                await listener.close()
        elif entry.transport == "exec":
            channel = ExecChannel(self.runtime, entry.container_id)
            try:
                await channel.start(timeout=timeout)
            except BaseException:
                with contextlib.suppress(Exception):
                    await channel.close("adoption failed")
                raise
        elif entry.transport == "socket":
            raise SandboxDied("its agent listened in a host folder the sandbox could write (an earlier version): not trusted")
        else:
            raise SandboxDied("its agent spoke over the container's attach stream, which ended with the daemon")
        self.live[entry.container] = entry.container_id
        return Sandbox(
            container_id=entry.container_id,
            name=entry.container,
            pool=entry.pool,
            channel=channel,
            mode="exec" if entry.transport == "exec" else "agent",
            runtime=entry.runtime,
            image=entry.image,
            transport=entry.transport,
        )

    async def recycle(self, sandbox: Sandbox, spec: PoolSpec, timeout: float = RESET_TIMEOUT) -> None:
        """Make a released sandbox serve another episode: its agent ends every process, wipes the
        writable places and proves it (sandbox_agent.py ``_reset``), then the pool's setup runs
        again. Raises SandboxError saying why the sandbox cannot be reused (the caller destroys it)."""
        outcome = await sandbox.channel.reset(timeout)
        if not outcome.get("ok"):
            raise SandboxDied(f"reset refused: {outcome.get('why') or 'no reason given'}", container=sandbox.name)
        sandbox.warm = bool(outcome.get("warm"))
        await self._setup(sandbox, spec)

    async def _setup(self, sandbox: Sandbox, spec: PoolSpec) -> None:
        for command in spec.setup:
            result = await sandbox.exec(ExecRequest(shell=command, timeout=spec.setup_timeout, cwd=spec.container.workdir))
            if not result.ok:
                detail = (result.stderr or result.stdout)[-500:].decode("utf-8", "replace").strip()
                raise SetupFailed(
                    f"setup command {command!r} of pool {spec.name} failed "
                    f"(exit {result.exit_code}, timed out {result.timed_out}): {detail}",
                    pool=spec.name,
                )

    async def death_cause(self, sandbox: Sandbox, wait: float = 2.0) -> tuple[str, str]:
        """Why a sandbox stopped answering, as the engine saw it: (what to tell the caller, whose
        doing: "oom" for an OOM kill at its memory limit, "disk" for the disk guard's kill,
        "tamper" for its agent's keyed stream written to or read from inside the sandbox, all
        the episode's (``EPISODES_DOING``); the node's: "host" for a kill because the host ran
        out of memory (pool/oom.py), "" for anything else).

        The agent's stream ends as its container exits, so the engine is given ``wait`` seconds
        to notice before the container counts as still running.
        """
        fault = self.faults.pop(sandbox.container_id, None)
        if fault is not None:
            return fault, "disk"
        tampered = getattr(sandbox.channel, "tampered", None)
        if tampered:
            return tampered, "tamper"
        deadline = time.monotonic() + wait
        while True:
            try:
                info = await self.runtime.inspect(sandbox.container_id, timeout=5.0)
            except SandboxError as e:
                return f"its container is gone ({e.message})", ""
            state = info.get("State") or {}
            if not state.get("Running") or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        # A SIGKILL may be the OOM killer's: the engine can record the exit before the OOM event
        # (containerd sends them apart), so OOMKilled may turn true a moment later.
        settle = time.monotonic() + OOM_EVENT_SETTLE
        while state.get("ExitCode") == 137 and not state.get("OOMKilled") and time.monotonic() < settle:
            await asyncio.sleep(0.1)
            try:
                info = await self.runtime.inspect(sandbox.container_id, timeout=5.0)
            except SandboxError:
                break
            state = info.get("State") or {}
        if self.oom.died_of_host(sandbox.container_id, since=time.monotonic() - RECENT):
            # The node's doing, not the episode's: memory it was promised was not there.
            why = "the host ran out of memory for sandboxes and the kernel's OOM killer killed a process of it (not at its limit)"
            return why, HOST_OOM
        if state.get("OOMKilled"):
            limit = (info.get("HostConfig") or {}).get("Memory") or 0
            return f"out of memory: the kernel OOM-killed it at its memory limit of {limit >> 20} MB", "oom"
        if state.get("Running"):
            return "its agent stopped answering while its container still runs", ""
        code = state.get("ExitCode")
        if code == EXIT_TAMPERED and sandbox.mode == "agent":  # only the agent, PID 1, sets it
            return "its agent found its input stream tampered with from inside the sandbox, and stopped", "tamper"
        killed = " (SIGKILL from outside: docker kill, a node restart)" if code == 137 else ""
        return f"its container exited with code {code}{killed}", ""

    async def destroy(self, sandbox: Sandbox, reason: str = "released") -> None:
        await self._remove(sandbox.name, sandbox.container_id, sandbox.channel, reason)

    async def _remove(self, name: str, cid: str | None, channel: SandboxChannel | None, reason: str) -> None:
        try:
            if channel is not None:
                with contextlib.suppress(Exception):
                    await channel.close(reason)
            async with self._remove_slots:  # the deadline starts once the engine is asked
                await self.runtime.remove(cid or name, timeout=REMOVE_TIMEOUT)
            self.unremoved.pop(name, None)
        except SandboxError as e:
            # The reconciler retries it (``unremoved``) until the engine confirms it is gone.
            self.unremoved[name] = cid or name
            self.remove_failures_total += 1
            log.warning("could not remove sandbox %s (%s), will retry: %s", name, reason, e)
        finally:
            self.live.pop(name, None)
            if cid:
                self.faults.pop(cid, None)
            await self.remove_folder(name)

    def socket_folder(self, name: str) -> Path:
        """The host folder of sandbox ``name``'s agent socket: named by a digest of the container
        name, so a socket path stays under the 107 bytes a unix socket may have whatever the
        pool's name (image pools have long ones)."""
        assert self.socket_root is not None
        return self.socket_root / socket_folder_name(name)

    async def remove_folder(self, name: str) -> None:
        """Remove sandbox ``name``'s socket folder, off the event loop (nothing if sockets are not kept)."""
        if self.socket_root is not None:
            await self.remove_folder_named(socket_folder_name(name))

    async def remove_folder_named(self, folder: str) -> None:
        if self.socket_root is not None:
            await asyncio.to_thread(remove_folder, self.socket_root / folder, AGENT_SOCKET)
