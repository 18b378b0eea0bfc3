"""Task bundles in NATS JetStream Object Store: a task travels by reference.

``rlsandbox tasks push`` stores each task (its spec and workspace tarball) once, content-addressed:
the object's name is the task's ref (``<id>@<digest>``, session/prefetch.py ``task_ref``). A node
that is asked for a ref it does not know fetches the bundle once (one fetch however many calls
wait for it), checks that its content hashes to the ref (a bundle replaced in the store is
refused), and keeps it among its known tasks (bounded by count and bytes, as prefetched tasks
are). 1,000 rollouts of one 50 MB repository move the repository to each node once, not 1,000
times through gRPC.

Bundle format: ``RLSTASK1\\n``, the spec's length (8 bytes, big-endian), the spec JSON, the
workspace tarball.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from typing import Any

import nats
import nats.errors
import nats.js.errors
from rlsandbox.daemon.errors import FailedPrecondition, NotFound, Unavailable
from rlsandbox.daemon.events.connection import NatsAuth, servers
from rlsandbox.daemon.flight import SingleFlight
from rlsandbox.daemon.grading.task import MAX_BUNDLE_WORKSPACE_BYTES, Task, TaskError
from rlsandbox.daemon.session.prefetch import task_ref

log = logging.getLogger(__name__)

BUCKET = "RLSANDBOX_TASKS"
MAGIC = b"RLSTASK1\n"
FETCH_TIMEOUT = 60.0


def pack(task: Task) -> bytes:
    spec = task.spec_json().encode()
    return MAGIC + struct.pack(">Q", len(spec)) + spec + task.workspace_tar


def unpack(data: bytes, ref: str) -> Task:
    """The task of a bundle, which must hash to ``ref`` (FailedPrecondition otherwise)."""
    head = len(MAGIC) + 8
    if not data.startswith(MAGIC) or len(data) < head:
        raise FailedPrecondition(f"task bundle {ref!r} in the object store is not an rlsandbox task bundle; push it again")
    (size,) = struct.unpack(">Q", data[len(MAGIC) : head])
    try:
        task = Task.from_wire(data[head : head + size], data[head + size :], workspace_limit=MAX_BUNDLE_WORKSPACE_BYTES)
    except TaskError as e:
        raise FailedPrecondition(f"task bundle {ref!r} holds an invalid task ({e}); push it again") from None
    actual = task_ref(task)
    if actual != ref:
        raise FailedPrecondition(
            f"task bundle {ref!r} in the object store holds other content (it hashes to {actual!r}): refused; push it again"
        )
    return task


async def push(js: Any, task: Task) -> tuple[str, bool]:
    """Store ``task`` under its ref unless it is there already: (ref, stored now). What is there
    is read back and checked by content, as a node would (``unpack``): an object someone put under
    the ref first (anyone who can write to the bucket can squat a ref it can compute) is
    replaced, and logged, never taken for the task."""
    store = await _bucket(js, create=True)
    ref = task_ref(task)
    with contextlib.suppress(nats.js.errors.ObjectNotFoundError, nats.js.errors.NotFoundError):
        info = await store.get_info(ref)
        if info is not None and not getattr(info, "deleted", False):
            found = bytes((await store.get(ref)).data or b"")
            try:
                await asyncio.to_thread(unpack, found, ref)
                return ref, False
            except FailedPrecondition as e:
                log.warning("task bundle %s: the object store held other content under its ref (%s); replacing it", ref, e)
    await store.put(ref, pack(task))
    return ref, True


async def _bucket(js: Any, *, create: bool) -> Any:
    try:
        return await js.object_store(BUCKET)
    except (nats.js.errors.BucketNotFoundError, nats.js.errors.NotFoundError):
        if not create:
            raise
        return await js.create_object_store(BUCKET, description="rlsandbox task bundles, by task ref")


class TaskBundles:
    """A node's reader of task bundles (a NATS connection made on first use)."""

    def __init__(self, nats_url: str, *, auth: NatsAuth | None = None, timeout: float = FETCH_TIMEOUT) -> None:
        self.nats_url = nats_url
        self._auth = auth or NatsAuth()
        self.timeout = timeout
        self._nc: Any = None
        self._inflight: SingleFlight[str, Task] = SingleFlight()
        self.fetched_total = 0
        self.fetched_bytes = 0

    async def fetch(self, ref: str) -> Task:
        """The task of ``ref`` from the object store; concurrent callers share one fetch."""
        return await self._inflight.run(ref, lambda: self._fetch(ref), lambda: Unavailable("task bundle fetch cancelled"))

    async def _fetch(self, ref: str) -> Task:
        try:
            async with asyncio.timeout(self.timeout):
                if self._nc is None or not self._nc.is_connected:
                    self._nc = await nats.connect(
                        servers(self.nats_url), name="rlsandbox-task-bundles", connect_timeout=5, **self._auth.connect_options()
                    )
                store = await _bucket(self._nc.jetstream(timeout=self.timeout), create=False)
                result = await store.get(ref)
        except (nats.js.errors.BucketNotFoundError, nats.js.errors.ObjectNotFoundError, nats.js.errors.NotFoundError):
            raise NotFound(
                f"task ref {ref!r} is unknown on this node and not in the object store ({BUCKET}); "
                "push the task (rlsandbox tasks push) or send the task itself"
            ) from None
        except (TimeoutError, nats.errors.Error, nats.js.errors.Error, OSError) as e:
            raise Unavailable(f"cannot fetch task bundle {ref!r} from NATS ({type(e).__name__}: {e}); retry") from None
        data = bytes(result.data or b"")
        task = await asyncio.to_thread(unpack, data, ref)  # hashing a big workspace: off the loop
        self.fetched_total += 1
        self.fetched_bytes += len(data)
        log.info("task bundle %s fetched (%d bytes)", ref, len(data))
        return task

    async def close(self) -> None:
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()
            self._nc = None
