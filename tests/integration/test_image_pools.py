"""Pools per image, on demand, against a real registry (Debian's docker-registry on localhost): a
session (or a task) names an image no pool has; the node pulls it, makes its pool from a
template, serves it, and removes the idle pool and the pulled image afterwards."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from helpers import BUSYBOX, FMT, PYTHON, daemon_config, eventually, running_daemon, swesmith_clone
from rlsandbox.client import AsyncClient, FailedPreconditionError
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.model import image_pool_name
from rlsandbox.daemon.runtime.docker import LABEL_POOL, DockerRuntime
from rlsandbox.daemon.server import NodeDaemon

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real registry on a free localhost port (the engine trusts 127.0.0.0/8 without TLS)."""
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.fail("docker-registry is not installed; run scripts/bootstrap.sh", pytrace=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = tmp_path_factory.mktemp("registry")
    config = root / "config.yml"
    config.write_text(
        f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "the registry did not start"
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
async def published(registry: str, docker_runtime: DockerRuntime, images: dict[str, str]) -> AsyncIterator[str]:
    """The busybox image published in the registry under a name this node does not have."""
    name = f"rls-test/busybox:{uuid.uuid4().hex[:8]}"
    remote = f"{registry}/{name}"
    await docker_runtime.images.tag(BUSYBOX, remote)
    await docker_runtime.images.push(remote)
    await docker_runtime.images.remove(remote)
    assert await docker_runtime.images.labels(name) is None
    yield name
    for image in (name, remote):
        await docker_runtime.images.remove(image)


@pytest.fixture(scope="module")
async def node(registry: str, published: str) -> AsyncIterator[NodeDaemon]:
    template = PoolConfig(name="tests", image="rls-test/*", memory_mb=64, max_total=4, min_ready=0)
    config = daemon_config(
        pools=[PoolConfig(name="busybox", image=BUSYBOX, min_ready=0, max_total=2, memory_mb=64)],
        image_pools={"registry": registry, "idle_evict": 1.0, "disk_budget_gb": 1e-9, "templates": [template]},
    )
    async with running_daemon(config) as daemon:
        yield daemon


async def test_a_session_on_an_image_no_pool_has(node: NodeDaemon, published: str, docker_runtime: DockerRuntime) -> None:
    async with AsyncClient(node.address, timeout=120) as client:
        async with client.session(image=published) as s:
            assert (await s.exec("echo from the image pool")).stdout == b"from the image pool\n"
            assert s.info.pool == image_pool_name(published)
            status = await client.node_status()
            pool = next(p for p in status.pools if p.name == s.info.pool)
            assert pool.image == published and pool.in_use == 1
        assert node.pools.pulled_total == 1
        # Idle past idle_evict: the pool goes, and the pulled image with it (disk budget ~0).
        for _ in range(100):
            if s.info.pool not in node.pools and await docker_runtime.images.labels(published) is None:
                break
            await asyncio.sleep(0.1)
        assert s.info.pool not in node.pools and node.pools.evicted_total >= 1
        assert await docker_runtime.images.labels(published) is None, "the pulled image stayed past the disk budget"


async def test_a_task_that_names_an_image_is_served_and_graded(node: NodeDaemon, published: str) -> None:
    task = {
        "id": "image-task",
        "image": published,
        "workspace": {"source": "bundle", "path": "/workspace"},
        "evaluation": {"test_command": "test -f done", "report_format": "exit-code"},
    }
    async with AsyncClient(node.address, timeout=120) as client:
        async with client.session(task=(json.dumps(task), b"")) as s:
            assert s.info.pool == image_pool_name(published)
            before = await s.grade()
            await s.write_files({"/workspace/done": "yes"})
            after = await s.grade()
        assert (before.reward, after.reward) == (0.0, 1.0), (before.message, after.message)


async def test_images_that_cannot_be_had_are_clear_errors(node: NodeDaemon) -> None:
    async with AsyncClient(node.address, timeout=120) as client:
        with pytest.raises(FailedPreconditionError, match="could not be pulled from"):
            await client.create_session(image="rls-test/absent:nope")
        with pytest.raises(FailedPreconditionError, match="no image_pools template matches image 'elsewhere/x:1'"):
            await client.create_session(image="elsewhere/x:1")


async def build_image(docker_runtime: DockerRuntime, tag: str, dockerfile: str, **folders: Path) -> None:
    """A test image from a Dockerfile and folders beside it (``name=path``: COPY name ...)."""
    import io
    import tarfile

    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for name, path in folders.items():
            tar.add(path, arcname=name)
    await docker_runtime.images.build(context.getvalue(), tag=tag, labels={"rlsandbox.test": "1"})


async def test_an_image_pool_works_in_the_images_workdir(node: NodeDaemon, docker_runtime: DockerRuntime) -> None:
    """Per-instance images (SWE-bench's /testbed) set their WORKDIR: sessions of their pool start
    there, and find the image's files, when the template names no workdir."""
    tag = f"rls-test/workdir:{uuid.uuid4().hex[:8]}"
    await build_image(docker_runtime, tag, f"FROM {BUSYBOX}\nWORKDIR /testbed\nRUN echo repo > /testbed/README\n")
    try:
        async with AsyncClient(node.address, timeout=120) as client, client.session(image=tag) as s:
            assert s.info.workdir == "/testbed"
            assert (await s.exec("pwd; cat README")).stdout == b"/testbed\nrepo\n"

        # Idle past idle_evict, the pool goes; its containers are destroyed behind it, and the
        # image can be removed only once the last of them is gone.
        async def pool_gone() -> bool:
            return s.info.pool not in node.pools and not await docker_runtime.list_containers({LABEL_POOL: s.info.pool})

        await eventually(pool_gone, timeout=30, what=f"pool {s.info.pool} and its containers removed")
    finally:
        await docker_runtime.images.remove(tag)


async def test_a_swesmith_task_in_its_own_image_starts_from_its_bug(
    node: NodeDaemon, docker_runtime: DockerRuntime, tmp_path: Path
) -> None:
    """SWE-smith as it runs: the repository in the instance's image at /testbed (at its clean
    commit, the bug's commit in its history), the record's bug patch applied in the sandbox before
    the history is reset. The policy finds the bug, not the fix: not in `git diff`, not in any
    commit of the history."""
    from rlsandbox.daemon.grading.importers import from_swebench

    repo, clean, _, bug = swesmith_clone(tmp_path)
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", clean], check=True)
    tag = f"rls-test/swesmith:{uuid.uuid4().hex[:8]}"
    # The datasets' test environment is a conda env at /opt/miniconda3/envs/testbed that only
    # bash's rc file activates: a stand-in interpreter there says that it ran.
    conda = tmp_path / "conda"
    conda.mkdir()
    (conda / "python").write_text('#!/bin/sh\necho "ran in the testbed env" >&2\nexec python3 "$@"\n')
    (conda / "python").chmod(0o755)
    dockerfile = f"FROM {PYTHON}\nCOPY conda /opt/miniconda3/envs/testbed/bin\nCOPY repo /testbed\nWORKDIR /testbed\n"
    await build_image(docker_runtime, tag, dockerfile, repo=repo, conda=conda)
    record = {
        "instance_id": "acme__fmt.0000aaaa.func_pm_op_swap__x1",
        "image_name": tag,
        "patch": bug,
        "FAIL_TO_PASS": ["tests/test_fmt.py::test_width"],
        "PASS_TO_PASS": ["tests/test_fmt.py::test_width_zero"],
    }
    spec = from_swebench(record, image="field")  # the default test command: python -m pytest
    try:
        async with AsyncClient(node.address, timeout=120) as client, client.session(task=(spec.model_dump_json(), b"")) as s:
            assert s.info.workdir == "/testbed"
            seen = await s.exec(
                "grep -c 'indent - total' pkg/fmt.py; git status --porcelain; git log --all --oneline | wc -l; "
                "git log --all -p | grep -c 'total - indent'; command -v python"
            )
            assert seen.stdout == b"1\n1\n0\n/opt/miniconda3/envs/testbed/bin/python\n", (seen.stdout, seen.stderr)
            unsolved = await s.grade()
            await s.write_files({"pkg/fmt.py": FMT})
            solved = await s.grade()
        assert (unsolved.reward, solved.reward) == (0.0, 1.0), (unsolved.message, solved.message)
        assert b"ran in the testbed env" in solved.log, solved.log[-2000:]
    finally:
        pool = image_pool_name(tag)

        async def pool_gone() -> bool:
            return pool not in node.pools and not await docker_runtime.list_containers({LABEL_POOL: pool})

        await eventually(pool_gone, timeout=30, what=f"pool {pool} and its containers removed")
        await docker_runtime.images.remove(tag)
