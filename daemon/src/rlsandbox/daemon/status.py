"""One value of a node's status: GetNodeStatus answers it, the heartbeat event carries it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlsandbox.daemon.events.publisher import PublisherStats
from rlsandbox.daemon.pool.warm_pool import PoolStats


@dataclass(frozen=True, slots=True)
class PoolStatus:
    stats: PoolStats
    image: str
    oci_runtime: str


@dataclass(frozen=True, slots=True)
class NodeStatus:
    node_id: str
    version: str
    pools: list[PoolStatus]
    sessions: int
    max_sessions: int
    docker_reachable: bool
    serving: bool
    load1: float
    uptime: float
    execs_total: int
    sessions_adopted: int  # re-adopted at this start, after a crash
    sessions_lost: int  # journalled but not re-adoptable
    events_unconfirmed: int  # calls answered before their events were durable
    events: PublisherStats | None

    @property
    def free(self) -> int:
        return max(0, self.max_sessions - self.sessions)

    def heartbeat(self) -> dict[str, Any]:
        """A node heartbeat's data (docs/events.md): capacity, pools, load, version, counters."""
        return {
            "version": self.version,
            "sessions": self.sessions,
            "max_sessions": self.max_sessions,
            "free": self.free,
            "pools": {
                p.stats.name: {
                    "ready": p.stats.ready,
                    "in_use": p.stats.in_use,
                    "creating": p.stats.creating,
                    "max_total": p.stats.max_total,
                }
                for p in self.pools
            },
            "load1": self.load1,
            "docker_reachable": self.docker_reachable,
            "serving": self.serving,
            "execs_total": self.execs_total,
            "sessions_adopted": self.sessions_adopted,
            "sessions_lost": self.sessions_lost,
            "events_unconfirmed": self.events_unconfirmed,
            "events": {
                "published_total": self.events.published_total,
                "outbox_events": self.events.outbox_events,
                "dropped_total": self.events.dropped_total,
            }
            if self.events is not None
            else None,
        }
