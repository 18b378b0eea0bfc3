"""Images on the engine: labels (what a build was made from), imports of root filesystems, builds."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from rlsandbox.daemon.errors import ContainerNotFound, DockerError, ImageNotFound
from yarl import URL

if TYPE_CHECKING:
    from rlsandbox.daemon.runtime.docker import DockerRuntime


class EngineImages:
    """The image operations of a :class:`DockerRuntime` (``runtime.images``)."""

    def __init__(self, runtime: DockerRuntime) -> None:
        self.runtime = runtime

    async def labels(self, image: str) -> dict[str, str] | None:
        """The image's labels, or None when the image does not exist."""
        config = await self.config(image)
        return None if config is None else dict(config.get("Labels") or {})

    async def config(self, image: str) -> dict[str, Any] | None:
        """The image's ``Config`` (labels, ``WorkingDir``, ...), or None when it does not exist."""
        try:
            async with self.runtime._call("image inspect", 30):
                info = await self.runtime.docker.images.inspect(image)
        except (ImageNotFound, ContainerNotFound):
            return None
        return dict(info.get("Config") or {})

    async def image_id(self, image: str) -> str | None:
        """The image's id (``sha256:...``), or None when it does not exist."""
        try:
            async with self.runtime._call("image inspect", 30):
                info = await self.runtime.docker.images.inspect(image)
        except (ImageNotFound, ContainerNotFound):
            return None
        return str(info.get("Id") or "") or None

    async def import_rootfs(self, tar_path: Path, *, tag: str, changes: Sequence[str], timeout: float = 600) -> None:
        """``docker import`` of a root filesystem tarball, streamed from disk."""
        url = URL("images/create").with_query([("fromSrc", "-"), ("repo", tag)] + [("changes", c) for c in changes])

        async def chunks() -> AsyncIterator[bytes]:
            with open(tar_path, "rb") as f:  # noqa: ASYNC230 - a CLI-time build step, not a hot path
                while data := f.read(1 << 20):
                    yield data

        async with (
            self.runtime._call("image import", timeout),
            self.runtime.docker._query(
                url,
                method="POST",
                data=chunks(),
                headers={"content-type": "application/x-tar"},
            ) as resp,
        ):
            await _raise_on_stream_error(resp, "image import")

    async def build(
        self,
        context_tar: bytes,
        *,
        tag: str,
        labels: Mapping[str, str],
        buildargs: Mapping[str, str] | None = None,
        timeout: float = 1200,
    ) -> list[str]:
        """Build a Dockerfile context (a tar) with the engine's builder; returns the build log."""
        params = {
            "t": tag,
            "labels": json.dumps(dict(labels)),
            "buildargs": json.dumps(dict(buildargs or {})),
            "rm": "1",
            "forcerm": "1",
            "pull": "0",
        }
        async with (
            self.runtime._call("image build", timeout),
            self.runtime.docker._query(
                "build",
                method="POST",
                params=params,
                data=io.BytesIO(context_tar),
                headers={"content-type": "application/x-tar"},
            ) as resp,
        ):
            return await _raise_on_stream_error(resp, "image build")

    async def pull(self, image: str, *, auth: dict[str, str] | None = None, timeout: float = 1800) -> None:
        """Pull ``image`` (``host[:port]/name[:tag]``) from its registry."""
        name, tag = _split_tag(image)
        headers = {"X-Registry-Auth": _auth_header(auth, name.split("/", 1)[0])}
        async with (
            self.runtime._call("image pull", timeout),
            self.runtime.docker._query(
                "images/create", method="POST", params={"fromImage": name, "tag": tag}, headers=headers
            ) as resp,
        ):
            await _raise_on_stream_error(resp, f"pull of {image}")

    async def push(self, image: str, *, auth: dict[str, str] | None = None, timeout: float = 1800) -> None:
        """Push ``image`` to its registry (the tests' local registry; nodes only pull)."""
        name, tag = _split_tag(image)
        headers = {"X-Registry-Auth": _auth_header(auth, name.split("/", 1)[0])}
        async with (
            self.runtime._call("image push", timeout),
            self.runtime.docker._query(f"images/{name}/push", method="POST", params={"tag": tag}, headers=headers) as resp,
        ):
            await _raise_on_stream_error(resp, f"push of {image}")

    async def tag(self, source: str, target: str) -> None:
        name, tag = _split_tag(target)
        async with self.runtime._call("image tag", 60):
            await self.runtime.docker._query_json(f"images/{source}/tag", method="POST", params={"repo": name, "tag": tag})

    async def size(self, image: str) -> int:
        """Bytes the image takes (0 when it is gone)."""
        try:
            async with self.runtime._call("image inspect", 30):
                info = await self.runtime.docker.images.inspect(image)
        except (ImageNotFound, ContainerNotFound):
            return 0
        return int(info.get("Size") or 0)

    async def remove(self, image: str) -> None:
        """Remove the image's tag (and its layers when nothing else uses them); ImageNotFound is fine."""
        try:
            async with self.runtime._call("image remove", 120):
                await self.runtime.docker.images.delete(image, force=False)
        except (ImageNotFound, ContainerNotFound):
            return


def _split_tag(image: str) -> tuple[str, str]:
    """("host:5000/name", "tag") of an image reference (tag "latest" when none)."""
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        name, _, tag = image.rpartition(":")
        return name, tag
    return image, "latest"


def _auth_header(auth: dict[str, str] | None, server: str) -> str:
    import base64

    doc = {**(auth or {}), "serveraddress": server}
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()


async def _raise_on_stream_error(resp: aiohttp.ClientResponse, what: str) -> list[str]:
    lines: list[str] = []
    async for raw in resp.content:
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except ValueError:
            continue
        if "error" in item:
            raise DockerError(f"{what} failed: {item['error']}\n" + "".join(lines[-20:]))
        if "stream" in item:
            lines.append(item["stream"])
    return lines
