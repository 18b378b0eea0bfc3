"""The central aggregator: a durable JetStream consumer writing into the store, and a query API.

Several aggregator processes can share the work: they bind to the same durable consumer as one
queue group, so each message goes to one of them; the store's primary keys make a redelivered message harmless.
A message is acknowledged only after the transaction holding it committed, so an aggregator
killed at any point loses nothing: what it had not acknowledged is delivered again.

HTTP API (JSON): ``/v1/runs``, ``/v1/tasks[?run=R]``, ``/v1/nodes``, ``/v1/alerts``,
``/v1/integrity``, ``/v1/sessions/<id>`` (timeline), ``/v1/trajectories?run=R`` (JSONL).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
import orjson
from aiohttp import web
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from rlsandbox.daemon.events.connection import NatsAuth
from rlsandbox.daemon.events.model import CONSUMER, STREAM, SUBJECT_ROOT
from rlsandbox.daemon.events.publisher import ensure_stream
from rlsandbox.daemon.events.store import Store

log = logging.getLogger(__name__)

ACK_WAIT = 10.0  # seconds before an unacknowledged message (its aggregator died) is delivered again
MAX_ACK_PENDING = 20_000
FLUSH_INTERVAL = 0.05  # seconds a partial batch waits before it is written


class Aggregator:
    """Consumes the events stream into ``Store(db_path)``; ``await run()`` until ``stop()``."""

    def __init__(
        self,
        nats_url: str,
        db_path: str | Path,
        *,
        durable: str = CONSUMER,
        stream: str = STREAM,
        batch: int = 1000,
        http: str | None = None,
        auth: NatsAuth | None = None,
    ) -> None:
        self.nats_url = nats_url
        self._auth_options = (auth or NatsAuth()).connect_options()
        self.store = Store(db_path)
        self.durable = durable
        self.stream = stream
        self.batch = batch
        self.http = http
        self.http_port: int | None = None
        self.applied_total = 0
        self.duplicates_total = 0
        self.invalid_total = 0
        self._stop = asyncio.Event()
        self._nc: NATS | None = None
        self._runner: web.AppRunner | None = None
        self.started = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        if self.http:
            await self._start_http(self.http)
        try:
            while not self._stop.is_set():
                try:
                    await self._consume()
                except (nats.errors.Error, nats.js.errors.Error, OSError, TimeoutError) as e:
                    log.warning("aggregator: %s: %s; retrying", type(e).__name__, e)
                    await self._close_nats()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(1.0):
                            await self._stop.wait()
        finally:
            await self._close_nats()
            if self._runner is not None:
                await self._runner.cleanup()
            self.store.close()

    async def _close_nats(self) -> None:
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()
            self._nc = None

    async def _consume(self) -> None:
        self._nc = await nats.connect(
            self.nats_url,
            name="rlsandbox-aggregator",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            connect_timeout=2,
            **self._auth_options,
        )
        js = self._nc.jetstream(timeout=10)
        await ensure_stream(js, self.stream)
        # One durable push consumer with a fixed delivery subject, created idempotently (the same
        # config from every aggregator), and a queue subscription on that subject from each one:
        # every aggregator gets a share. (Binding through js.subscribe raced when two aggregators
        # started at once: the second re-created the consumer with its own delivery inbox.)
        deliver = f"_RLSANDBOX.deliver.{self.durable}"
        config = ConsumerConfig(
            durable_name=self.durable,
            deliver_group=self.durable,
            deliver_subject=deliver,
            filter_subject=f"{SUBJECT_ROOT}.>",
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=ACK_WAIT,
            max_ack_pending=MAX_ACK_PENDING,
            max_deliver=-1,
        )
        buffer: list[Msg] = []
        wake = asyncio.Event()

        async def on_msg(msg: Msg) -> None:
            buffer.append(msg)
            if len(buffer) >= self.batch:
                wake.set()

        await js.add_consumer(self.stream, config)
        sub = await self._nc.subscribe(deliver, queue=self.durable, cb=on_msg, pending_msgs_limit=4 * MAX_ACK_PENDING)
        self.started.set()
        log.info("aggregator: consuming %s as %s into %s", self.stream, self.durable, self.store.path)
        try:
            while not self._stop.is_set():
                if len(buffer) < self.batch:
                    wake.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(FLUSH_INTERVAL):
                            await wake.wait()
                if not buffer:
                    continue
                msgs, buffer[:] = buffer[:], []
                new, dup, bad = await asyncio.to_thread(self.store.apply, [m.data for m in msgs])
                self.applied_total += new
                self.duplicates_total += dup
                self.invalid_total += bad
                if bad:
                    log.warning("aggregator: %d message(s) that are not rlsandbox v1 events were skipped", bad)
                # Acknowledged only now that the transaction holding them committed.
                for m in msgs:
                    await self._nc.publish(m.reply, b"+ACK")
                await self._nc.flush()
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    # -- HTTP API -------------------------------------------------------------------------------
    async def _start_http(self, listen: str) -> None:
        host, _, port = listen.rpartition(":")
        app = web.Application()

        def json_response(value: Any) -> web.Response:
            return web.Response(body=orjson.dumps(value), content_type="application/json")

        async def runs(_: web.Request) -> web.Response:
            return json_response(await asyncio.to_thread(self.store.runs))

        async def tasks(req: web.Request) -> web.Response:
            return json_response(await asyncio.to_thread(self.store.tasks, req.query.get("run")))

        async def nodes(_: web.Request) -> web.Response:
            return json_response(await asyncio.to_thread(self.store.nodes))

        async def alerts(_: web.Request) -> web.Response:
            return json_response(await asyncio.to_thread(self.store.alerts))

        async def integrity(_: web.Request) -> web.Response:
            return json_response(await asyncio.to_thread(self.store.integrity))

        async def session(req: web.Request) -> web.Response:
            timeline = await asyncio.to_thread(self.store.timeline, req.match_info["session"])
            if not timeline:
                raise web.HTTPNotFound(text=f"no events of session {req.match_info['session']}")
            return json_response(timeline)

        async def trajectories(req: web.Request) -> web.Response:
            run = req.query.get("run")
            if not run:
                raise web.HTTPBadRequest(text="trajectories need ?run=<run label>")
            lines = await asyncio.to_thread(lambda: b"".join(orjson.dumps(t) + b"\n" for t in self.store.trajectories(run)))
            return web.Response(body=lines, content_type="application/x-ndjson")

        app.add_routes(
            [
                web.get("/v1/runs", runs),
                web.get("/v1/tasks", tasks),
                web.get("/v1/nodes", nodes),
                web.get("/v1/alerts", alerts),
                web.get("/v1/integrity", integrity),
                web.get("/v1/sessions/{session}", session),
                web.get("/v1/trajectories", trajectories),
            ]
        )
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host or "127.0.0.1", int(port))
        await site.start()
        server = site._server
        if server is not None and getattr(server, "sockets", None):
            self.http_port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
        log.info("aggregator: HTTP API on %s:%s", host or "127.0.0.1", self.http_port)
