"""Fixtures shared by every test: a real Docker engine, the real images, leak checks."""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import BUSYBOX, PYTHON, STATE_DIR, TEST_OWNER, fail_on_loop_exceptions
from rlsandbox.daemon.runtime.docker import LABEL_MANAGED, LABEL_OWNER, DockerRuntime


@pytest.fixture(autouse=True)
async def _fail_on_unhandled_loop_exceptions() -> AsyncIterator[None]:
    """An exception nobody retrieved inside the event loop fails the test that caused it.

    Async, so that it runs in the tests' (session-wide) loop: a sync fixture sees no running loop
    and would install nothing (it did not, until this was found)."""
    async with fail_on_loop_exceptions():
        yield


_RUN_OWNER = re.compile(r"test-(\d+)-[0-9a-f]{6}")  # TEST_OWNER's shape: test-<pytest's pid>-<random>


def _dead_run(owner: str) -> bool:
    """Whether ``owner`` names a test run whose pytest process is gone (killed, or the machine
    restarted under it): what it left is debris nobody else will remove."""
    m = _RUN_OWNER.match(owner)
    return m is not None and not owner.startswith(TEST_OWNER) and not Path(f"/proc/{m.group(1)}").exists()


@pytest.fixture(scope="session", autouse=True)
def _state_dir() -> object:
    root = Path(STATE_DIR).parent
    for stale in root.iterdir() if root.is_dir() else ():
        if _dead_run(stale.name):
            shutil.rmtree(stale, ignore_errors=True)
    yield
    shutil.rmtree(STATE_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
async def docker_runtime() -> AsyncIterator[DockerRuntime]:
    runtime = DockerRuntime(owner=TEST_OWNER, instance="pytest")
    await runtime.start()
    try:
        await runtime.ping()
    except Exception as e:  # a test run without Docker is a broken setup, not a pass
        await runtime.close()
        pytest.fail(f"Docker engine not reachable ({e}); run scripts/bootstrap.sh first", pytrace=False)
    # A run that was killed, or whose machine restarted, left its containers (exited, say, 255);
    # they are this suite's, labelled, and would be counted as left behind by the next run.
    for c in await runtime.list_containers({LABEL_MANAGED: "1"}):
        if _dead_run(c.labels.get(LABEL_OWNER, "")):
            await runtime.remove(c.id)
    try:
        yield runtime
    finally:
        # Owners of this run: TEST_OWNER and the nodes tests name after it (TEST_OWNER-crash, ...).
        managed = await runtime.list_containers({LABEL_MANAGED: "1"})
        for c in managed:
            if c.labels.get(LABEL_OWNER, "").startswith(TEST_OWNER):
                await runtime.remove(c.id)
        await runtime.close()


@pytest.fixture(scope="session")
async def images(docker_runtime: DockerRuntime) -> dict[str, str]:
    """Make sure the test images exist (a no-op when `rlsandbox images build` ran already)."""
    from rlsandbox.daemon.images import ImageBuilder, default_images_dir

    builder = ImageBuilder(docker_runtime, default_images_dir())
    await builder.build(["busybox", "python-task", "node"])
    return {"busybox": BUSYBOX, "python": PYTHON, "node": "rlsandbox/node:latest"}


@pytest.fixture
async def no_leaks(docker_runtime: DockerRuntime) -> AsyncIterator[None]:
    """Asserts that the test left behind no container of the test owner that it created."""
    owned = {LABEL_MANAGED: "1", LABEL_OWNER: TEST_OWNER}
    before = {c.id for c in await docker_runtime.list_containers(owned)}
    yield
    left = [c.name for c in await docker_runtime.list_containers(owned) if c.id not in before]
    assert not left, f"containers leaked: {left}"
