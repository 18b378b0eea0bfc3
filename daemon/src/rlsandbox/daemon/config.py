"""Daemon configuration: TOML file, then environment (RLSANDBOX_*), then command-line flags.

Every option is documented in deploy/rlsandbox.example.toml; the defaults embedded here make
`rlsandbox daemon` and `rlsandbox up` work with no file at all.
"""

from __future__ import annotations

import os
import socket
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from rlsandbox.daemon.api.auth import is_loopback
from rlsandbox.daemon.errors import InvalidArgument
from rlsandbox.daemon.events.connection import NatsAuth
from rlsandbox.daemon.model import AgentMode, ContainerSpec, Limits
from rlsandbox.daemon.pool import PoolSpec

MiB = 1 << 20
SANDBOX_USER = "1000:1000"  # the episode's commands in a recycling pool (the agent stays root)


class PoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$")
    image: str
    min_ready: int = Field(2, ge=0, le=10_000)
    max_total: int = Field(64, ge=1, le=100_000)
    runtime: Literal["runc", "runsc"] = "runc"
    agent: Literal["auto", "agent", "exec"] = "auto"
    memory_mb: int = Field(1024, ge=16)
    cpus: float = Field(1.0, gt=0)
    pids: int = Field(1024, ge=16)
    nofile: int = Field(4096, ge=64)
    # What a sandbox may write outside its tmpfs places (its writable layer) before the node's
    # disk guard may end it when the engine's disk runs low (pool/disk.py); 0: no budget.
    disk_mb: int = Field(10240, ge=0)
    network: bool = False
    read_only_root: bool = False
    workspace_mb: int = Field(0, ge=0)
    workdir: str = "/workspace"
    env: dict[str, str] = Field(default_factory=dict)
    setup: list[str] = Field(default_factory=list)
    setup_timeout: float = Field(120.0, gt=0)
    # "auto": recycle when the pool qualifies (``recycling_blockers`` is empty).
    recycle: bool | Literal["auto"] = "auto"
    max_reuses: int = Field(50, ge=1, le=100_000)
    # Clean rooms allowed past max_total when every sandbox is in use (pool/spec.py).
    room_headroom: int = Field(2, ge=0, le=10_000)

    def recycling_blockers(self) -> list[str]:
        """What keeps this pool's sandboxes from being recycled (docs/RELIABILITY.md,
        "Recycling"); empty when the pool qualifies. An ``agent = "auto"`` pool qualifies here and
        is recycled only while its image turns out to run the agent (pool/warm_pool.py)."""
        return [
            why
            for why, broken in (
                ("read_only_root = true (every writable place must be one the reset wipes)", not self.read_only_root),
                ("network = false (nothing outside the sandbox may keep state for it)", self.network),
                ("an agent (agent = exec cannot reset a sandbox)", self.agent == "exec"),
                ("runtime = runc (the reset is proven for runc sandboxes)", self.runtime != "runc"),
            )
            if broken
        ]

    @property
    def recycles(self) -> bool:
        """``recycle`` as it applies: "auto" recycles exactly when the pool qualifies."""
        return not self.recycling_blockers() if self.recycle == "auto" else self.recycle

    @model_validator(mode="after")
    def _recyclable(self) -> PoolConfig:
        if self.recycle is True and (missing := self.recycling_blockers()):
            raise ValueError(f"pool {self.name}: recycle = true needs " + "; ".join(missing))
        return self

    def spec(self) -> PoolSpec:
        return PoolSpec(
            name=self.name,
            container=ContainerSpec(
                image=self.image,
                limits=Limits(
                    memory_bytes=self.memory_mb * MiB,
                    cpus=self.cpus,
                    pids=self.pids,
                    nofile=self.nofile,
                    disk_bytes=self.disk_mb * MiB,
                ),
                runtime=self.runtime,
                network=self.network,
                env=dict(self.env),
                workdir=self.workdir,
                agent=AgentMode(self.agent),
                read_only_root=self.read_only_root,
                workspace_mb=self.workspace_mb,
                run_as=SANDBOX_USER if self.recycles else "",
            ),
            min_ready=self.min_ready,
            max_total=self.max_total,
            setup=tuple(self.setup),
            setup_timeout=self.setup_timeout,
            recycle=self.recycles,
            max_reuses=self.max_reuses,
            room_headroom=self.room_headroom,
        )


def _default_pools() -> list[PoolConfig]:
    return [
        PoolConfig(name="python", image="rlsandbox/python-task:latest", min_ready=4, max_total=256),
        PoolConfig(
            name="busybox",
            image="rlsandbox/busybox:latest",
            min_ready=2,
            max_total=2000,
            memory_mb=64,
            cpus=0.5,
            pids=128,
        ),
    ]


