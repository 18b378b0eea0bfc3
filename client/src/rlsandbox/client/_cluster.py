"""Clients of many nodes: they learn the node table from any node and place sessions themselves.

The placement logic (:class:`Placement`) is shared by the asynchronous :class:`ClusterClient` and
the blocking :class:`BlockingClusterClient`; neither calls anyone but the chosen node per session.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union

import grpc
from rlsandbox.client._client import AsyncClient, AsyncSession, MetadataHook
from rlsandbox.client._errors import ResourceExhaustedError, SandboxRPCError, UnavailableError
from rlsandbox.client._sync import Client, Session
from rlsandbox.client._types import BatchCommand, ExecResult
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


def node_of(session_id: str) -> str:
    """The node id a session id starts with (``<node>-<16 hex>``)."""
    return session_id.rsplit("-", 1)[0]


class Placement:
    """The node table and the choice of a node for each new session (power of ``choices``)."""

    def __init__(self, bootstrap: Sequence[str], *, choices: int, refresh: float, rng: Optional[random.Random]) -> None:
        if not bootstrap:
            raise ValueError("give at least one node address")
        self.bootstrap = list(bootstrap)
        self.choices = max(1, choices)
        self.refresh_interval = refresh
        self.rng = rng or random.Random()
        self.nodes: Dict[str, ClusterNode] = {}
        self._list: List[ClusterNode] = []
        self.refreshed = 0.0
        self.placements: Dict[str, int] = {}

    def stale(self) -> bool:
        return not self.nodes or time.monotonic() - self.refreshed > self.refresh_interval

    def addresses(self) -> List[str]:
        """Where to ask for the table: the known nodes first, then the bootstrap addresses."""
        return list(dict.fromkeys([*(n.address for n in self.nodes.values() if n.address), *self.bootstrap]))

    def update(self, table: pb.Cluster) -> List[ClusterNode]:
        self.nodes = {n.node_id: ClusterNode.from_pb(n) for n in table.nodes if n.address}
        self._list = list(self.nodes.values())
        self.refreshed = time.monotonic()
        return list(self._list)

    def pick(self, pool: str, tried: set) -> Optional[ClusterNode]:
        """The roomiest of ``choices`` eligible nodes drawn at random: O(choices) draws when most
        nodes can take a session (the common case), a scan of the table only when few can."""

        def eligible(n: ClusterNode) -> bool:
            return n.serving and not n.draining and n.free > 0 and n.node_id not in tried

        nodes = self._list
        sample: Dict[str, ClusterNode] = {}
        for _ in range(4 * self.choices):
            if len(sample) == self.choices or not nodes:
                break
            n = nodes[self.rng.randrange(len(nodes))]
            if eligible(n):
                sample[n.node_id] = n
        if len(sample) < min(self.choices, len(nodes)):
            candidates = [n for n in nodes if eligible(n)]
            if not candidates:
                return None
            sample = {n.node_id: n for n in self.rng.sample(candidates, min(self.choices, len(candidates)))}
        return max(sample.values(), key=lambda n: _room(n, pool)) if sample else None

    def node_at(self, address: str) -> str:
        """The id of the node at ``address`` in the table ('' for a bootstrap address not in it)."""
        for node in self.nodes.values():
            if node.address == address:
                return node.node_id
        return ""

    def placed(self, node: ClusterNode, pool: str) -> None:
        node.free = max(node.free - 1, 0)
        if pool and node.ready.get(pool):
            node.ready[pool] -= 1
        self.placements[node.node_id] = self.placements.get(node.node_id, 0) + 1

    def address_of(self, session_id: str) -> str:
        node = self.nodes.get(node_of(session_id))
        if node is None:
            raise KeyError(f"session {session_id} is on no node of the table; refresh() or check the id")
        return node.address

    def none_left(self, tried: set, last: Optional[SandboxRPCError]) -> SandboxRPCError:
        if last is not None:
            return last
        why = f"no node of the cluster has room ({len(self.nodes)} known; tried {sorted(tried)})"
        return ResourceExhaustedError(grpc.StatusCode.RESOURCE_EXHAUSTED, why)

    def by_node(self, commands: Iterable[BatchCommand]) -> Dict[str, List[int]]:
        """Positions of a batch's commands, grouped by the address of each command's node."""
        groups: Dict[str, List[int]] = {}
        for i, c in enumerate(commands):
            groups.setdefault(self.address_of(c.session_id), []).append(i)
        return groups


def _room(node: ClusterNode, pool: str) -> float:
    """A node's room for one more session of ``pool``, as a share of its capacity (so sessions
    spread in proportion to the nodes' sizes): free slots plus READY_WEIGHT per ready sandbox."""
    room = node.free + READY_WEIGHT * _ready(node, pool)
    return room / node.max_sessions if node.max_sessions else float(room)


