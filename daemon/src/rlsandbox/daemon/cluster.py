"""Membership and capacity over NATS: each node keeps its record in a JetStream key-value bucket.

Every ``heartbeat_interval`` a node puts ``{node, address, sessions, max_sessions, free, pools
(ready, in use, max total), load1, serving, ts}`` under its own key of ``RLSANDBOX_NODES``, a
bucket whose entries expire ``ttl`` seconds after their last write (three intervals): a node that
stops updating (crashed, partitioned) drops out within seconds without anyone deciding it; a node
that stops in order deletes its key at once. Any node answers ``GetCluster`` from the table a
watcher keeps from the bucket's updates (no request to NATS per call), so a
client learns the whole table from whichever node it reaches (client ``ClusterClient``) and places
sessions itself: no central scheduler on the hot path.

Each node also registers as a NATS micro service (``rlsandbox``, one instance per node), so
standard NATS tooling sees the nodes: ``$SRV.PING.rlsandbox`` (``nats micro ls``) lists them,
``$SRV.INFO``/``$SRV.STATS`` describe them (metadata: node id and address), and the endpoint
``rlsandbox.node.<node>.status`` answers the node's current record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from typing import Any

import nats
import nats.errors
import nats.js.errors
import nats.micro
import orjson
from nats.js.api import KeyValueConfig
from nats.js.kv import KV_DEL, KV_PURGE
from nats.micro.request import Request
from rlsandbox.daemon import __version__
from rlsandbox.daemon.events.connection import NatsAuth, servers
from rlsandbox.daemon.events.model import token

log = logging.getLogger(__name__)

BUCKET = "RLSANDBOX_NODES"
SERVICE = "rlsandbox"  # the NATS micro service every node registers as
CACHE = 1.0  # seconds a read of the table is reused


MAX_FUTURE = 30.0  # seconds a record's time may be ahead of this node's clock (their clocks differ)
_ADDRESS = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]{1,253}):[0-9]{1,5}$|^unix:/[^\s]{1,200}$")
_COUNT_MAX = 10_000_000


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _COUNT_MAX:
        return None
    return value


def node_record(key: str, value: Any, now: float, ttl: float) -> dict[str, Any] | None:
    """A node table entry as a reader may use it, or None: anything on the bus is read as
    untrusted input. The record must be a live node's (its ``ts`` a finite time no more than
    ``ttl`` old and not ahead of ``now`` by more than ``MAX_FUTURE``), under the key its own id
    makes (a record claiming another node's id under a key of its own is not that node), with an
    address of host:port and counts in range. The result holds only those fields, normalized."""
    if not isinstance(value, dict):
        return None
    node, address, ts = value.get("node"), value.get("address"), value.get("ts")
    if not isinstance(node, str) or not 0 < len(node) <= 256 or token(node) != key:
        return None
    if not isinstance(address, str) or not _ADDRESS.match(address):
        return None
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        return None
    if not now - ttl <= ts <= now + MAX_FUTURE:
        return None
    sessions, max_sessions, free = (_count(value.get(k, 0)) for k in ("sessions", "max_sessions", "free"))
    if sessions is None or max_sessions is None or free is None or free > max_sessions:
        return None
    load1 = value.get("load1", 0.0)
    if isinstance(load1, bool) or not isinstance(load1, (int, float)) or not 0 <= load1 < 1e6:
        return None
    pools_in = value.get("pools", {})
    if not isinstance(pools_in, dict) or len(pools_in) > 10_000:
        return None
    pools: dict[str, dict[str, int]] = {}
    for name, pool in pools_in.items():
        if not isinstance(name, str) or len(name) > 256 or not isinstance(pool, dict):
            return None
        counts = {k: _count(pool.get(k, 0)) for k in ("ready", "in_use", "max_total")}
        if any(c is None for c in counts.values()):
            return None
        pools[name] = {k: int(c or 0) for k, c in counts.items()}
    serving, draining = value.get("serving", False), value.get("draining", False)
    if not isinstance(serving, bool) or not isinstance(draining, bool):
        return None
    return {
        "node": node, "address": address, "sessions": sessions, "max_sessions": max_sessions, "free": free,
        "pools": pools, "load1": float(load1), "serving": serving, "draining": draining, "ts": float(ts),
    }  # fmt: skip


class Membership:
    def __init__(self, nats_url: str, node_id: str, *, interval: float, auth: NatsAuth | None = None, replicas: int = 1) -> None:
        self.nats_url = nats_url
        self.node_id = node_id
        self.key = token(node_id)
        self.ttl = max(3 * interval, 2.0)
        self.replicas = replicas
        self._auth = auth or NatsAuth()
        self._nc: Any = None
        self._kv: Any = None
        self._cache: tuple[float, list[dict[str, Any]]] = (0.0, [])
        self._service: Any = None  # the micro service, on the current connection
        self._record: dict[str, Any] = {}
        self._left = False  # an orderly stop took this node out: no record, no service any more
        # The node table from a watcher on the bucket (None until its current values are in).
        self._table: dict[str, dict[str, Any]] | None = None
        self._table_updated = 0.0
        self._watch_task: asyncio.Task[None] | None = None
        self.watched_total = 0
        self.published_total = 0
        self.rejected_total = 0  # node table entries read and refused (node_record)
        self._warned: set[str] = set()  # keys whose refused record was logged (once each)

    @property
    def status_subject(self) -> str:
        return f"{SERVICE}.node.{self.key}.status"

    async def _bucket(self) -> Any:
        if self._nc is None or not self._nc.is_connected:
            self._nc = await nats.connect(
                servers(self.nats_url),
                name=f"rlsandbox-membership-{self.node_id}",
                connect_timeout=5,
                **self._auth.connect_options(),
            )
            self._kv = None
            self._service = None
        if self._kv is None:
            js = self._nc.jetstream(timeout=5)
            try:
                self._kv = await js.key_value(BUCKET)
            except (nats.js.errors.BucketNotFoundError, nats.js.errors.NotFoundError):
                config = KeyValueConfig(
                    bucket=BUCKET, history=1, ttl=self.ttl, replicas=self.replicas, description="rlsandbox nodes and capacity"
                )
                self._kv = await js.create_key_value(config)
        return self._kv

    async def publish(self, record: dict[str, Any]) -> None:
        """Put this node's record (its liveness: the entry expires ``ttl`` after the last put)."""
        if self._left:
            return
        kv = await self._bucket()
        self._record = {**record, "node": self.node_id, "ts": time.time()}
        await kv.put(self.key, orjson.dumps(self._record))
        self.published_total += 1
        if self._service is None:
            await self._register(record.get("address", ""))

    async def _register(self, address: str) -> None:
        """This node as an instance of the ``rlsandbox`` micro service on the current connection
        (the client restores its subscriptions across reconnects; a new connection registers again)."""

        async def status(request: Request) -> None:
            await request.respond(orjson.dumps(self._record))

        service = await nats.micro.add_service(
            self._nc,
            name=SERVICE,
            version=__version__,
            description="rlsandbox node daemon: sandboxes for agent RL",
            metadata={"node": self.node_id, "address": str(address)},
        )
        await service.add_endpoint(name="status", subject=self.status_subject, handler=status)
        self._service = service

    async def nodes(self) -> list[dict[str, Any]]:
        """The records of the live nodes: from the table a watcher keeps in memory (the bucket's
        updates; no request to NATS per call), or read from the bucket (at most once a second)
        while the watcher is starting or has seen nothing for an entry's lifetime (this node's own
        heartbeat would have arrived: it is stuck or cut off)."""
        if self._watch_task is None or self._watch_task.done():
            self._watch_task = asyncio.get_running_loop().create_task(self._watch(), name="membership-watch")
        now = time.time()
        if self._table is not None and time.monotonic() - self._table_updated <= self.ttl:
            live = self._valid(self._table.items(), now)
            # This node's own record, put in the bucket, missing from the watched table: the
            # watcher is behind (its server was lost and its consumer not yet moved), not the node.
            if self.key in live or self._left or self.published_total == 0:
                return list(live.values())
        at, cached = self._cache
        if time.monotonic() - at < CACHE:
            return cached
        kv = await self._bucket()
        try:
            keys = await kv.keys()
        except nats.js.errors.NoKeysError:
            keys = []
        read: list[tuple[str, Any]] = []
        for key in keys:
            with contextlib.suppress(nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError, orjson.JSONDecodeError):
                entry = await kv.get(key)
                read.append((key, orjson.loads(entry.value or b"{}")))
        records = list(self._valid(read, time.time()).values())
        self._cache = (time.monotonic(), records)
        return records

    def _valid(self, entries: Any, now: float) -> dict[str, dict[str, Any]]:
        """The entries that are live nodes' records (node_record); the others counted, and logged
        once per key unless they merely aged out."""
        live: dict[str, dict[str, Any]] = {}
        for key, value in entries:
            record = node_record(key, value, now, self.ttl)
            if record is not None:
                live[key] = record
                continue
            ts = value.get("ts") if isinstance(value, dict) else None
            if isinstance(ts, (int, float)) and not isinstance(ts, bool) and now - self.ttl > ts:
                continue  # a node that stopped: its entry expires
            self.rejected_total += 1
            if key not in self._warned and len(self._warned) < 1000:
                self._warned.add(key)
                log.warning("membership: the node table entry %r is not a node's record; ignored", key[:64])
        return live

    async def _watch(self) -> None:
        """Keep the node table in memory from the bucket's puts and deletes; entries that expire
        (a node that stopped updating) leave no marker, so readers drop records older than ``ttl``."""
        pause = 1.0  # between attempts while NATS does not answer, doubled up to 30 s (one warning each)
        while True:
            watcher: Any = None
            try:
                watcher = await (await self._bucket()).watchall()
                table: dict[str, dict[str, Any]] = {}
                async for entry in watcher:
                    self._table_updated = time.monotonic()
                    if entry is None:  # the current values are in: the table is whole from now on
                        self._table = table
                        pause = 1.0
                        continue
                    if entry.operation in (KV_DEL, KV_PURGE):
                        table.pop(entry.key, None)
                        continue
                    with contextlib.suppress(orjson.JSONDecodeError):
                        record = orjson.loads(entry.value or b"{}")
                        if isinstance(record, dict):
                            table[entry.key] = record
                    self.watched_total += 1
            except asyncio.CancelledError:
                raise
            except (nats.errors.Error, nats.js.errors.Error, OSError, TimeoutError) as e:
                log.warning("membership: the node table watcher stopped (%s); reading the bucket meanwhile", e)
            finally:
                self._table = None
                if watcher is not None:
                    with contextlib.suppress(Exception):
                        await watcher.stop()
            await asyncio.sleep(pause)
            pause = min(pause * 2, 30.0)

    async def leave(self) -> None:
        """Take this node out of the table now (an orderly stop); errors only logged."""
        self._left = True
        try:
            if self._service is not None:
                service, self._service = self._service, None
                await service.stop()
            kv = await self._bucket()
            await kv.delete(self.key)
        except (nats.errors.Error, nats.js.errors.Error, OSError, TimeoutError) as e:
            log.warning("membership: could not leave the node table (%s); the entry expires in %.0f s", e, self.ttl)

    async def close(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(BaseException):
                await self._watch_task
            self._watch_task = None
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()
            self._nc = None
            self._kv = None
