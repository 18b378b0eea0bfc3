"""The gRPC servicer: translates between protobuf and the session manager, nothing more.

Errors are mapped in one place, the edge interceptor (``api/edge.py``): a :class:`SandboxError`
becomes its status code, message and fields; anything else is a bug, logged, and INTERNAL.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import grpc
from rlsandbox.daemon.api import convert
from rlsandbox.daemon.api.limits import MAX_PREFETCH_TTL
from rlsandbox.daemon.config import DaemonConfig
from rlsandbox.daemon.errors import FailedPrecondition, InvalidArgument, SandboxError, Unavailable
from rlsandbox.daemon.grading.bundles import TaskBundles
from rlsandbox.daemon.model import OutputChunk
from rlsandbox.daemon.session import SessionManager
from rlsandbox.daemon.status import NodeStatus
from rlsandbox.v1 import sandbox_pb2 as pb
from rlsandbox.v1 import sandbox_pb2_grpc

log = logging.getLogger(__name__)

MAX_BATCH = 4096


class SandboxServicer(sandbox_pb2_grpc.SandboxServiceServicer):
    def __init__(
        self,
        sessions: SessionManager,
        config: DaemonConfig,
        *,
        docker_ok: Callable[[], bool],
        status: Callable[[], NodeStatus],
        bundles: TaskBundles | None = None,
        cluster: Callable[[], Awaitable[list[dict[str, Any]]]] | None = None,
    ) -> None:
        self.sessions = sessions
        self.config = config
        self.docker_ok = docker_ok
        self.status = status
        self.bundles = bundles
        self.cluster = cluster

    async def _resolve(self, t: pb.Task) -> None:
        """A task ref this node does not know comes from the object store (grading/bundles.py)."""
        prefetcher = self.sessions.prefetcher
        if t.ref and not t.spec_json and self.bundles is not None and not prefetcher.knows(t.ref):
            prefetcher.remember(t.ref, await self.bundles.fetch(t.ref))

    async def CreateSession(self, request: pb.CreateSessionRequest, context: grpc.aio.ServicerContext) -> pb.Session:
        if request.HasField("task"):
            await self._resolve(request.task)
        options = convert.session_options(request, self.config, self.sessions.prefetcher.known)
        if not self.docker_ok():
            # Its warm sandboxes may be dead without anyone knowing yet: hand out none.
            raise Unavailable(
                f"node {self.sessions.node_id} cannot reach its Docker engine (health NOT_SERVING); "
                "create the session on another node or retry in a few seconds"
            )
        options = replace(options, acquire_timeout=_budget(context, options.acquire_timeout))
        session = await self.sessions.create(options)
        return convert.session(session, self.sessions.node_id)

    async def GetSession(self, request: pb.GetSessionRequest, context: grpc.aio.ServicerContext) -> pb.Session:
        return convert.session(await self.sessions.settled(request.session_id), self.sessions.node_id)

    async def ListSessions(self, request: pb.ListSessionsRequest, context: grpc.aio.ServicerContext) -> pb.ListSessionsResponse:
        found = self.sessions.list(dict(request.labels), request.pool)
        return pb.ListSessionsResponse(sessions=[convert.session(s, self.sessions.node_id) for s in found])

    async def CloseSession(self, request: pb.CloseSessionRequest, context: grpc.aio.ServicerContext) -> pb.CloseSessionResponse:
        if not request.session_id:
            raise InvalidArgument("session_id is empty")
        return pb.CloseSessionResponse(closed=await self.sessions.close(request.session_id))

    async def Exec(self, request: pb.ExecRequest, context: grpc.aio.ServicerContext) -> pb.ExecResult:
        req = convert.exec_request(request, self.config, context.time_remaining())
        result, replayed = await self.sessions.exec(request.session_id, req, seq=request.seq)
        return convert.exec_result(result, replayed)

    async def ExecStream(self, request: pb.ExecRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ExecStreamEvent]:
        # Unbounded on purpose and still bounded: the agent streams only what fits under the
        # command's output caps, so a slow client can hold at most stdout_cap + stderr_cap here,
        # and the agent's reader is never blocked by one slow stream.
        queue: asyncio.Queue[OutputChunk | None] = asyncio.Queue()
        req = convert.exec_request(request, self.config, context.time_remaining())
        task = asyncio.create_task(self.sessions.exec(request.session_id, req, seq=request.seq, on_chunk=queue.put_nowait))
        task.add_done_callback(lambda _t: queue.put_nowait(None))
        try:
            while (item := await queue.get()) is not None:
                yield _chunk_event(item)
            result, replayed = await task
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if replayed:
            if result.stdout:
                yield pb.ExecStreamEvent(stdout=result.stdout)
            if result.stderr:
                yield pb.ExecStreamEvent(stderr=result.stderr)
        yield pb.ExecStreamEvent(result=convert.exec_result(result, replayed))

    async def ExecBatch(self, request: pb.ExecBatchRequest, context: grpc.aio.ServicerContext) -> pb.ExecBatchResponse:
        if len(request.requests) > MAX_BATCH:
            raise InvalidArgument(f"at most {MAX_BATCH} commands per batch (got {len(request.requests)})")
        left = context.time_remaining()

        async def one(item: pb.ExecRequest) -> pb.ExecBatchItem:
            try:
                req = convert.exec_request(item, self.config, left)
                result, replayed = await self.sessions.exec(item.session_id, req, seq=item.seq)
                return pb.ExecBatchItem(result=convert.exec_result(result, replayed))
            except SandboxError as e:
                return pb.ExecBatchItem(error=pb.Error(code=e.code.name, message=e.message))

        items = await asyncio.gather(*(one(r) for r in request.requests))
        return pb.ExecBatchResponse(items=items)

    async def WriteFiles(self, request: pb.WriteFilesRequest, context: grpc.aio.ServicerContext) -> pb.WriteFilesResponse:
        session = await self.sessions.settled(request.session_id)
        files = convert.file_writes(request, session.workdir)
        results = await self.sessions.write_files(session.id, files, timeout=_budget(context, 120.0))
        failed = [r for r in results if r.error]
        if failed:
            raise FailedPrecondition(
                "could not write " + "; ".join(f"{r.path}: {r.error}" for r in failed[:10]), session_id=session.id
            )
        return pb.WriteFilesResponse()

    async def ReadFiles(self, request: pb.ReadFilesRequest, context: grpc.aio.ServicerContext) -> pb.ReadFilesResponse:
        session = await self.sessions.settled(request.session_id)
        paths, max_bytes = convert.read_paths(request, self.config, session.workdir)
        reads = await self.sessions.read_files(session.id, paths, max_bytes=max_bytes, timeout=_budget(context, 120.0))
        return pb.ReadFilesResponse(
            files=[
                pb.FileData(path=asked, data=r.data, size=r.size, truncated=r.truncated, error=r.error or "")
                for asked, r in zip(request.paths, reads, strict=True)
            ]
        )

    async def Evaluate(self, request: pb.EvaluateRequest, context: grpc.aio.ServicerContext) -> pb.GradeResult:
        task = convert.task(request.task) if request.HasField("task") else None
        mode = "in_place" if request.mode == pb.EVALUATE_MODE_IN_PLACE else "clean_room"
        if request.timeout < 0 or request.timeout != request.timeout:
            raise InvalidArgument(f"timeout must be >= 0 seconds (got {request.timeout})")
        left = context.time_remaining()
        timeout = request.timeout or None
        if left is not None:
            timeout = max(0.05, min(timeout or left, left - 0.1))
        session, used, result = await self.sessions.evaluate(request.session_id, task, mode=mode, timeout=timeout)
        return convert.grade_result(result, task_id=used.id, session_id=session.id)

    async def Prefetch(self, request: pb.PrefetchRequest, context: grpc.aio.ServicerContext) -> pb.PrefetchResponse:
        if not request.HasField("task"):
            raise InvalidArgument("task is required: the task to prepare sandboxes for")
        if not 0 <= request.ttl <= MAX_PREFETCH_TTL:  # NaN too
            raise InvalidArgument(
                f"ttl must be between 0 (the node's default) and {MAX_PREFETCH_TTL:.0f} seconds (got {request.ttl}): "
                "prefetch again to keep sandboxes longer"
            )
        await self._resolve(request.task)
        task = convert.task(request.task, self.sessions.prefetcher.known)
        state = await self.sessions.prefetch(task, request.count, request.ttl or self.config.prefetch_ttl)
        return convert.prefetch_response(state)

    async def Fork(self, request: pb.ForkRequest, context: grpc.aio.ServicerContext) -> pb.ForkResponse:
        if not self.docker_ok():
            raise Unavailable(f"node {self.sessions.node_id} cannot reach its Docker engine; retry in a few seconds")
        forks, snapshot = await self.sessions.fork(request.session_id, request.count, dict(request.labels))
        return pb.ForkResponse(
            sessions=[convert.session(s, self.sessions.node_id) for s in forks],
            bytes_copied=snapshot.bytes,
            paths_copied=len(snapshot.roots),
            paths_deleted=len(snapshot.deletes),
        )

    async def GetCluster(self, request: pb.GetClusterRequest, context: grpc.aio.ServicerContext) -> pb.Cluster:
        records = await self.cluster() if self.cluster is not None else []
        return convert.cluster(records, self.sessions.node_id)

    async def Drain(self, request: pb.DrainRequest, context: grpc.aio.ServicerContext) -> pb.DrainResponse:
        if request.node_id != self.sessions.node_id:
            raise InvalidArgument(
                f"node_id {request.node_id[:128]!r} is not this node ({self.sessions.node_id}): name the node to drain "
                "(GetNodeStatus's node_id); an empty request drains nothing"
            )
        self.sessions.draining = not request.undo
        log.warning(
            "node %s %s", self.sessions.node_id, "draining: no new sessions" if self.sessions.draining else "takes sessions again"
        )
        return pb.DrainResponse(draining=self.sessions.draining, sessions=len(self.sessions.sessions))

    async def GetNodeStatus(self, request: pb.GetNodeStatusRequest, context: grpc.aio.ServicerContext) -> pb.NodeStatus:
        return convert.node_status(self.status())


def _chunk_event(chunk: OutputChunk) -> pb.ExecStreamEvent:
    return pb.ExecStreamEvent(stdout=chunk.data) if chunk.stream == 1 else pb.ExecStreamEvent(stderr=chunk.data)


def _budget(context: grpc.aio.ServicerContext, default: float) -> float:
    """``default`` seconds, shortened so that the answer arrives before the call's deadline."""
    left = context.time_remaining()
    return default if left is None else max(0.05, min(default, left - 0.05))