def _ready(node: ClusterNode, pool: str) -> int:
    return node.ready.get(pool, 0) if pool else max(node.ready.values(), default=0)


def _unanswered(errors: List[str]) -> UnavailableError:
    return UnavailableError(grpc.StatusCode.UNAVAILABLE, f"no node answered GetCluster ({'; '.join(errors)})")


class ClusterClient:
    """Sessions on a cluster of node daemons, placed by the client (grpcio and protobuf only).

    Args:
        addresses: one or more nodes to learn the node table from (any node answers for all).
        choices: nodes sampled per placement (power of ``choices`` choices); the one with the
            most room wins: free session slots plus ready sandboxes of the requested pool, as a
            share of the node's capacity (sessions spread in proportion to the nodes' sizes).
        refresh: seconds a node table is reused; placement costs no call to anyone else.
        Other arguments as :class:`AsyncClient` (one per node, made on first use).

    A session stays on its node (its id starts with the node's id); ``client_for(session_id)``
    is that node's client. A CreateSession refused by a node (RESOURCE_EXHAUSTED, UNAVAILABLE)
    is placed again on another; a node that stops answering only fails the calls of its
    sessions (with the node's address in the error).
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
        self.placement = Placement(
            [addresses] if isinstance(addresses, str) else addresses, choices=choices, refresh=refresh, rng=rng
        )
        self._client_options: Dict[str, Any] = {"timeout": timeout, "token": token, "tls_ca": tls_ca, "metadata": metadata}
        self._clients: Dict[str, AsyncClient] = {}
        self._refreshing: Optional[asyncio.Future[List[ClusterNode]]] = None

    @property
    def nodes(self) -> Dict[str, ClusterNode]:
        return self.placement.nodes

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
            client = self._clients[address] = AsyncClient(address, **self._client_options)
        if not client.node_id:  # named in its errors; a scan of the table once, not per call
            client.node_id = self.placement.node_at(address)
        return client

    async def refresh(self) -> List[ClusterNode]:
        """Ask a known node (or a bootstrap address) for the node table; one call at a time."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh())
        return await asyncio.shield(self._refreshing)

    async def _refresh(self) -> List[ClusterNode]:
        errors = []
        for address in self.placement.addresses():
            try:
                return self.placement.update(await self._client(address)._call("GetCluster", pb.GetClusterRequest()))
            except SandboxRPCError as e:
                errors.append(f"{address}: {e.message}")
        raise _unanswered(errors)

    def client_for(self, session_id: str) -> AsyncClient:
        """The client of the node that holds ``session_id``."""
        return self._client(self.placement.address_of(session_id))

    async def create_session(self, pool: str = "", **options: Unpack[SessionOptions]) -> AsyncSession:
        """A session on the node with the most room among ``choices`` sampled (options as
        :meth:`AsyncClient.create_session`); placed again elsewhere if that node refuses."""
        if self.placement.stale():
            await self.refresh()
        tried: set = set()
        last: Optional[SandboxRPCError] = None
        while True:
            node = self.placement.pick(pool, tried)
            if node is None:
                raise self.placement.none_left(tried, last)
            tried.add(node.node_id)
            try:
                session = await self._client(node.address).create_session(pool, **options)
            except (ResourceExhaustedError, UnavailableError) as e:
                node.free = 0  # until the next refresh says otherwise
                last = e
                continue
            self.placement.placed(node, pool)
            return session

    async def exec_batch(self, commands: Iterable[BatchCommand]) -> List[Union[ExecResult, SandboxRPCError]]:
        """One command in each of many sessions on any nodes: one ExecBatch per node, at once;
        results in the order of ``commands``."""
        commands = list(commands)
        groups = self.placement.by_node(commands)

        async def one(address: str, positions: List[int]) -> List[Union[ExecResult, SandboxRPCError]]:
            return await self._client(address).exec_batch([commands[i] for i in positions])

        answers = await asyncio.gather(*(one(a, p) for a, p in groups.items()))
        return _reassemble(len(commands), groups, answers)


