"""The daemon's event publisher: off the hot path, acknowledged, never silently lossy.

``emit`` is a synchronous append to an in-memory queue (microseconds, on the event loop). A
background task publishes batches to JetStream with ``publish_async`` (pipelined, each message
acknowledged, ``Nats-Msg-Id`` set). When NATS is unreachable, or does not acknowledge a batch in
time, events go to the durable outbox instead, and everything after them too (order is kept);
the outbox is replayed, oldest first, once NATS answers again. When the outbox is full, events are
counted as dropped and an alert event says how many, as soon as one can be published. Sessions
never wait for any of this.

The stream is declared here (and re-declared after every reconnect): a server restarted without
its store gets it back before the next publish.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import StorageType, StreamConfig
from rlsandbox.daemon.events.connection import NatsAuth, servers
from rlsandbox.daemon.events.encoding import MAX_MESSAGE_BYTES, Encoder, Record
from rlsandbox.daemon.events.model import (
    ALERT,
    DUPLICATE_WINDOW,
    STREAM,
    STREAM_SUBJECTS,
    Event,
)
from rlsandbox.daemon.events.outbox import Outbox

log = logging.getLogger(__name__)

BATCH = 512
MEMORY_QUEUE_LIMIT = 50_000  # beyond this many unpublished events in memory, spill to the outbox


@dataclass(frozen=True, slots=True)
class PublisherStats:
    connected: bool
    published_total: int
    queued: int
    outbox_events: int
    outbox_bytes: int
    outbox_max_bytes: int
    dropped_total: int
    last_error: str
    cut_total: int = 0
    dead_lettered_total: int = 0


async def ensure_stream(js: Any, stream: str = STREAM, replicas: int | None = None, max_age: float | None = None) -> None:
    """Declare the events stream (file storage, duplicate window, ``replicas`` copies in a NATS
    cluster, events kept ``max_age`` seconds, 0 forever); update it where it differs. Replicas
    are only ever raised, and what a caller does not say (None) it leaves as it is: daemons
    configured with 3 and an aggregator that does not say never undo each other."""
    try:
        info = await js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        info = None
    have = (info.config.num_replicas or 1) if info is not None else 1
    wanted = max(have, replicas or 1)
    age = max_age if max_age is not None else (info.config.max_age or 0.0) if info is not None else 0.0
    config = StreamConfig(
        name=stream,
        subjects=STREAM_SUBJECTS,
        storage=StorageType.FILE,
        duplicate_window=DUPLICATE_WINDOW,
        num_replicas=wanted,
        max_age=age,
    )
    if info is None:
        try:
            await js.add_stream(config)
            return
        except nats.js.errors.BadRequestError:  # made meanwhile by another node
            info = await js.stream_info(stream)
    current = info.config
    if (
        sorted(current.subjects or []) != sorted(STREAM_SUBJECTS)
        or current.storage != StorageType.FILE
        or current.duplicate_window != DUPLICATE_WINDOW
        or (current.num_replicas or 1) < wanted
        or abs((current.max_age or 0.0) - age) > 1e-3
    ):
        await js.update_stream(config)


class _Acks:
    __slots__ = ("acked", "done", "error", "expected")

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.acked = 0
        self.error = ""
        self.done = asyncio.Event()


STOP_TIMEOUT = 5.0  # seconds stop() waits for its tasks and for the NATS connection to close


class EventPublisher:
    """Publishes the node's events. ``start()``, ``emit()`` any number of times, ``stop()``.

    Args:
        node_id, instance: this daemon (node events are numbered per instance).
        nats_url: the NATS server(s), comma-separated.
        outbox_path, outbox_max_bytes: the durable outbox.
        publish_timeout: seconds for a batch's acknowledgements before it goes to the outbox.
        linger: seconds a non-full batch waits for more events before it is published.
        step_batch: step events per batch message (1: every step on its own session subject).
        auth: credentials for NATS (see :mod:`rlsandbox.daemon.events.connection`).
        replicas: copies of the events stream in a NATS cluster (raised, never lowered).
        max_age: seconds JetStream keeps an event (0: forever); None leaves the stream's setting.
    """

    def __init__(
        self,
        node_id: str,
        instance: str,
        *,
        nats_url: str,
        outbox_path: str | Path,
        outbox_max_bytes: int,
        publish_timeout: float = 5.0,
        stream: str = STREAM,
        linger: float = 0.02,
        step_batch: int = 256,
        auth: NatsAuth | None = None,
        replicas: int | None = None,
        max_age: float | None = None,
    ) -> None:
        self._auth_options = (auth or NatsAuth()).connect_options()
        self.replicas = replicas
        self.max_age = max_age
        self.linger = linger
        self.encoder = Encoder(node_id, instance, step_batch)
        self.node_id = node_id
        self.instance = instance
        self.nats_url = nats_url
        self.publish_timeout = publish_timeout
        # Told about every batch of events once it is durable: acknowledged by JetStream, or in
        # the outbox (or counted as dropped by a full outbox). The session manager uses it to
        # answer a call only once that call's events cannot be lost.
        self.on_durable: Callable[[list[Event]], None] | None = None
        self.stream = stream
        self.outbox = Outbox(outbox_path, outbox_max_bytes)
        self._queue: collections.deque[Event] = collections.deque()
        self._wake = asyncio.Event()
        self._urgent = asyncio.Event()
        self._nc: NATS | None = None
        self._js: Any = None
        self._ack_prefix: str | None = None
        self._acks: dict[int, _Acks] = {}
        self._batch_no = 0
        self._ready = False  # connected and the stream asserted
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._node_seq = 0
        self.published_total = 0
        self.dropped_total = 0
        self.dead_lettered_total = 0  # messages NATS refused for their content, kept apart
        self._refused = ""  # why NATS refused the last batch for its content, if it did
        self._dropped_unreported = 0
        self.last_error = ""

    # -- the hot path ---------------------------------------------------------------------------
    def emit(self, event: Event) -> None:
        self._queue.append(event)
        if not self._wake.is_set():
            self._wake.set()

    def flush_soon(self) -> None:
        """Someone waits for the events emitted so far to be durable: do not linger for more."""
        self._urgent.set()
        if not self._wake.is_set():
            self._wake.set()

    def emit_node(self, type_: str, data: dict[str, Any]) -> None:
        self.emit(self._node_event(type_, data))

    def _node_event(self, type_: str, data: dict[str, Any]) -> Event:
        self._node_seq += 1
        return Event(type_, self.node_id, "", self._node_seq, {**data, "instance": self.instance}, instance=self.instance)

    # -- lifecycle ------------------------------------------------------------------------------
    async def open(self) -> None:
        """Open the outbox (its file I/O in a worker thread); ``start`` does it if nobody did."""
        await asyncio.to_thread(self.outbox.open)

    async def start(self) -> None:
        await self.open()
        self._tasks = [asyncio.create_task(self._connect_loop(), name="events-connect")]
        self._tasks.append(asyncio.create_task(self._publish_loop(), name="events-publish"))

    async def stop(self, drain_timeout: float = 10.0) -> None:
        """Publish what is queued (up to ``drain_timeout``), keep the rest in the outbox, close."""
        self._stopping = True
        self._wake.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(drain_timeout):
                while (self._queue or self.outbox.count) and self._ready:  # noqa: ASYNC110 - watching the publish loop drain
                    await asyncio.sleep(0.05)
        for task in self._tasks:
            task.cancel()
        # Bounded: a nats-py connect refused by the server (a wrong token) was seen to outlive
        # its cancellation once in CI, and the daemon's shutdown must not wait on NATS.
        if self._tasks:
            _, stuck = await asyncio.wait(self._tasks, timeout=STOP_TIMEOUT)
            if stuck:
                log.warning("events: %d publisher tasks did not stop within %.0f s; left behind", len(stuck), STOP_TIMEOUT)
        if self._queue:  # not published in time: keep them for the next start
            await self.open()
            await self._to_outbox(list(self._queue))
            self._queue.clear()
        if self._nc is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(STOP_TIMEOUT):
                    await self._nc.close()
        self.outbox.close()

    def stats(self) -> PublisherStats:
        return PublisherStats(
            connected=self._ready,
            published_total=self.published_total,
            queued=len(self._queue),
            outbox_events=self.outbox.count,
            outbox_bytes=self.outbox.bytes,
            outbox_max_bytes=self.outbox.max_bytes,
            dropped_total=self.dropped_total,
            last_error=self.last_error,
            cut_total=self.encoder.cut_total,
            dead_lettered_total=self.dead_lettered_total,
        )

    # -- connection -----------------------------------------------------------------------------
    async def _connect_loop(self) -> None:
        """Connect (retrying forever: nats-py does not retry a failed first connect by itself)."""
        while self._nc is None:
            # Our own client object, so that a connect cut short (stop() while the server keeps
            # refusing us: nats-py retries the first connect forever with reconnects unlimited)
            # can be closed instead of leaving nats-py's reader and pinger tasks behind.
            nc = NATS()
            try:
                await nc.connect(
                    servers(self.nats_url),
                    name=f"rlsandbox-daemon {self.node_id}",
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,  # type: ignore[arg-type]  # annotated int, used as asyncio.sleep seconds
                    connect_timeout=2,
                    disconnected_cb=self._on_disconnect,
                    reconnected_cb=self._on_reconnect,
                    error_cb=self._on_error,
                    pending_size=64 * 1024 * 1024,
                    **self._auth_options,
                )
                self._nc = nc
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(2.0):
                        await nc.close()
                raise
            except Exception as e:
                self.last_error = f"cannot connect to NATS at {self.nats_url}: {e}"
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(2.0):
                        await nc.close()
                await asyncio.sleep(1.0)
        self._js = self._nc.jetstream(timeout=self.publish_timeout)
        server_max = int(getattr(self._nc, "max_payload", 0) or 0)
        if server_max:
            self.encoder.limit = min(MAX_MESSAGE_BYTES, server_max - 1024)
        await self._assert_stream()

    async def _assert_stream(self) -> None:
        while not self._stopping:
            try:
                await ensure_stream(self._js, self.stream, self.replicas, self.max_age)
                self._ready = True
                self.last_error = ""
                self._wake.set()
                log.info("events: connected to %s, stream %s ready", self.nats_url, self.stream)
                return
            except Exception as e:
                self.last_error = f"cannot declare stream {self.stream}: {e}"
                await asyncio.sleep(1.0)

    async def _on_disconnect(self) -> None:
        self._ready = False
        if not self._stopping:
            log.warning("events: disconnected from NATS; events go to the outbox meanwhile")

    async def _on_reconnect(self) -> None:
        asyncio.get_running_loop().create_task(self._assert_stream())

    async def _on_error(self, e: Exception) -> None:
        self.last_error = str(e)

    # -- publishing -----------------------------------------------------------------------------
    async def _publish_loop(self) -> None:
        while True:
            if not self._queue and not (self.outbox.count and self._ready):
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await self._wake.wait()
            if self.linger and self._ready and len(self._queue) < BATCH and not self._stopping and not self._urgent.is_set():
                # Let a batch gather: one wake-up, one round of acknowledgements for many events,
                # instead of a publish round on the daemon's loop after every command; unless a
                # call waits for its events (``flush_soon``): then what gathered goes at once.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.linger):
                        await self._urgent.wait()
            self._urgent.clear()
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # never let the loop die: keep the events in the outbox
                self.last_error = f"{type(e).__name__}: {e}"
                log.exception("events: publish loop error")
                await asyncio.sleep(0.5)

    async def _step(self) -> None:
        if not self._ready:
            if self._queue:
                batch = [self._queue.popleft() for _ in range(min(len(self._queue), BATCH * 8))]
                await self._to_outbox(batch)
            else:
                await asyncio.sleep(0.05)
            return
        if self._dropped_unreported:
            # Published at once, ahead of the outbox: it must not be dropped by the full outbox it reports.
            n = self._dropped_unreported
            alert = self._node_event(ALERT, {"kind": "outbox_full", "dropped": n, "dropped_total": self.dropped_total})
            if await self._publish([(alert.subject, alert.msg_id, alert.to_json(), 1)]):
                self._dropped_unreported -= n
        if self.outbox.count:
            # Replay first (order), and route new events behind what is waiting.
            if self._queue:
                await self._to_outbox([self._queue.popleft() for _ in range(min(len(self._queue), BATCH * 8))])
            rows = await asyncio.to_thread(self.outbox.peek, BATCH)
            records = [(s, m, p, n) for _, s, m, p, n in rows]
            if rows and (await self._publish(records) or await self._dead_letter_refused(records)):
                await asyncio.to_thread(self.outbox.remove_through, rows[-1][0])
            elif rows:
                await asyncio.sleep(0.5)
            return
        if len(self._queue) > MEMORY_QUEUE_LIMIT:
            await self._to_outbox([self._queue.popleft() for _ in range(len(self._queue))])
            return
        batch = [self._queue.popleft() for _ in range(min(len(self._queue), BATCH))]
        try:
            records = self.encoder.records(batch) if batch else []
            published = not batch or await self._publish(records) or await self._dead_letter_refused(records)
        except asyncio.CancelledError:
            # Stopping mid-publish: put the batch back in front, for stop() to keep in the outbox
            # (what was acknowledged already is dropped as a duplicate when it is replayed).
            self._queue.extendleft(reversed(batch))
            raise
        if not published:
            await self._to_outbox(batch)
        else:
            self._durable(batch)

    async def _publish(self, records: list[Record]) -> bool:
        """Publish records and wait for every acknowledgement; False if any is missing.

        JetStream acknowledges a message by answering its reply subject. Instead of a future per
        message (nats-py's publish_async: ~40% of the publisher's CPU, measured), a batch's
        replies are counted by one subscription: ``<inbox>.<batch>.<index>``.
        """
        assert self._nc is not None
        if self._ack_prefix is None:
            self._ack_prefix = self._nc.new_inbox()
            await self._nc.subscribe(f"{self._ack_prefix}.*.*", cb=self._on_ack)
        self._batch_no += 1
        batch_no = self._batch_no
        state = _Acks(len(records))
        self._acks[batch_no] = state
        prefix = f"{self._ack_prefix}.{batch_no}."
        try:
            async with asyncio.timeout(self.publish_timeout):
                for i, (subject, msg_id, payload, _) in enumerate(records):
                    await self._nc.publish(subject, payload, reply=prefix + str(i), headers={"Nats-Msg-Id": msg_id})
                await state.done.wait()
            if state.error:
                if _content_refusal(state.error):
                    self._refused = state.error
                raise nats.js.errors.Error(state.error)
        except nats.errors.MaxPayloadError as e:
            self._refused = f"{type(e).__name__}: {e}"
            self.last_error = f"NATS refused a message for its size ({e})"
            return False
        except (TimeoutError, nats.errors.Error, nats.js.errors.Error, OSError) as e:
            self.last_error = f"publish failed ({type(e).__name__}: {e}); batch kept in the outbox"
            log.warning("events: %s", self.last_error)
            return False
        finally:
            self._acks.pop(batch_no, None)
        self.published_total += sum(r[3] for r in records)
        return True

    async def _dead_letter_refused(self, records: list[Record]) -> bool:
        """After NATS refused a batch for its content (not for an outage): send its messages one by
        one, each refused one again cut to the server's limit (it may be lower than when the
        message was made), and keep what still cannot go apart (dead letters: counted, stored,
        alerted), so that no message can block the ones behind it. False when the failure was not
        about content: the caller keeps the batch (what went out dedups on replay)."""
        if not self._refused:
            return False
        for record in records:
            self._refused = ""
            if await self._publish([record]):
                continue
            if not self._refused:
                return False
            reason = self._refused
            refit = self.encoder.refit(record)
            self._refused = ""
            if refit and await self._publish(refit):
                continue
            if refit and not self._refused:
                return False
            await asyncio.to_thread(self.outbox.dead_letter, record, reason)
            self.dead_lettered_total += record[3]
            log.error("events: NATS refused %s (%d bytes): %s; dead-lettered", record[1], len(record[2]), reason)
            facts = {"msg_id": record[1], "bytes": len(record[2]), "events": record[3], "reason": reason}
            self._queue.appendleft(self._node_event(ALERT, {"kind": "dead_letter", **facts}))
        self._refused = ""
        return True

    async def _on_ack(self, msg: Msg) -> None:
        batch_no = int(msg.subject.rsplit(".", 2)[-2])
        state = self._acks.get(batch_no)
        if state is None:
            return  # a late answer for a batch that timed out (it is in the outbox)
        if not msg.data or b'"error"' in msg.data:  # no stream answered (503), or the stream refused it
            state.error = (msg.headers or {}).get("Description", "") or msg.data.decode(errors="replace")[:300] or "no ack"
            state.done.set()
            return
        state.acked += 1
        if state.acked >= state.expected:
            state.done.set()

    def _durable(self, events: list[Event]) -> None:
        if self.on_durable is not None and events:
            try:
                self.on_durable(events)
            except Exception:  # the publisher goes on whatever a listener does
                log.exception("events: on_durable failed")

    async def _to_outbox(self, events: list[Event]) -> None:
        if not events:
            return
        records = self.encoder.records(events)
        try:
            taken = await asyncio.to_thread(self.outbox.append, records)
        finally:
            self._durable(events)  # in the outbox, or counted as dropped below: nobody waits longer
        lost = sum(r[3] for r in records[taken:])  # events, not messages
        if lost:
            if not self._dropped_unreported:
                log.error(
                    "events: outbox full (%d bytes of %d); dropping %d events and counting",
                    self.outbox.bytes,
                    self.outbox.max_bytes,
                    lost,
                )
            self.dropped_total += lost
            self._dropped_unreported += lost


def _content_refusal(description: str) -> bool:
    """JetStream's answers that refuse a message for what it is (size), not for an outage."""
    text = description.lower()
    return "maximum" in text or "too large" in text or "exceeds" in text
