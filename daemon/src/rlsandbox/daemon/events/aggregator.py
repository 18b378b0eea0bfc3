"""The central aggregator: a durable JetStream consumer writing into the store, and a query API.

Several aggregator processes can share the work: they bind to the same durable consumer as one
queue group, so each message goes to one of them; the store's primary keys make a redelivered message harmless.
A message is acknowledged only after the transaction holding it committed, so an aggregator
killed at any point loses nothing: what it had not acknowledged is delivered again.

It also judges reward anomalies per run (events/anomalies.py) and publishes them as alert events,
and serves the HTTP query API, the live dashboard and Prometheus metrics (events/web.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
from aiohttp import web
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from rlsandbox.daemon.errors import Unavailable
from rlsandbox.daemon.events import access
from rlsandbox.daemon.events.anomalies import AnomalyRules, judge, windows_to_judge
from rlsandbox.daemon.events.connection import NatsAuth, servers
from rlsandbox.daemon.events.model import CONSUMER, STREAM, SUBJECT_ROOT
from rlsandbox.daemon.events.publisher import ensure_stream
from rlsandbox.daemon.events.store import Store
from rlsandbox.daemon.events.web import app as web_app

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
        http_token: str | None = None,
        http_hosts: tuple[str, ...] = (),
        auth: NatsAuth | None = None,
        anomaly_rules: AnomalyRules | None = None,
    ) -> None:
        self.nats_url = nats_url
        self._auth_options = (auth or NatsAuth()).connect_options()
        self.store = Store(db_path)
        self.durable = durable
        self.stream = stream
        self.batch = batch
        self.http = http
        # Checked here, before anything starts: beyond loopback without a token is refused.
        self._access = access.middleware(http, token=http_token, hosts=http_hosts) if http else None
        self.http_port: int | None = None
        self.applied_total = 0
        self.duplicates_total = 0
        self.invalid_total = 0
        self.anomalies_total = 0
        self.store_errors_total = 0  # batches the database did not take (it did not answer)
        self.version = 0  # bumped whenever the store took new events
        self.anomaly_rules = anomaly_rules or AnomalyRules()
        self._published: dict[str, None] = {}  # anomaly ids this process published (in order)
        self._stop = asyncio.Event()
        self._nc: NATS | None = None
        self._runner: web.AppRunner | None = None
        self.started = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        if self.http:
            await self._start_http(self.http)
        anomalies = asyncio.create_task(self._watch_anomalies(), name="aggregator-anomalies")
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
            self._stop.set()
            anomalies.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await anomalies
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
            servers(self.nats_url),
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
        log.info("aggregator: consuming %s as %s into %s", self.stream, self.durable, self.store.where)
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
                applied = await self._apply(msgs)
                if applied is None:
                    return  # stopping with the batch not stored: not acknowledged, JetStream keeps it
                new, dup, bad = applied
                self.applied_total += new
                if new:
                    self.version += 1  # open dashboards refresh (events/web.py, /v1/stream)
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

    async def _apply(self, msgs: list[Msg]) -> tuple[int, int, int] | None:
        """Into the store; while the database does not answer (PostgreSQL restarting or failing
        over), the same batch again every second, unacknowledged (JetStream keeps it). None: the
        aggregator stops before the database came back."""
        while True:
            try:
                return await asyncio.to_thread(self.store.apply, [m.data for m in msgs])
            except Unavailable as e:
                self.store_errors_total += 1
                log.warning("aggregator: %s; trying again", e)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await self._stop.wait()
                if self._stop.is_set():
                    return None

    # -- reward anomalies (events/anomalies.py) --------------------------------------------------
    async def _watch_anomalies(self) -> None:
        """Judge the last complete windows of every run and publish what is anomalous as alert
        events (the consumer stores them like any other; their ids make repeats harmless)."""
        rules = self.anomaly_rules
        interval = max(min(rules.window / 4, 10.0), 0.2)
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._stop.wait()
            nc = self._nc
            if self._stop.is_set() or nc is None or not nc.is_connected:
                continue
            now = time.time()
            judged = windows_to_judge(now, rules)
            first = judged.start - rules.baseline_windows
            try:
                stats = await asyncio.to_thread(self.store.window_stats, first, judged.stop - 1, rules.window)
            except Exception as e:  # the database restarting: judged at the next check, the watcher lives on
                log.warning("aggregator: anomaly check skipped: %s: %s", type(e).__name__, e)
                continue
            js = nc.jetstream(timeout=5)
            for anomaly in judge(stats, now, rules):
                event = anomaly.event(rules)
                if event.msg_id in self._published:
                    continue
                try:
                    await js.publish(event.subject, event.to_json(), headers={"Nats-Msg-Id": event.msg_id})
                except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as e:
                    log.warning("aggregator: could not publish anomaly %s (%s); retried at the next check", event.msg_id, e)
                    break
                self._published[event.msg_id] = None
                self.anomalies_total += 1
                log.warning("reward anomaly in run %s: %s", anomaly.run, anomaly.kind, extra={"fields": anomaly.data})
            while len(self._published) > 10_000:  # a window is only judged look_back times
                self._published.pop(next(iter(self._published)))

    # -- HTTP API and dashboard (events/web.py) --------------------------------------------------
    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def _start_http(self, listen: str) -> None:
        host, _, port = listen.rpartition(":")
        middlewares = [self._access] if self._access is not None else []
        self._runner = web.AppRunner(web_app(self, middlewares), access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host or "127.0.0.1", int(port))
        await site.start()
        server = site._server
        if server is not None and getattr(server, "sockets", None):
            self.http_port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
        log.info("aggregator: HTTP API and dashboard on http://%s:%s/", host or "127.0.0.1", self.http_port)