class BlockingClusterClient:
    """The blocking twin of :class:`ClusterClient` (the same placement, :class:`Client` per node)."""

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
        self.placement = Placement(
            [addresses] if isinstance(addresses, str) else addresses, choices=choices, refresh=refresh, rng=rng
        )
        self._client_options: Dict[str, Any] = {"timeout": timeout, "token": token, "tls_ca": tls_ca, "metadata": metadata}
        self._clients: Dict[str, Client] = {}
        self._lock = threading.Lock()  # rollout workers share one client from many threads

    @property
    def nodes(self) -> Dict[str, ClusterNode]:
        return self.placement.nodes

    def __enter__(self) -> BlockingClusterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()

    def _client(self, address: str) -> Client:
        with self._lock:
            client = self._clients.get(address)
            if client is None:
                client = self._clients[address] = Client(address, **self._client_options)
            if not client.node_id:  # named in its errors; a scan of the table once, not per call
                client.node_id = self.placement.node_at(address)
            return client

    def refresh(self) -> List[ClusterNode]:
        errors = []
        for address in self.placement.addresses():
            try:
                table = self._client(address)._call("GetCluster", pb.GetClusterRequest())
            except SandboxRPCError as e:
                errors.append(f"{address}: {e.message}")
                continue
            with self._lock:
                return self.placement.update(table)
        raise _unanswered(errors)

    def client_for(self, session_id: str) -> Client:
        return self._client(self.placement.address_of(session_id))

    def create_session(self, pool: str = "", **options: Unpack[SessionOptions]) -> Session:
        """As :meth:`ClusterClient.create_session`."""
        if self.placement.stale():
            self.refresh()
        tried: set = set()
        last: Optional[SandboxRPCError] = None
        while True:
            with self._lock:
                node = self.placement.pick(pool, tried)
            if node is None:
                raise self.placement.none_left(tried, last)
            tried.add(node.node_id)
            try:
                session = self._client(node.address).create_session(pool, **options)
            except (ResourceExhaustedError, UnavailableError) as e:
                node.free = 0
                last = e
                continue
            with self._lock:
                self.placement.placed(node, pool)
            return session

    def exec_batch(self, commands: Iterable[BatchCommand]) -> List[Union[ExecResult, SandboxRPCError]]:
        """As :meth:`ClusterClient.exec_batch` (the nodes' batches one after the other)."""
        commands = list(commands)
        groups = self.placement.by_node(commands)
        answers = [self._client(a).exec_batch([commands[i] for i in p]) for a, p in groups.items()]
        return _reassemble(len(commands), groups, answers)


def _reassemble(n: int, groups: Dict[str, List[int]], answers: Sequence[Sequence[Any]]) -> List[Any]:
    out: List[Any] = [None] * n
    for g, positions in enumerate(groups.values()):  # (no zip(strict=): the client supports Python 3.9)
        for k, i in enumerate(positions):
            out[i] = answers[g][k]
    return out


__all__ = ["BlockingClusterClient", "ClusterClient", "ClusterNode", "Placement", "node_of"]
