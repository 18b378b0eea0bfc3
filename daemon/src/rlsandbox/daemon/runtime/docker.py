"""The only module that talks to the Docker engine (through aiodocker).

Every call has a deadline; every engine failure becomes a typed :mod:`rlsandbox.daemon.errors`
exception. Sized for thousands of concurrent streams: the aiohttp connector has no connection cap
(aiohttp's default of 100 would queue the 101st attached sandbox behind the others).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import logging
import os
import tarfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiodocker
import aiohttp
from aiodocker.stream import Stream
from rlsandbox.daemon.errors import (
    ArchiveCutShort,
    ContainerNotFound,
    DeadlineExceeded,
    DockerError,
    DockerUnavailable,
    FileTooLarge,
    ImageNotFound,
)
from rlsandbox.daemon.runtime import overlay
from rlsandbox.daemon.runtime.images import EngineImages

log = logging.getLogger(__name__)

LABEL_MANAGED = "rlsandbox.managed"
LABEL_OWNER = "rlsandbox.owner"
MAX_DIFF_BYTES = 16 << 20  # a container's diff read by Fork: ~150,000 paths
LABEL_INSTANCE = "rlsandbox.instance"
LABEL_POOL = "rlsandbox.pool"
LABEL_SESSION = "rlsandbox.session"
LABEL_CREATED = "rlsandbox.created"
LABEL_DISK = "rlsandbox.disk-bytes"  # the sandbox's budget for its writable layer (pool/disk.py)
DEFAULT_SOCKET = "/var/run/docker.sock"

# Engine API execs (the fallback for images without python3) running at once. Each one is a
# `runc exec` on the host: 2,000 at once (2,000 busybox sessions each asked one command) thrashed
# two cores so that almost none finished within its timeout (measured: 19 of 2,000 within 35 s),
# and the kills of the timed-out ones needed execs of their own. Queued, they finish in turn.
EXEC_CONCURRENCY = 32
# aiodocker reports a connection it could not make (engine stopped, socket gone) as this status.
AIODOCKER_CONNECT_FAILED = 900
BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)
# Reads of a path before ArchiveCutShort (measured: 1 read in ~100 cut by a `date > f` loop, 1 in 5 by a tight one).
ARCHIVE_ATTEMPTS = 3
T = TypeVar("T")
HEADERS_ROOM = 64 << 10  # a file's tar headers (PAX records: long names, xattrs) before its data


# Go's os.FileMode type bits, as the engine's archive stat reports a path's mode.
_GO_MODE_DIR = 1 << 31
_GO_MODE_SYMLINK = 1 << 27
_GO_MODE_SPECIAL = (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19)  # device, pipe, socket, char device, irregular


def path_kind(mode: int) -> str:
    """A path's kind from the engine's stat mode, in the agent's words: dir, symlink, other, file."""
    if mode & _GO_MODE_DIR:
        return "dir"
    if mode & _GO_MODE_SYMLINK:
        return "symlink"
    return "other" if mode & _GO_MODE_SPECIAL else "file"


