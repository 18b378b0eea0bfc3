"""A client of many nodes: it learns the node table from any node and places sessions itself."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Union

import grpc
from rlsandbox.client._client import AsyncClient, AsyncSession, MetadataHook
from rlsandbox.client._errors import ResourceExhaustedError, SandboxRPCError, UnavailableError
from rlsandbox.v1 import sandbox_pb2 as pb

if TYPE_CHECKING:
    from rlsandbox.client._requests import SessionOptions
    from typing_extensions import Unpack

REFRESH = 2.0  # seconds a node table is used before it is asked for again
READY_WEIGHT = 4  # a ready sandbox of the pool counts as this many free session slots


@dataclass
class ClusterNode:
    """One node of the table (``GetCluster``), with the client's own estimate of what it placed
    there since (``free`` and ``ready`` are lowered at each placement until the next refresh)."""

    node_id: str
    address: str
    sessions: int
    max_sessions: int
    free: int
    ready: Dict[str, int] = field(default_factory=dict)
    load1: float = 0.0
    serving: bool = True
    age: float = 0.0
    draining: bool = False

    @classmethod
    def from_pb(cls, m: pb.ClusterNode) -> ClusterNode:
        return cls(m.node_id, m.address, m.sessions, m.max_sessions, m.free, dict(m.ready), m.load1, m.serving, m.age, m.draining)


def _ready(node: ClusterNode, pool: str) -> int:
    return node.ready.get(pool, 0) if pool else max(node.ready.values(), default=0)


class ClusterClient:
    """Sessions on a cluster of node daemons, placed by the client (grpcio and protobuf only).

    Args:
        addresses: one or more nodes to learn the node table from (any node answers for all).
        choices: nodes sampled per placement (power of ``choices`` choices); the one with the
            most room wins: free session slots, plus ready sandboxes of the requested pool.
        refresh: seconds a node table is reused; placement costs no call to anyone else.
        Other arguments as :class:`AsyncClient` (one per node, made on first use).

    A session stays on its node (its id starts with the node's id); ``client_for(session_id)``
    is that node's client. A CreateSession refused by a node (RESOURCE_EXHAUSTED, UNAVAILABLE)
    is placed again on another; a node that stops answering only fails the calls of its
    sessions (with the node's name in the error).
    """

    def __init__(
        self,
        addresses: Union[str, Sequence[str]],
        *,
        choices: int = 2,
        refresh: float = REFRESH,
        timeout: float = 60.0,
        token: Optional[str] = None,
        tls_ca: Optional[Union[str, bytes]] = None,
        metadata: Optional[MetadataHook] = None,
        rng: Optional[random.Random] = None,
    ) -> None:
        self.bootstrap = [addresses] if isinstance(addresses, str) else list(addresses)
        if not self.bootstrap:
            raise ValueError("give at least one node address")
        self.choices = max(1, choices)
        self.refresh_interval = refresh
        self._client_options = {"timeout": timeout, "token": token, "tls_ca": tls_ca, "metadata": metadata}
        self._rng = rng or random.Random()
        self._clients: Dict[str, AsyncClient] = {}
        self.nodes: Dict[str, ClusterNode] = {}
        self._refreshed = 0.0
        self._refreshing: Optional[asyncio.Task[List[ClusterNode]]] = None
        self.placements: Dict[str, int] = {}

    async def __aenter__(self) -> ClusterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()

    def _client(self, address: str) -> AsyncClient:
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = AsyncClient(address, **self._client_options)  # type: ignore[arg-type]
        return client

    async def refresh(self) -> List[ClusterNode]:
        """Ask a known node (or a bootstrap address) for the node table; one call at a time."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh())
        return await asyncio.shield(self._refreshing)

    async def _refresh(self) -> List[ClusterNode]:
        known = [n.address for n in self.nodes.values() if n.address]
        errors = []
        for address in dict.fromkeys([*known, *self.bootstrap]):
            try:
                table = await self._client(address)._call("GetCluster", pb.GetClusterRequest())
            except SandboxRPCError as e:
                errors.append(f"{address}: {e.message}")
                continue
            self.nodes = {n.node_id: ClusterNode.from_pb(n) for n in table.nodes if n.address}
            self._refreshed = time.monotonic()
            return list(self.nodes.values())
        raise UnavailableError(grpc.StatusCode.UNAVAILABLE, f"no node answered GetCluster ({'; '.join(errors)})")

    def client_for(self, session_id: str) -> AsyncClient:
        """The client of the node that holds ``session_id`` (session ids start with the node id)."""
        node = self.nodes.get(session_id.rsplit("-", 1)[0])
        if node is None:
            raise KeyError(f"session {session_id} is on no node of the table; refresh() or check the id")
        return self._client(node.address)

    def _pick(self, pool: str, tried: set[str]) -> Optional[ClusterNode]:
        candidates = [n for n in self.nodes.values() if n.serving and not n.draining and n.free > 0 and n.node_id not in tried]
        if not candidates:
            return None
        sample = self._rng.sample(candidates, min(self.choices, len(candidates)))
        return max(
            sample, key=lambda n: n.free + READY_WEIGHT * (n.ready.get(pool, 0) if pool else max(n.ready.values(), default=0))
        )

    async def create_session(self, pool: str = "", **options: Unpack[SessionOptions]) -> AsyncSession:
        """A session on the node with the most room among ``choices`` sampled (options as
        :meth:`AsyncClient.create_session`); placed again elsewhere if that node refuses."""
        if not self.nodes or time.monotonic() - self._refreshed > self.refresh_interval:
            await self.refresh()
        tried: set[str] = set()
        last: Optional[SandboxRPCError] = None
        while True:
            node = self._pick(pool, tried)
            if node is None:
                if last is not None:
                    raise last
                raise ResourceExhaustedError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"no node of the cluster has room ({len(self.nodes)} known; tried {sorted(tried)})",
                )
            tried.add(node.node_id)
            try:
                session = await self._client(node.address).create_session(pool, **options)
            except (ResourceExhaustedError, UnavailableError) as e:
                node.free = 0  # until the next refresh says otherwise
                last = e
                continue
            node.free = max(node.free - 1, 0)
            if pool and node.ready.get(pool):
                node.ready[pool] -= 1
            self.placements[node.node_id] = self.placements.get(node.node_id, 0) + 1
            return session
