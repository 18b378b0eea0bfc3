"""Images on the engine: labels (what a build was made from), imports of root filesystems, builds."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

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
        try:
            async with self.runtime._call("image inspect", 30):
                info = await self.runtime.docker.images.inspect(image)
        except (ImageNotFound, ContainerNotFound):
            return None
        return dict((info.get("Config") or {}).get("Labels") or {})

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
