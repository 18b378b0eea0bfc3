"""The node daemon: wires runtime, pools, sessions and the gRPC server, and owns their lifecycle.

Shutdown is explicit, ordered, idempotent and bounded: health goes NOT_SERVING and new sessions
are refused, in-flight calls get ``shutdown_grace`` seconds, then sessions close, pools destroy
their sandboxes, and every background task is awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import nats.errors
import nats.js.errors
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from rlsandbox.daemon import __version__, tracing
from rlsandbox.daemon.agent import stage_agent
from rlsandbox.daemon.api.auth import BearerTokenInterceptor, is_loopback, load_tokens, server_credentials
from rlsandbox.daemon.api.edge import EdgeInterceptor
from rlsandbox.daemon.api.servicer import SandboxServicer
from rlsandbox.daemon.background import Background
from rlsandbox.daemon.cluster import Membership
from rlsandbox.daemon.config import DaemonConfig, MiB, PoolConfig
from rlsandbox.daemon.errors import FailedPrecondition, SandboxError, Unavailable
from rlsandbox.daemon.events.model import HEARTBEAT
from rlsandbox.daemon.events.publisher import EventPublisher
from rlsandbox.daemon.grading.bundles import TaskBundles
from rlsandbox.daemon.grading.grader import Grader
from rlsandbox.daemon.journal import SessionJournal
from rlsandbox.daemon.logs import set_node_fields
from rlsandbox.daemon.metrics import Metrics, serve
from rlsandbox.daemon.pool import CreateLimiter, Reconciler, SandboxFactory, WarmPool
from rlsandbox.daemon.pool.catalog import PoolCatalog, registry_auth
from rlsandbox.daemon.pool.disk import DiskGuard
from rlsandbox.daemon.pool.spec import PoolSpec
from rlsandbox.daemon.process import lift_host_file_table, raise_open_files_limit, shield_from_oom_killer
from rlsandbox.daemon.runtime import cgroups
from rlsandbox.daemon.runtime.docker import LABEL_MANAGED, LABEL_OWNER, DockerRuntime
from rlsandbox.daemon.session import SessionManager
from rlsandbox.daemon.session.fork import Forker
from rlsandbox.daemon.status import NodeStatus, PoolStatus
from rlsandbox.v1 import sandbox_pb2, sandbox_pb2_grpc

log = logging.getLogger(__name__)
EVENTS_DRAIN = 10.0  # seconds at most for queued events at shutdown (the rest stays in the outbox)

SERVICE_NAME = sandbox_pb2.DESCRIPTOR.services_by_name["SandboxService"].full_name
HEALTH_INTERVAL = 2.0
HEALTH_PING_TIMEOUT = 5.0
HEALTH_FAILURES = 3


class NodeDaemon:
    """One node's daemon. ``await start()``, then ``await stop()`` (from anywhere, any number of times)."""

    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.instance = secrets.token_hex(4)
        self.runtime = DockerRuntime(owner=config.node_id, instance=self.instance, socket_path=config.docker_socket)
        self.factory = SandboxFactory(
            self.runtime, socket_root=Path(config.agent_socket_root) if config.agent_socket_root else None
        )
        self.limiter = CreateLimiter(config.create_concurrency)
        self.metrics = Metrics() if config.metrics_listen else None
        self.metrics_port: int | None = None
        self._metrics_runner: Any = None
        configured = {
            p.name: WarmPool(p.spec(), self.factory, limiter=self.limiter, max_waiters=config.max_waiters_per_pool)
            for p in config.pools
        }
        self.background = Background(self._crashed)
        images = config.image_pools
        self.pools = PoolCatalog(
            configured,
            factory=self.factory,
            limiter=self.limiter,
            max_waiters=config.max_waiters_per_pool,
            templates=[(t.image, _template_maker(t)) for t in images.templates] if images.enabled else [],
            spawn=self.background.spawn,
            warm_budget=images.warm_budget,
            max_pools=images.max_pools,
            idle_evict=images.idle_evict,
            registry=images.registry,
            registry_auth=registry_auth(images.registry_auth_file),
            disk_budget_bytes=int(images.disk_budget_gb * (1 << 30)),
        )
        if self.metrics is not None:
            self.pools.on_evict = self.metrics.forget_pool
        self.grader = Grader(
            self.runtime,
            self.pools,
            acquire_timeout=config.default_acquire_timeout,
            tampering_policy=config.grading_tampering_policy,
            second_opinion=config.grading_second_opinion,
            second_opinion_share=config.grading_second_opinion_share,
            warm_pytest=config.grading_warm_pytest,
            task_cache_bytes=config.task_cache_bytes,
        )
        self.events: EventPublisher | None = None
        if config.nats_url and not config.nats_auth().connect_options():
            log.warning(
                "NATS at %s is used without credentials: anyone who reaches it can post events and rewards in this "
                "node's name and join the node table. Give each role its user: `rlsandbox keys init` (docs/CLUSTER.md)",
                config.nats_url,
            )
        if config.nats_url:
            self.events = EventPublisher(
                config.node_id,
                self.instance,
                nats_url=config.nats_url,
                outbox_path=config.events_outbox,
                outbox_max_bytes=config.events_outbox_max_bytes,
                publish_timeout=config.events_publish_timeout,
                step_batch=config.events_step_batch,
                auth=config.nats_auth(),
                replicas=config.nats_replicas,
                max_age=config.events_max_age,
            )
        self.journal = SessionJournal(config.session_journal, config.node_id) if config.session_journal else None
        self.sessions = SessionManager(
            config.node_id,
            self.pools,
            max_sessions=config.max_sessions,
            reap_interval=config.reap_interval,
            grader=self.grader,
            events=self.events,
            events_output_cap=config.events_output_cap if config.events_include_output else 0,
            events_confirm_timeout=config.events_confirm_timeout,
            journal=self.journal,
            max_prefetched=config.max_prefetched,
            image_pool=self.pools.for_image if config.image_pools.enabled else None,
            metrics=self.metrics,
            forker=Forker(self.runtime, max_bytes=config.max_fork_bytes),
        )
        self.reconciler = Reconciler(self.factory, interval=config.reconcile_interval)
        self.disk_guard = DiskGuard(
            self.factory,
            floor_bytes=config.disk_floor_mb << 20,
            critical_bytes=config.disk_critical_mb << 20,
            interval=config.disk_check_interval,
            in_use=lambda: {cid for pool in self.pools.values() for cid in pool.leased_containers()},
        )
        self.health = HealthServicer()
        self.docker_ok = False
        self.serving = True
        self.started = time.monotonic()
        self.bundles = TaskBundles(config.nats_url, auth=config.nats_auth()) if config.nats_url else None
        self.membership = (
            Membership(
                config.nats_url,
                config.node_id,
                interval=config.heartbeat_interval or 5.0,
                auth=config.nats_auth(),
                replicas=config.nats_replicas,
            )
            if config.nats_url
            else None
        )
        self.servicer = SandboxServicer(
            self.sessions,
            config,
            docker_ok=lambda: self.docker_ok,
            status=self.status,
            bundles=self.bundles,
            cluster=self.cluster_nodes,
        )
        self.server: grpc.aio.Server | None = None
        self.unix_server: grpc.aio.Server | None = None  # only when the unix socket is open and TCP is not
        self.tcp_port: int | None = None
        self.crashed = ""  # why the node stopped on its own, if it did
        self._stopping: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()

    @property
    def address(self) -> str:
        """A target for clients: the TCP address if listening on TCP, else the unix socket."""
        if self.tcp_port is not None and self.config.listen_tcp:
            host = self.config.listen_tcp.rsplit(":", 1)[0] or "127.0.0.1"
            return f"{host}:{self.tcp_port}"
        return f"unix:{self.config.listen_unix}"

    def _grpc_server(self, options: list[tuple[str, Any]], tokens: list[bytes] | None) -> grpc.aio.Server:
        # Authentication first (nothing of an unauthenticated call is looked at), then the edge.
        interceptors: list[grpc.aio.ServerInterceptor] = [BearerTokenInterceptor(tokens)] if tokens else []
        interceptors.append(EdgeInterceptor(self.metrics))
        server = grpc.aio.server(options=options, interceptors=interceptors)
        sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(self.servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server
        )
        return server

    def status(self) -> NodeStatus:
        """The node's status: what GetNodeStatus answers and the heartbeat carries."""
        sessions = self.sessions
        return NodeStatus(
            node_id=self.config.node_id,
            version=__version__,
            pools=[PoolStatus(p.stats(), p.spec.container.image, p.spec.container.runtime) for p in self.pools.values()],
            sessions=len(sessions.sessions),
            max_sessions=sessions.max_sessions,
            docker_reachable=self.docker_ok,
            serving=self.serving,
            load1=os.getloadavg()[0],
            uptime=time.monotonic() - self.started,
            execs_total=sessions.execs_total,
            sessions_adopted=sessions.adopted_total,
            sessions_lost=sessions.lost_total,
            events_unconfirmed=sessions.recorder.unconfirmed_total,
            events=self.events.stats() if self.events is not None else None,
        )

    async def _cap_sandboxes(self) -> None:
        """Every sandbox under one parent cgroup whose PID and memory limits keep a share of the
        host out of their reach (runtime/cgroups.py)."""
        try:
            info = await self.runtime.info()
        except SandboxError as e:
            log.warning("sandboxes not capped node-wide: the engine did not say its cgroup setup: %s", e)
            return
        driver = str(info.get("CgroupDriver") or "cgroupfs")
        parent = cgroups.parent_name(self.config.cgroup_parent, driver)
        version = str(info.get("CgroupVersion") or "1")
        defaults = cgroups.default_caps()
        wanted = {"pids": self.config.sandbox_pids_max, "memory": self.config.sandbox_memory_mb * MiB}
        limits = {c: defaults[c] if v == 0 else max(v, 0) for c, v in wanted.items()}
        self.factory.cgroup_parent = parent
        if driver == "systemd":
            # systemd owns the slice and would put back its own limits: they are the slice's to set.
            log.warning(
                "sandboxes go to %s; under the engine's systemd cgroup driver the daemon does not set its limits: "
                "systemctl set-property %s TasksMax=%s MemoryMax=%s",
                parent,
                parent,
                limits["pids"] or "infinity",
                limits["memory"] or "infinity",
            )
            return
        for controller, limit in limits.items():
            try:
                path = await asyncio.to_thread(cgroups.cap, parent, version, controller, limit)
            except OSError as e:
                log.warning("sandboxes' %s not capped node-wide (%s): all of them together can take the host's", controller, e)
            else:
                log.info("sandboxes' %s capped at %s node-wide (%s)", controller, limit or "no limit", path)
                if controller == "memory":
                    self.factory.memory_ceiling = cgroups.sandbox_ceiling(limit)
        ceiling = self.factory.memory_ceiling
        for pool in [*self.config.pools, *self.config.image_pools.templates]:
            if ceiling and pool.memory_mb * MiB > ceiling:
                log.warning(
                    "pool %s: memory_mb %d is past what one sandbox may have under the node's memory cap; "
                    "its sandboxes get %d MB (raise sandbox_memory_mb, or lower memory_mb)",
                    pool.name,
                    pool.memory_mb,
                    ceiling // MiB,
                )

    async def start(self) -> None:
        """All or nothing: each step that succeeded is undone if a later one fails (uvicorn's
        ``Server.startup`` is the model), so a failed start leaves no socket, task or open file,
        and never destroys a sandbox an earlier life left: re-adopted sessions are only let go
        (their journal rows stay for the next start)."""
        raise_open_files_limit(self.config.max_sessions)
        shield_from_oom_killer()
        lift_host_file_table()
        set_node_fields(node=self.config.node_id)
        async with contextlib.AsyncExitStack() as undo:
            if self.config.tracing_otlp_endpoint:
                tracing.configure(
                    self.config.tracing_otlp_endpoint, node_id=self.config.node_id, sample_ratio=self.config.tracing_sample_ratio
                )
                undo.push_async_callback(asyncio.to_thread, tracing.shutdown)
            await self.runtime.start()
            undo.push_async_callback(self.runtime.close)
            try:
                await self.runtime.ping()
            except SandboxError as e:
                raise Unavailable(f"{e.message}; is dockerd running? (scripts/bootstrap.sh starts it)") from None
            self.docker_ok = True
            if self.config.agent_host_dir:  # before any sandbox is made
                try:
                    self.factory.agent_path = await asyncio.to_thread(stage_agent, Path(self.config.agent_host_dir))
                except OSError as e:
                    raise FailedPrecondition(
                        f"cannot put the sandbox agent in agent_host_dir {self.config.agent_host_dir!r}: {e}"
                    ) from None
            if self.config.cgroup_parent:  # before any sandbox is made
                await self._cap_sandboxes()
            if self.journal is not None:
                await asyncio.to_thread(self.journal.open)
                undo.push_async_callback(self.journal.close)
            if self.events is not None:
                await self.events.open()
                undo.push_async_callback(self.events.stop, 0.0)
            servers = self._bind()  # before recovery: a port in use fails here, with nothing adopted yet
            undo.push_async_callback(self._stop_servers, servers, 0.0)
            if self.metrics is not None:
                await self._serve_metrics(undo)
            if self.journal is not None:
                owned = await self.runtime.list_containers({LABEL_MANAGED: "1", LABEL_OWNER: self.runtime.owner})
                undo.push_async_callback(self.sessions.let_go, "the daemon's start failed; the next start re-adopts it")
                adopted, lost = await self.sessions.recover({c.name: c.state for c in owned})
                if adopted or lost:
                    log.warning("start-up: re-adopted %d sessions of an earlier run; %d could not be (ended)", adopted, lost)
            removed = await self.reconciler.sweep(grace=0)
            if removed:
                log.warning("start-up: removed %d containers an earlier run of node %s left", len(removed), self.config.node_id)
            for server in servers:
                await server.start()
            self.server, self.unix_server = servers[0], servers[1] if len(servers) > 1 else None
            if self.events is not None:
                await self.events.start()  # publishes what recovery emitted, too
            self.factory.oom.start()
            undo.callback(self.factory.oom.stop)
            undo.push_async_callback(self.background.aclose)
            for pool in self.pools.values():
                self.background.spawn(pool.run(), f"pool-{pool.name}")
            self.background.spawn(self.sessions.run_reaper(), "session-reaper")
            self.background.spawn(self.pools.run(), "image-pools")
            if self.metrics is not None:
                self.background.spawn(self.metrics.watch_loop(), "event-loop-lag")
            self.background.spawn(self.reconciler.run(), "reconciler")
            self.background.spawn(self.disk_guard.run(), "disk-guard")
            self.background.spawn(self._watch_health(), "health")
            if self.events is not None and self.config.heartbeat_interval > 0:
                self.background.spawn(self._heartbeats(self.events), "heartbeat")
            if self.membership is not None:
                self.background.spawn(self._membership(self.membership), "membership")
            await self._set_health(True)
            undo.pop_all()  # started: from here on, stop() undoes it all
        log.info("node serving on %s (%d pools)", self.address, len(self.pools), extra={"node": self.config.node_id})

    async def _serve_metrics(self, undo: contextlib.AsyncExitStack) -> None:
        assert self.metrics is not None
        cfg = self.config
        host, _, port = cfg.metrics_listen.rpartition(":")
        self.metrics.add_status(self.status, self._metric_counters)
        tokens = load_tokens(cfg.auth_token_file) if cfg.auth_token_file and not is_loopback(cfg.metrics_listen) else None
        try:
            runner, self.metrics_port = await serve(self.metrics, host or "127.0.0.1", int(port or 0), tokens)
        except OSError as e:
            raise Unavailable(
                f"cannot serve metrics on {cfg.metrics_listen} ({e.strerror}); is another daemon using it?"
            ) from None
        self._metrics_runner = runner
        undo.push_async_callback(runner.cleanup)

    def _metric_counters(self) -> dict[str, float]:
        pf, cat = self.sessions.prefetcher, self.pools
        return {
            "prefetch_handed_out_total": pf.handed_out_total,
            "prefetch_missed_total": pf.missed_total,
            "prefetch_expired_total": pf.expired_total,
            "prefetched_sandboxes": pf.prepared,
            "image_pools": len(cat.image_pools),
            "image_pools_made_total": cat.made_total,
            "image_pools_evicted_total": cat.evicted_total,
            "images_pulled_total": cat.pulled_total,
            "images_removed_total": cat.images_removed_total,
            "events_unconfirmed_total": self.sessions.recorder.unconfirmed_total,
        }

    def _bind(self) -> list[grpc.aio.Server]:
        """The gRPC servers with their ports bound (not started): the first is the main one."""
        cfg = self.config
        options = [
            ("grpc.max_receive_message_length", cfg.max_message_bytes),
            ("grpc.max_send_message_length", cfg.max_message_bytes),
            ("grpc.so_reuseport", 0),
        ]
        tokens = load_tokens(cfg.auth_token_file) if cfg.auth_token_file else None
        # The unix socket gets a server of its own when it is open and TCP is not.
        split = bool(tokens and cfg.listen_unix and cfg.auth_unix_open and cfg.listen_tcp)
        server = self._grpc_server(options, tokens)
        servers = [server]
        if cfg.listen_tcp:
            try:
                if cfg.tls_cert and cfg.tls_key:
                    self.tcp_port = server.add_secure_port(cfg.listen_tcp, server_credentials(cfg.tls_cert, cfg.tls_key))
                else:
                    self.tcp_port = server.add_insecure_port(cfg.listen_tcp)
            except RuntimeError as e:  # grpc raises this when the port cannot be bound
                raise Unavailable(f"cannot listen on {cfg.listen_tcp} ({e}); is another daemon using it?") from None
            if not self.tcp_port:
                raise Unavailable(f"cannot listen on {cfg.listen_tcp}; is another daemon using it?")
        if cfg.listen_unix:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(cfg.listen_unix)
            unix_server = self._grpc_server(options, None if cfg.auth_unix_open else tokens) if split else server
            unix_server.add_insecure_port(f"unix:{cfg.listen_unix}")
            if split:
                servers.append(unix_server)
        return servers

    @staticmethod
    async def _stop_servers(servers: list[grpc.aio.Server], grace: float) -> None:
        await asyncio.gather(*(s.stop(grace) for s in servers))

    def _crashed(self, name: str, error: BaseException) -> None:
        """A background loop died (a bug): stop the whole node rather than run without it."""
        self.crashed = f"background task {name} crashed: {type(error).__name__}: {error}"
        if self._stopping is None:
            self._stopping = asyncio.get_running_loop().create_task(self._stop(None))

    async def _heartbeats(self, events: EventPublisher) -> None:
        """A ``heartbeat`` node event every ``heartbeat_interval``: the node's status (docs/events.md)."""
        interval = self.config.heartbeat_interval
        while True:
            started = time.monotonic()
            events.emit_node(HEARTBEAT, self.status().heartbeat())
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    def cluster_record(self) -> dict[str, Any]:
        """This node's entry in the cluster's node table (cluster.py)."""
        status = self.status()
        beat = status.heartbeat()
        return {
            "node": self.config.node_id,
            "address": self.config.advertise_address or self.address,
            "sessions": status.sessions,
            "max_sessions": status.max_sessions,
            "free": status.free,
            "pools": beat["pools"],
            "load1": status.load1,
            "serving": self.serving and self.docker_ok,
            "draining": self.sessions.draining,
            "ts": time.time(),
        }

    async def cluster_nodes(self) -> list[dict[str, Any]]:
        """The node table (from NATS; this node alone without it, or when NATS does not answer)."""
        if self.membership is not None:
            try:
                return await self.membership.nodes()
            except (nats.errors.Error, nats.js.errors.Error, OSError, TimeoutError) as e:
                log.warning("cluster: the node table cannot be read (%s); answering with this node only", e)
        return [self.cluster_record()]

    async def _membership(self, membership: Membership) -> None:
        """This node's record in the node table every heartbeat interval (its liveness)."""
        interval = self.config.heartbeat_interval or 5.0
        while True:
            started = time.monotonic()
            try:
                await membership.publish(self.cluster_record())
            except (nats.errors.Error, nats.js.errors.Error, OSError, TimeoutError) as e:
                log.warning("cluster: could not update this node's record (%s); retrying", e)
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def _set_health(self, ok: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    async def _watch_health(self) -> None:
        """Health follows Docker reachability: a node that cannot make sandboxes is NOT_SERVING.

        Under a storm of creates and removes dockerd can take seconds to answer even /version
        (seen with 1,000 sessions closing at once), so only several failed pings in a row count.
        """
        failures = 0
        while self._stopping is None:
            try:
                await self.runtime.ping(timeout=HEALTH_PING_TIMEOUT)
                failures = 0
            except SandboxError:
                failures += 1
            ok = failures < HEALTH_FAILURES
            if ok != self.docker_ok:
                log.warning("Docker engine %s", "reachable again" if ok else "unreachable: health NOT_SERVING")
                if ok:  # an engine restart may have killed ready sandboxes: none is handed out before a probe
                    await asyncio.gather(*(pool.revalidate() for pool in self.pools.values()), return_exceptions=True)
                self.docker_ok = ok
            if self._stopping is None:
                await self._set_health(ok)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HEALTH_INTERVAL):
                    await self._stopped.wait()

    async def stop(self, grace: float | None = None) -> None:
        """Graceful, ordered, idempotent shutdown; concurrent callers wait for the same one."""
        if self._stopping is None:
            self._stopping = asyncio.get_running_loop().create_task(self._stop(grace))
        await asyncio.shield(self._stopping)

    async def _stop(self, grace: float | None) -> None:
        grace = self.config.shutdown_grace if grace is None else grace
        cleanup = self.config.shutdown_cleanup
        drain = min(max(grace, 1.0), EVENTS_DRAIN)
        log.info(
            "node %s stopping: in-flight calls get %.0f s, removing sandboxes at most %.0f s, events %.0f s",
            self.config.node_id, grace, cleanup, drain,
        )  # fmt: skip
        self.serving = False
        self.sessions.stop_accepting()
        if self.membership is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    await self.membership.leave()  # no new placements here from now on
        await self.health.enter_graceful_shutdown()
        servers = [s for s in (self.server, self.unix_server) if s is not None]
        # In-flight calls finish within the grace, then are cancelled.
        await asyncio.gather(*(s.stop(grace) for s in servers))
        # Sessions, pools and leftovers go within the cleanup budget; whatever is left then keeps
        # its labels and is removed by the reconciler at the next start.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + cleanup
        try:
            async with asyncio.timeout_at(deadline):
                await self.sessions.close_all("node shutting down")
                await self.pools.close(timeout=max(deadline - loop.time() - 1.0, 0.5))
        except TimeoutError:
            log.warning("shutdown: removing sandboxes took over %.0f s; the rest go at the next start", cleanup)
        self.reconciler.stop()
        self.disk_guard.stop()
        self.factory.oom.stop()
        self._stopped.set()
        stuck = await self.background.aclose()
        if stuck:
            log.warning("shutdown: background tasks %s did not stop in time", ", ".join(stuck))
        with contextlib.suppress(SandboxError, TimeoutError):
            async with asyncio.timeout(max(deadline - loop.time(), 1.0)):
                await self.reconciler.sweep(grace=0)  # anything a cancelled create left behind
        if self.events is not None:
            await self.events.stop(drain_timeout=drain)  # the rest stays in the outbox
        if self.bundles is not None:
            await self.bundles.close()
        if self.membership is not None:
            await self.membership.close()
        await self.runtime.close()
        if self.journal is not None:
            await self.journal.close()
        if self._metrics_runner is not None:
            await self._metrics_runner.cleanup()
        if self.config.tracing_otlp_endpoint:
            await asyncio.to_thread(tracing.shutdown)  # exports the spans still buffered
        if self.config.listen_unix:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.config.listen_unix)
        log.info("node %s stopped", self.config.node_id)

    async def wait_stopped(self) -> None:
        await self._stopped.wait()
        if self._stopping is not None:
            await asyncio.shield(self._stopping)


def _template_maker(template: PoolConfig) -> Callable[[str, str, str], PoolSpec]:
    def make(name: str, image: str, image_workdir: str) -> PoolSpec:
        update: dict[str, object] = {"name": name, "image": image}
        if "workdir" not in template.model_fields_set and image_workdir not in ("", "/"):
            update["workdir"] = image_workdir  # the image's WORKDIR (SWE-bench's /testbed), unless the template says
        return template.model_copy(update=update).spec()

    return make


__all__ = ["NodeDaemon"]