class ImagePools(BaseModel):
    """Pools made on demand for images no configured pool has (pool/catalog.py)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    warm_budget: int = Field(16, ge=0)
    max_pools: int = Field(64, ge=1, le=10_000)
    idle_evict: float = Field(600.0, gt=0)
    disk_budget_gb: float = Field(100.0, gt=0)
    registry: str = ""
    registry_auth_file: str | None = None
    # Each template is a pool whose ``image`` is a pattern (fnmatch); the first match wins.
    templates: list[PoolConfig] = Field(
        default_factory=lambda: [PoolConfig(name="any-image", image="*", min_ready=0, max_total=64)]
    )


class DaemonConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node_id: str = Field(default_factory=lambda: socket.gethostname().split(".")[0] or "node")
    listen_tcp: str | None = "127.0.0.1:7420"
    listen_unix: str | None = None
    # The address other machines reach this node at, in the cluster's node table (default: the
    # TCP listener's address).
    advertise_address: str = ""
    docker_socket: str = "/var/run/docker.sock"
    agent_socket_root: str = "/run/rlsandbox/sockets"
    # Where the daemon puts a copy of its sandbox agent for the engine to bind into sandboxes, when
    # the engine does not see the daemon's files (the daemon in a container, e.g. a Kubernetes
    # DaemonSet: a hostPath at the same path on both sides). Empty: bound from the installed package.
    agent_host_dir: str = ""
    session_journal: str = "/var/lib/rlsandbox/sessions.sqlite3"
    max_sessions: int = Field(2000, ge=1)
    # Free space on the engine's data-root below which the disk guard ends the sandboxes past
    # their pool's disk_mb (pool/disk.py; 0: no guard), checked every disk_check_interval seconds.
    disk_floor_mb: int = Field(8192, ge=0)
    # Below this many MB free, the guard also ends the sandboxes holding the most, within their
    # budgets too, until they would bring the disk back to it (0: never; at most disk_floor_mb).
    disk_critical_mb: int = Field(4096, ge=0)
    disk_check_interval: float = Field(2.0, gt=0)
    # The parent cgroup of every sandbox, whose limits cap the PIDs and memory of all sandboxes
    # together (runtime/cgroups.py; a slice under the systemd cgroup driver); "": the engine's
    # default, no cap.
    cgroup_parent: str = Field("rlsandbox", pattern=r"^[A-Za-z0-9_.-]*$")
    # Those caps: 0, the host's pid_max less a quarter, its memory less a tenth (at least 2 GiB);
    # -1, none; else this many PIDs, MB.
    sandbox_pids_max: int = Field(0, ge=-1)
    sandbox_memory_mb: int = Field(0, ge=-1)
    max_waiters_per_pool: int = Field(1024, ge=1)
    create_concurrency: int = Field(4, ge=1, le=64)
    default_idle_timeout: float = Field(600.0, gt=0)
    max_idle_timeout: float = Field(24 * 3600.0, gt=0)
    default_max_lifetime: float = Field(6 * 3600.0, gt=0)
    max_lifetime_limit: float = Field(48 * 3600.0, gt=0)
    default_acquire_timeout: float = Field(30.0, gt=0)
    default_exec_timeout: float = Field(300.0, gt=0)
    max_exec_timeout: float = Field(3600.0, gt=0)
    default_output_cap: int = Field(1 * MiB, ge=0)
    max_output_cap: int = Field(64 * MiB, ge=0)
    max_message_bytes: int = Field(128 * MiB, ge=MiB)
    max_read_bytes: int = Field(64 * MiB, ge=1)
    shutdown_grace: float = Field(30.0, ge=0)
    shutdown_cleanup: float = Field(20.0, ge=1)
    reconcile_interval: float = Field(60.0, gt=0)
    reap_interval: float = Field(1.0, gt=0)
    max_prefetched: int = Field(64, ge=0)
    max_fork_bytes: int = Field(256 * MiB, ge=MiB)
    # Task workspaces as their git reset made them, kept in memory for the task's next sessions
    # (grading/prepare.py); 0: every session runs the reset itself.
    task_cache_bytes: int = Field(256 * MiB, ge=0)
    metrics_listen: str = ""
    prefetch_ttl: float = Field(600.0, gt=0)
    # OpenTelemetry tracing (daemon/tracing.py): spans to this OTLP/gRPC collector
    # (http://host:4317 plaintext, https:// TLS); empty: off, at no cost.
    tracing_otlp_endpoint: str = ""
    tracing_sample_ratio: float = Field(1.0, ge=0, le=1)
    log_level: str = "INFO"
    # Authentication: TLS on the TCP listener, bearer tokens (one per line) required over TCP.
    tls_cert: str | None = None
    tls_key: str | None = None
    auth_token_file: str | None = None
    auth_unix_open: bool = True
    # Events (docs/events.md): empty nats_url means no events, except under `rlsandbox up`, which
    # starts an embedded nats-server and aggregator when none is configured.
    nats_url: str = ""  # one URL, or several comma-separated (a NATS cluster)
    # Copies JetStream keeps of the events stream and of the node table in a NATS cluster (3 in a
    # 3-server cluster: a server lost loses nothing); 1 for a single server.
    nats_replicas: int = Field(1, ge=1, le=5)
    # NATS credentials (docs/events.md): a .creds file, an NKey seed file, a token file, or a user
    # with a password file; a CA for TLS. Secrets live in files, never in this configuration.
    nats_credentials: str | None = None
    nats_nkey_seed: str | None = None
    nats_token_file: str | None = None
    nats_user: str | None = None
    nats_password_file: str | None = None
    nats_tls_ca: str | None = None
    events_outbox: str = "/var/lib/rlsandbox/events-outbox.sqlite3"
    events_outbox_max_bytes: int = Field(512 * MiB, ge=1024)
    events_publish_timeout: float = Field(5.0, gt=0)
    # A call returns once its events are durable (acknowledged by JetStream, or in the outbox),
    # waiting at most this many seconds: a SIGKILL then loses no event of an answered call. Costs
    # a JetStream round trip per step (docs/BENCHMARKS.md); 0: answer at once.
    events_confirm_timeout: float = Field(0.25, ge=0, le=10)
    events_include_output: bool = False
    events_output_cap: int = Field(4096, ge=0, le=MiB)
    events_step_batch: int = Field(256, ge=1, le=10_000)
    # Seconds JetStream keeps an event in the stream (the aggregator stores it long before): the
    # stream must not grow with every event ever emitted. 0 keeps them forever.
    events_max_age: float = Field(7 * 24 * 3600.0, ge=0)
    heartbeat_interval: float = Field(5.0, ge=0)
    # Grading (docs/GRADING.md): what tampering detected in a clean room does to the reward when the
    # task does not say: "strict" (reward 0) or "report" (listed only).
    grading_tampering_policy: Literal["strict", "report"] = "strict"
    # A paying pytest or unittest grade's tests run again one at a time (grading/second_opinion.py), for tasks
    # that do not say; in this share of the paying grades.
    grading_second_opinion: Literal["off", "fail_to_pass", "all"] = "fail_to_pass"
    grading_second_opinion_share: float = Field(1.0, ge=0.0, le=1.0)
    # A recycling pool's clean room forks pytest from a warm interpreter that has imported it
    # (docs/GRADING.md, "Warm pytest"); false: every grade starts its own.
    grading_warm_pytest: bool = True
    pools: list[PoolConfig] = Field(default_factory=_default_pools)
    image_pools: ImagePools = Field(default_factory=ImagePools)

    @model_validator(mode="after")
    def _remote_needs_auth(self) -> DaemonConfig:
        if self.tracing_otlp_endpoint and not self.tracing_otlp_endpoint.startswith(("http://", "https://")):
            raise ValueError(
                f"tracing_otlp_endpoint {self.tracing_otlp_endpoint!r} must be http://host:port or https://host:port"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key go together")
        if self.metrics_listen and not is_loopback(self.metrics_listen) and not self.auth_token_file:
            raise ValueError(
                f"metrics_listen {self.metrics_listen} is not loopback: it needs auth_token_file (scrapers send a bearer token)"
            )
        if self.listen_tcp and not is_loopback(self.listen_tcp) and not (self.tls_cert and self.auth_token_file):
            raise ValueError(
                f"listen_tcp {self.listen_tcp} is not loopback: it needs tls_cert, tls_key and auth_token_file "
                "(or listen on 127.0.0.1 / a unix socket)"
            )
        return self

    def nats_auth(self) -> NatsAuth:
        return NatsAuth(
            credentials=self.nats_credentials,
            nkey_seed=self.nats_nkey_seed,
            token_file=self.nats_token_file,
            user=self.nats_user,
            password_file=self.nats_password_file,
            tls_ca=self.nats_tls_ca,
        )

    @field_validator("pools")
    @classmethod
    def _unique_pools(cls, pools: list[PoolConfig]) -> list[PoolConfig]:
        names = [p.name for p in pools]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"pool names must be unique; repeated: {', '.join(sorted(dupes))}")
        return pools


ENV_PREFIX = "RLSANDBOX_"


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> DaemonConfig:
    """Defaults, then the TOML file, then RLSANDBOX_<OPTION> variables, then ``overrides``."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise InvalidArgument(f"cannot read config {path}: {e}") from None
    scalar_fields = {name for name in DaemonConfig.model_fields if name != "pools"}
    for key, value in os.environ.items():
        if key.startswith(ENV_PREFIX) and key[len(ENV_PREFIX) :].lower() in scalar_fields:
            data[key[len(ENV_PREFIX) :].lower()] = value
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return DaemonConfig.model_validate(data)
    except ValidationError as e:
        raise InvalidArgument(f"invalid configuration{f' in {path}' if path else ''}:\n{e}") from None