def tarball_is_whole(data: bytes) -> bool:
    """Whether ``data`` is a whole tarball: every member's data is there and the end-of-archive
    block follows. Headers only (no data is parsed): sizes come from the ustar field, in octal or
    base-256, or from a PAX ``size`` record, which then holds for the next member."""
    end = len(data)
    offset = 0
    pax_size: int | None = None
    while offset + BLOCK <= end:
        header = data[offset : offset + BLOCK]
        if header == ZERO_BLOCK:
            return True
        field = header[124:136]
        if field[0] & 0x80:  # base-256 (GNU): sizes of 8 GiB and more
            size = int.from_bytes(field[1:], "big")
        else:
            digits = field.split(b"\0", 1)[0].strip()
            try:
                size = int(digits, 8) if digits else 0
            except ValueError:
                return False
        kind = header[156:157]
        if pax_size is not None and kind not in (b"x", b"g"):
            size, pax_size = pax_size, None
        body = offset + BLOCK
        if kind == b"x":
            pax_size = _pax_size(data[body : body + size])
        offset = body + -(-size // BLOCK) * BLOCK
    return False


def _pax_size(records: bytes) -> int | None:
    """The ``size`` of PAX records, each ``"<length> <key>=<value>\\n"``: walked by their lengths
    (a value, such as a file's name, may hold a newline and what looks like another record)."""
    size, pos = None, 0
    while pos < len(records):
        space = records.find(b" ", pos)
        length = records[pos:space]
        if space < 0 or not length.isdigit() or int(length) <= space - pos:
            return None
        key, _, value = records[space + 1 : pos + int(length) - 1].partition(b"=")
        if key == b"size" and value.isdigit():
            size = int(value)
        pos += int(length)
    return size


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    id: str
    name: str
    labels: Mapping[str, str]
    state: str
    created: float
    size_rw: int = 0  # bytes of its writable layer (listed with size=True)


class AttachTransport:
    """The container's attached stdin/stdout/stderr as a ``ByteTransport`` for the agent channel."""

    def __init__(self, stream: Stream) -> None:
        self._stream = stream

    async def send(self, data: bytes) -> None:
        try:
            await self._stream.write_in(data)
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as e:
            raise DockerUnavailable(f"lost the attach stream: {e}") from e

    async def receive(self) -> tuple[int, bytes] | None:
        msg = await self._stream.read_out()
        if msg is None:
            return None
        return msg.stream, msg.data

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._stream.close()


class DockerRuntime:
    """Creates, attaches to, executes in and removes sandbox containers.

    Args:
        owner: this daemon's owner id, written on every container as ``rlsandbox.owner``.
        instance: id of this daemon process (``rlsandbox.instance``), for diagnostics.
        socket_path: the Docker engine's unix socket.
        api_timeout: default deadline of one Engine API call, in seconds.
        exec_concurrency: Engine API exec commands run at once; more wait their turn here.
    """

    def __init__(
        self,
        *,
        owner: str,
        instance: str = "",
        socket_path: str = DEFAULT_SOCKET,
        api_timeout: float = 60.0,
        exec_concurrency: int = EXEC_CONCURRENCY,
    ) -> None:
        self.owner = owner
        self._exec_slots = asyncio.Semaphore(exec_concurrency)
        self.instance = instance
        self.socket_path = socket_path
        self.api_timeout = api_timeout
        self._docker: aiodocker.Docker | None = None
        self._connector: aiohttp.UnixConnector | None = None
        self._session: aiohttp.ClientSession | None = None
        self._python_images: dict[tuple[str, str], bool] = {}
        self._image_volumes: dict[str, tuple[str, ...]] = {}
        self.images = EngineImages(self)

    async def __aenter__(self) -> DockerRuntime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        self._connector = aiohttp.UnixConnector(path=self.socket_path, limit=0)
        # Uncompressed answers: aiohttp asks for gzip by default, and the engine then gzips every
        # archive it sends (10 MB of a workspace: ~400 ms against ~130 ms plain, the engine
        # compressing and the daemon inflating on two cores, for bytes that never leave the host).
        self._session = aiohttp.ClientSession(
            connector=self._connector, connector_owner=False, headers={"Accept-Encoding": "identity"}
        )
        self._docker = aiodocker.Docker(url="unix://localhost", connector=self._connector, session=self._session)

    async def close(self) -> None:
        if self._docker is not None:
            await self._docker.close()
            self._docker = None
        if self._session is not None:  # caller-supplied sessions are not closed by aiodocker
            await self._session.close()
            self._session = None
        if self._connector is not None:  # caller-supplied connectors are not closed by aiodocker
            await self._connector.close()
            self._connector = None

    @property
    def docker(self) -> aiodocker.Docker:
        if self._docker is None:
            raise DockerUnavailable("the Docker runtime is not started")
        return self._docker

    @contextlib.asynccontextmanager
    async def _call(self, what: str, timeout: float | None = None, **fields: Any) -> AsyncIterator[None]:
        """Deadline and error translation around one Engine API call."""
        budget = self.api_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(budget):
                yield
        except TimeoutError:
            raise DockerUnavailable(f"Docker engine did not answer {what} within {budget:.1f} s", **fields) from None
        except aiodocker.DockerError as e:
            if e.status == AIODOCKER_CONNECT_FAILED:
                unreachable = f"cannot reach the Docker engine at {self.socket_path} ({what}): {e.message}"
                raise DockerUnavailable(unreachable, **fields) from None
            message = f"Docker engine refused {what}: {e.message}"
            if e.status == 404 and "image" in e.message.lower():
                raise ImageNotFound(f"{message} (build it with `rlsandbox images build`)", status=404, **fields) from None
            if e.status == 404 or (e.status in (409, 500) and "is not running" in e.message):
                # Gone, or stopped (exec into a dead container): either way it is not coming back.
                raise ContainerNotFound(message, status=e.status, **fields) from None
            raise DockerError(message, status=e.status, **fields) from None
        except (aiohttp.ClientConnectionError, ConnectionError, FileNotFoundError) as e:
            raise DockerUnavailable(f"cannot reach the Docker engine at {self.socket_path} ({what}): {e}", **fields) from None

    # -- engine ---------------------------------------------------------------------------------
    async def ping(self, timeout: float = 5.0) -> dict[str, Any]:
        async with self._call("version", timeout):
            return dict(await self.docker.version())

    async def info(self, timeout: float = 5.0) -> dict[str, Any]:
        """The engine's ``GET /info``: its data-root, cgroup driver and version, runtimes."""
        async with self._call("info", timeout):
            return dict(await self.docker.system.info())

    async def data_root(self, timeout: float = 5.0) -> str:
        """The engine's data-root (where its containers' writable layers live)."""
        return str((await self.info(timeout)).get("DockerRootDir") or "")

    # -- containers -----------------------------------------------------------------------------
    async def create_and_start(self, config: Mapping[str, Any], *, name: str, timeout: float | None = None) -> str:
        """Create and start a container; on a failed start the container is removed again."""
        async with self._call("container create", timeout, name=name):
            container = await self.docker.containers.create(config=dict(config), name=name)
        cid: str = container.id
        try:
            async with self._call("container start", timeout, container_id=cid):
                await container.start()
        except BaseException:
            await asyncio.shield(self.remove(cid))
            raise
        return cid

    async def attach(self, container_id: str, timeout: float | None = None) -> AttachTransport:
        container = self.docker.containers.container(container_id)
        stream = container.attach(stdin=True, stdout=True, stderr=True, logs=False)
        async with self._call("container attach", timeout, container_id=container_id):
            await stream._init()  # connect now, so that failures show up here and not on first use
        return AttachTransport(stream)

    async def kill(self, container_id: str, timeout: float | None = None) -> bool:
        """SIGKILL a container's processes. False if it was not running (or gone)."""
        try:
            async with self._call("container kill", timeout, container_id=container_id):
                await self.docker.containers.container(container_id).kill()
        except ContainerNotFound:
            return False
        except DockerError as e:
            if e.status == 409:  # not running
                return False
            raise
        return True

    async def remove(self, container_id: str, timeout: float | None = None) -> bool:
        """Force-remove a container and its anonymous volumes. False if it was already gone."""
        try:
            async with self._call("container remove", timeout, container_id=container_id):
                await self.docker.containers.container(container_id).delete(force=True, v=True)
        except ContainerNotFound:
            return False
        except DockerError as e:
            if e.status == 409 and "already in progress" in e.message:
                return False
            raise
        return True

    async def inspect(self, container_id: str, timeout: float | None = None) -> dict[str, Any]:
        async with self._call("container inspect", timeout, container_id=container_id):
            return dict(await self.docker.containers.container(container_id).show())

    async def changes(
        self,
        container_id: str,
        timeout: float | None = None,
        max_bytes: int = MAX_DIFF_BYTES,
        info: Mapping[str, Any] | None = None,
    ) -> list[tuple[str, int]]:
        """What differs in the container's root filesystem from its image: (path, kind) with kind
        0 changed, 1 added, 2 deleted (the engine's diff; volumes and tmpfs mounts are not in it).
        With the container's ``info`` (inspect) on overlay2 layers this host can read, the layers
        are walked here instead (runtime/overlay.py: the engine may walk the whole image).
        A sandbox decides how long that list is: past ``max_bytes`` of JSON, FileTooLarge."""
        layers = overlay.layer_dirs(info) if info is not None else None
        if layers is not None:
            native = await asyncio.to_thread(overlay.overlay_changes, *layers, max_bytes)
            if native is not None:
                return native
        chunks: list[bytes] = []
        size = 0
        async with (
            self._call("container changes", timeout, container_id=container_id),
            self.docker._query(f"containers/{container_id}/changes") as resp,
        ):
            async for chunk in resp.content.iter_chunked(1 << 16):
                size += len(chunk)
                if size > max_bytes:
                    resp.close()
                    raise FileTooLarge(f"the container's diff is over {max_bytes} bytes", container_id=container_id)
                chunks.append(chunk)
        raw = json.loads(b"".join(chunks) or b"[]")
        return [(str(c["Path"]), int(c["Kind"])) for c in raw or []]

    async def list_containers(
        self, labels: Mapping[str, str], timeout: float | None = None, *, size: bool = False
    ) -> list[ContainerInfo]:
        """``size``: with each one's writable layer size (the engine walks every layer: costly)."""
        filters = json.dumps({"label": [f"{k}={v}" for k, v in labels.items()]})
        params = {"all": "1", "filters": filters, **({"size": "1"} if size else {})}
        async with self._call("container list", timeout):
            raw = await self.docker._query_json("containers/json", params=params)
        return [
            ContainerInfo(
                id=c["Id"],
                name=(c.get("Names") or ["?"])[0].lstrip("/"),
                labels=c.get("Labels") or {},
                state=c.get("State", ""),
                created=float(c.get("Created", 0)),
                size_rw=int(c.get("SizeRw") or 0),
            )
            for c in raw
        ]

    async def image_volumes(self, image: str, timeout: float | None = 30.0) -> tuple[str, ...]:
        """The folders ``image`` declares as volumes (Dockerfile VOLUME). Asked once per image."""
        if image not in self._image_volumes:
            async with self._call("image inspect", timeout):
                info = await self.docker.images.inspect(image)
            self._image_volumes[image] = tuple(sorted((info.get("Config") or {}).get("Volumes") or {}))
        return self._image_volumes[image]

    async def image_has_python(self, image: str, runtime: str = "runc") -> bool:
        """Whether ``image`` can run the agent (python3 >= 3.8). Probed once per image and runtime."""
        key = (image, runtime)
        if key in self._python_images:
            return self._python_images[key]
        probe = "import sys; sys.exit(0 if sys.version_info >= (3, 8) else 3)"
        config = self._probe_config(image, ["python3", "-c", probe])
        config["HostConfig"] = {"NetworkMode": "none", "Runtime": runtime}
        name = f"rls-probe-{os.getpid()}-{time.monotonic_ns()}"
        has = False
        try:
            cid = await self.create_and_start(config, name=name)
        except DockerError as e:
            if "not found" not in e.message and "no such file" not in e.message.lower():
                raise
        else:
            try:
                async with self._call("container wait", 60, container_id=cid):
                    result = await self.docker.containers.container(cid).wait()
                has = result.get("StatusCode") == 0
            finally:
                await self.remove(cid)
        self._python_images[key] = has
        return has

    def _probe_config(self, image: str, cmd: list[str]) -> dict[str, Any]:
        """A short-lived container of ``image`` that looks at it (labelled: reaped if left behind)."""
        return {
            "Image": image,
            "Cmd": cmd,
            "Entrypoint": [],
            "Labels": {LABEL_MANAGED: "1", LABEL_OWNER: self.owner, LABEL_POOL: "_probe"},
            "NetworkDisabled": True,
        }

    async def image_folder(self, image: str, path: str, max_bytes: int, timeout: float | None = 60.0) -> bytes | None:
        """``path`` of ``image`` as the engine's tarball (members under the folder's name), read
        from a container created and never started; None when the image has no such path."""
        name = f"rls-read-{os.getpid()}-{time.monotonic_ns()}"
        async with self._call("container create", timeout, name=name):
            container = await self.docker.containers.create(config=self._probe_config(image, ["true"]), name=name)
        try:
            return await self.get_archive(container.id, path, max_bytes, timeout)
        except ContainerNotFound:
            return None
        finally:
            await self.remove(container.id)

    # -- Engine API exec: the fallback path for images without python3 ---------------------------
    async def exec_stream(
        self,
        container_id: str,
        argv: Sequence[str],
        *,
        cwd: str | None,
        env: Mapping[str, str],
        stdin: bytes,
        on_output: Callable[[int, bytes], None],
        timeout: float,
        on_timeout: Callable[[], Any] | None = None,
        queue: bool = True,
    ) -> int:
        """Run ``argv`` through the Engine API, feed ``stdin``, deliver output; return the exit code.

        At ``timeout`` the coroutine ``on_timeout()`` is awaited (it kills the command), then the
        remaining output is still collected. Commands queue for one of ``exec_concurrency`` slots
        first; ``timeout`` counts from when the command starts (the caller's deadline bounds the wait).
        ``queue=False`` skips the queue: a kill must not wait behind the commands it is there to end.
        """
        async with self._exec_slots if queue else contextlib.nullcontext():
            container = self.docker.containers.container(container_id)
            async with self._call("exec create", None, container_id=container_id):
                execution = await container.exec(
                    cmd=list(argv),
                    stdin=bool(stdin),
                    stdout=True,
                    stderr=True,
                    environment=dict(env) if env else None,
                    workdir=cwd or None,
                )
            stream = execution.start(detach=False)
            async with self._call("exec start", None, container_id=container_id):
                await stream._init()
            try:
                if stdin:
                    await stream.write_in(stdin)
                resp = stream._resp
                if resp is not None and resp.connection is not None and resp.connection.transport is not None:
                    resp.connection.transport.write_eof()  # stdin is done; keep reading the output
                deadline = asyncio.get_running_loop().time() + timeout
                timed_out = False
                while True:
                    try:
                        async with asyncio.timeout_at(deadline):
                            msg = await stream.read_out()
                    except TimeoutError:
                        if timed_out:
                            raise DeadlineExceeded(f"command in {container_id[:12]} ignored its kill") from None
                        timed_out = True
                        if on_timeout is not None:
                            await on_timeout()
                        deadline = asyncio.get_running_loop().time() + 10.0
                        continue
                    if msg is None:
                        break
                    on_output(msg.stream, msg.data)
            finally:
                await stream.close()
            async with self._call("exec inspect", None, container_id=container_id):
                info = await execution.inspect()
            code = info.get("ExitCode")
            return -1 if code is None else int(code)

    async def put_files(self, container_id: str, files: Sequence[tuple[str, bytes, int]], timeout: float | None = None) -> None:
        """Write files (absolute path, data, mode) with one tar upload; parents are created."""
        buf = io.BytesIO()
        now = time.time()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            dirs: set[str] = set()
            for path, data, mode in files:
                parts = Path(path).relative_to("/").parts
                for i in range(1, len(parts)):
                    d = "/".join(parts[:i])
                    if d not in dirs:
                        dirs.add(d)
                        info = tarfile.TarInfo(d)
                        info.type = tarfile.DIRTYPE
                        info.mode = 0o755
                        info.mtime = int(now)
                        tar.addfile(info)
                info = tarfile.TarInfo("/".join(parts))
                info.size = len(data)
                info.mode = mode
                info.mtime = int(now)
                tar.addfile(info, io.BytesIO(data))
        await self.put_archive(container_id, "/", buf.getvalue(), timeout)

    async def get_archive(self, container_id: str, path: str, max_bytes: int, timeout: float | None = None) -> bytes:
        """A tarball of ``path`` read by the engine from the container's filesystem (no process
        inside the sandbox is involved, so nothing the sandbox runs can alter what is read).
        Raises FileTooLarge beyond ``max_bytes``, ContainerNotFound when the path does not exist,
        ArchiveCutShort when the sandbox keeps the tarball from being whole (read again first:
        the engine ends its stream early, without an error, when a file shrinks while it is read)."""

        async def whole(data: bytes, complete: bool) -> bytes | None:
            if not complete:
                raise FileTooLarge(f"{path} in the sandbox is over {max_bytes} bytes as a tarball", container_id=container_id)
            return data if await asyncio.to_thread(tarball_is_whole, data) else None  # ~1 ms per 1,000 files

        return await self._read_whole(container_id, path, max_bytes, timeout, whole)

    async def _read_whole(
        self,
        container_id: str,
        path: str,
        cap: int,
        timeout: float | None,
        take: Callable[[bytes, bool], Awaitable[T | None]],
    ) -> T:
        """What ``take`` makes of the engine's tarball of ``path`` (up to ``cap`` bytes; whether
        that was all), read again while ``take`` finds it cut short (None), then ArchiveCutShort."""
        for _ in range(ARCHIVE_ATTEMPTS):
            taken = await take(*await self._archive(container_id, path, cap, timeout))
            if taken is not None:
                return taken
            log.info("the engine's tarball of %s in %s was cut short; reading it again", path, container_id[:12])
        raise ArchiveCutShort(
            f"{path} in the sandbox kept changing while it was read ({ARCHIVE_ATTEMPTS} tries, each cut short); "
            "stop the processes writing to it, then try again",
            container_id=container_id,
        )

    async def _archive(self, container_id: str, path: str, cap: int, timeout: float | None) -> tuple[bytes, bool]:
        """The engine's tarball of ``path``, up to ``cap`` bytes: (bytes, whether that was all).
        Never holds more than ``cap`` (aiodocker's own get_archive reads the whole body, and a
        sparse file of terabytes is one ``truncate`` away)."""
        chunks: list[bytes] = []
        size = 0
        async with (
            self._call("archive download", timeout, container_id=container_id),
            self.docker._query(f"containers/{container_id}/archive", method="GET", params={"path": path}) as resp,
        ):
            async for chunk in resp.content.iter_chunked(1 << 16):
                if size + len(chunk) > cap:
                    chunks.append(chunk[: cap - size])
                    resp.close()  # aiodocker leaves the response to us: unread, its connection must go
                    return b"".join(chunks), False
                size += len(chunk)
                chunks.append(chunk)
        return b"".join(chunks), True

    async def put_archive(self, container_id: str, path: str, tar: bytes, timeout: float | None = None) -> None:
        """Extract a tarball into ``path`` (an existing folder) in the container, through the engine."""
        async with (
            self._call("archive upload", timeout, container_id=container_id),
            self.docker._query(
                f"containers/{container_id}/archive",
                method="PUT",
                data=io.BytesIO(tar),
                headers={"content-type": "application/x-tar"},
                params={"path": path, "noOverwriteDirNonDir": "false"},
            ),
        ):
            pass

    async def get_file(self, container_id: str, path: str, max_bytes: int, timeout: float | None = None) -> tuple[bytes, int]:
        """Read one regular file through the archive API: (first ``max_bytes`` bytes, full size).
        Only the file's first ``max_bytes`` cross the engine's socket."""

        async def first_bytes(data: bytes, _complete: bool) -> tuple[bytes, int] | None:
            try:
                with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                    member = tar.next()
                    if member is None or not member.isfile():
                        raise IsADirectoryError(path)
                    f = tar.extractfile(member)
                    assert f is not None
                    return f.read(min(max_bytes, member.size)), member.size
            except tarfile.ReadError:  # cut short by the engine: the file shrank while it was read
                return None

        return await self._read_whole(container_id, path, max_bytes + HEADERS_ROOM, timeout, first_bytes)

    async def stat_path(self, container_id: str, path: str, timeout: float | None = None) -> dict[str, Any] | None:
        """Stat a path through the archive API's HEAD; None when it does not exist."""
        try:
            async with (
                self._call("archive stat", timeout, container_id=container_id),
                self.docker._query(f"containers/{container_id}/archive", method="HEAD", params={"path": path}) as resp,
            ):
                header = resp.headers.get("X-Docker-Container-Path-Stat", "")
        except ContainerNotFound as e:
            if "could not find the file" in e.message.lower() or "no such" in e.message.lower():
                return None
            raise
        except ValueError:  # aiodocker parses the empty body of HEAD's 404 as JSON and fails
            return None
        if not header:
            return None
        return dict(json.loads(base64.b64decode(header)))
