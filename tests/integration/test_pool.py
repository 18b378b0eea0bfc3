"""Warm pools against the real engine: hand-out speed, refill, no reuse, backoff, orphans."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
from rlsandbox.daemon.errors import PoolUnhealthy, ResourceExhausted, SandboxError, Unavailable
from rlsandbox.daemon.model import ContainerSpec, ExecRequest
from rlsandbox.daemon.pool import CreateLimiter, PoolSpec, Reconciler, SandboxFactory, WarmPool
from rlsandbox.daemon.runtime.docker import LABEL_MANAGED, LABEL_OWNER, DockerRuntime

pytestmark = [pytest.mark.docker]


@contextlib.asynccontextmanager
async def running(pool: WarmPool) -> AsyncIterator[WarmPool]:
    task = asyncio.create_task(pool.run())
    try:
        yield pool
    finally:
        await pool.close()
        await task


async def wait_for(predicate: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def test_hundred_concurrent_acquires_with_min_ready_twenty(
    docker_runtime: DockerRuntime, images: dict[str, str], no_leaks: None
) -> None:
    factory = SandboxFactory(docker_runtime)
    spec = PoolSpec(name="burst", container=ContainerSpec(image=images["busybox"]), min_ready=20, max_total=120)
    async with running(WarmPool(spec, factory, limiter=CreateLimiter(4))) as pool:
        await wait_for(lambda: pool.stats().ready == 20, 60)
        waited = pool.stats().acquired_waited_total
        warm = [await pool.acquire(timeout=1) for _ in range(20)]
        # Warm hand-outs: none of the 20 waited for a sandbox to be made (a count, not a clock).
        assert pool.stats().acquired_waited_total == waited
        rest = await asyncio.gather(*(pool.acquire(timeout=120) for _ in range(80)))
        sandboxes = warm + list(rest)
        assert len({s.container_id for s in sandboxes}) == 100
        assert pool.stats().in_use == 100
        outputs = await asyncio.gather(*(s.exec(ExecRequest(argv=("echo", s.name))) for s in sandboxes))
        assert [o.stdout for o in outputs] == [f"{s.name}\n".encode() for s in sandboxes]
        for s in sandboxes:
            pool.release(s)  # returns at once: removal happens behind it
        assert pool.stats().in_use == 0 and pool.stats().destroying > 0
        # Removal finishes and refill brings the pool back to min_ready with fresh sandboxes.
        await wait_for(lambda: pool.stats().ready == 20 and pool.stats().destroying == 0, 60)
        stats = pool.stats()
        assert stats.in_use == 0 and stats.destroyed_total == 100 and stats.created_total >= 120


async def test_released_sandbox_is_destroyed_never_reused(
    docker_runtime: DockerRuntime, images: dict[str, str], no_leaks: None
) -> None:
    factory = SandboxFactory(docker_runtime)
    spec = PoolSpec(name="noreuse", container=ContainerSpec(image=images["python"]), min_ready=1, max_total=3)
    async with running(WarmPool(spec, factory, limiter=CreateLimiter(2))) as pool:
        first = await pool.acquire(timeout=60)
        await first.exec(ExecRequest(shell="echo dirty > /tmp/state"))
        pool.release(first)
        await wait_for(lambda: pool.stats().destroying == 0, 60)
        assert await docker_runtime.list_containers({"rlsandbox.pool": "noreuse", LABEL_OWNER: docker_runtime.owner})
        ids = {c.id for c in await docker_runtime.list_containers({"rlsandbox.pool": "noreuse"})}
        assert first.container_id not in ids, "released sandbox still exists"
        second = await pool.acquire(timeout=60)
        assert second.container_id != first.container_id
        r = await second.exec(ExecRequest(shell="cat /tmp/state"))
        assert r.exit_code != 0, "state of a released sandbox leaked into the next one"
        pool.release(second)


async def test_acquire_deadline_and_bounded_waiters(
    docker_runtime: DockerRuntime, images: dict[str, str], no_leaks: None
) -> None:
    factory = SandboxFactory(docker_runtime)
    spec = PoolSpec(name="tight", container=ContainerSpec(image=images["busybox"]), min_ready=0, max_total=1)
    pool = WarmPool(spec, factory, limiter=CreateLimiter(1), max_waiters=2)
    async with running(pool):
        held = await pool.acquire(timeout=60)
        with pytest.raises(ResourceExhausted, match=r"within 0\.3 s") as info:
            await pool.acquire(timeout=0.3)
        assert info.value.retry_after is not None
        waiters = [asyncio.create_task(pool.acquire(timeout=30)) for _ in range(2)]
        await asyncio.sleep(0.05)
        with pytest.raises(ResourceExhausted, match="already waiting"):
            await pool.acquire(timeout=5)
        pool.release(held)
        got = await asyncio.wait_for(waiters[0], 60)
        pool.release(got)
        pool.release(await asyncio.wait_for(waiters[1], 60))
    with pytest.raises(Unavailable, match="shutting down"):
        await pool.acquire(timeout=1)


async def test_failing_setup_backs_off_and_is_reported(
    docker_runtime: DockerRuntime, images: dict[str, str], no_leaks: None
) -> None:
    factory = SandboxFactory(docker_runtime)
    spec = PoolSpec(
        name="broken",
        container=ContainerSpec(image=images["busybox"]),
        min_ready=2,
        max_total=4,
        setup=("echo preparing; exit 3",),
    )
    async with running(WarmPool(spec, factory, limiter=CreateLimiter(2))) as pool:
        await wait_for(lambda: pool.stats().consecutive_failures >= 3, 30)
        stats = pool.stats()
        assert "exit 3" in (stats.last_error or "") and stats.backing_off_for > 0
        with pytest.raises(PoolUnhealthy, match="failed to create"):
            await pool.acquire(timeout=5)
        failures_then = pool.stats().failed_total
        await asyncio.sleep(1.0)
        # Backing off: failures grow slowly (exponential delays), not in a tight loop.
        assert pool.stats().failed_total - failures_then <= 2
        assert pool.stats().ready == 0


async def test_setup_commands_run_before_ready(docker_runtime: DockerRuntime, images: dict[str, str], no_leaks: None) -> None:
    factory = SandboxFactory(docker_runtime)
    spec = PoolSpec(
        name="setup",
        container=ContainerSpec(image=images["python"]),
        min_ready=1,
        max_total=2,
        setup=("mkdir -p /workspace/proj && echo ready > /workspace/proj/flag",),
    )
    async with running(WarmPool(spec, factory, limiter=CreateLimiter(2))) as pool, pool.lease(timeout=60) as sb:
        r = await sb.exec(ExecRequest(argv=("cat", "/workspace/proj/flag")))
        assert r.stdout == b"ready\n"


async def test_dead_ready_sandbox_is_not_handed_out(
    docker_runtime: DockerRuntime, images: dict[str, str], no_leaks: None
) -> None:
    factory = SandboxFactory(docker_runtime)
    spec = PoolSpec(name="dies", container=ContainerSpec(image=images["python"]), min_ready=1, max_total=3)
    async with running(WarmPool(spec, factory, limiter=CreateLimiter(2))) as pool:
        await wait_for(lambda: pool.stats().ready == 1, 60)
        victim = pool._ready[0]
        await docker_runtime.docker.containers.container(victim.container_id).kill()
        await wait_for(lambda: not victim.alive, 10)
        got = await pool.acquire(timeout=60)
        assert got.container_id != victim.container_id
        assert (await got.exec(ExecRequest(argv=("true",)))).exit_code == 0
        pool.release(got)


async def test_orphans_of_a_dead_owner_are_removed(docker_runtime: DockerRuntime, images: dict[str, str]) -> None:
    # A daemon with this owner id "died": its containers are still there, nobody knows them.
    dead = DockerRuntime(owner=f"{docker_runtime.owner}-dead", instance="crashed")
    await dead.start()
    try:
        dead_factory = SandboxFactory(dead)
        spec = PoolSpec(name="orphan", container=ContainerSpec(image=images["busybox"]))
        orphans = [await dead_factory.create(spec) for _ in range(3)]
        # The restarted daemon (same owner id, new process) sweeps at start-up...
        fresh = SandboxFactory(dead)
        keep = await fresh.create(spec)
        removed = await Reconciler(fresh).sweep(grace=0)
        assert sorted(removed) == sorted(o.name for o in orphans)
        left = await dead.list_containers({LABEL_MANAGED: "1", LABEL_OWNER: dead.owner})
        assert [c.id for c in left] == [keep.container_id], "a known sandbox was swept"
        # ...and periodic sweeps leave young containers alone (a create may be in flight).
        young = await dead_factory.create(spec)
        fresh.live.clear()
        assert await Reconciler(fresh, grace=3600).sweep() == []
        assert sorted(await Reconciler(fresh).sweep(grace=0)) == sorted([keep.name, young.name])
    finally:
        for c in await dead.list_containers({LABEL_OWNER: dead.owner}):
            await dead.remove(c.id)
        await dead.close()


async def test_a_removal_that_failed_is_retried_until_the_container_is_gone(
    docker_runtime: DockerRuntime, images: dict[str, str]
) -> None:
    """The engine refuses a remove (injected: a busy engine times out, which cannot be produced on
    demand): the container is kept for the reconciler, which removes it at its next run, soon,
    even though it is younger than the sweep's grace."""
    factory = SandboxFactory(docker_runtime)
    sb = await factory.create(PoolSpec(name="retry", container=ContainerSpec(image=images["busybox"])))
    real_remove = docker_runtime.remove
    calls = 0

    async def refuse_once(container: str, timeout: float | None = None) -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise SandboxError(f"engine did not answer the remove of {container} in time (injected)")
        return await real_remove(container, timeout=timeout)

    docker_runtime.remove = refuse_once  # type: ignore[method-assign]
    try:
        await factory.destroy(sb, "released")
        assert factory.unremoved == {sb.name: sb.container_id} and factory.remove_failures_total == 1
        still = await docker_runtime.list_containers({LABEL_OWNER: docker_runtime.owner})
        assert sb.container_id in [c.id for c in still], "the injected failure should have left it"
        reconciler = Reconciler(factory, interval=3600, grace=3600)
        runner = asyncio.create_task(reconciler.run())  # waits RETRY_INTERVAL, not the hour, while a removal is pending
        deadline = time.monotonic() + 30
        while factory.unremoved and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        reconciler.stop()
        await runner
        assert not factory.unremoved
        with pytest.raises(SandboxError):
            await docker_runtime.inspect(sb.container_id)  # gone
    finally:
        docker_runtime.remove = real_remove  # type: ignore[method-assign]
        with contextlib.suppress(SandboxError):
            await real_remove(sb.container_id)


async def test_two_nodes_on_one_host_never_sweep_each_others_agent_sockets(images: dict[str, str], no_leaks: None) -> None:
    """Daemons of several nodes share the agent socket root (its default): before each node kept
    its own folder under it, a node's sweep removed every folder it did not own, so the other
    node's new sandboxes failed to start ("error mounting ... no such file or directory") and its
    sandboxes could not be re-adopted after a restart."""
    from helpers import TEST_OWNER

    runtimes = [DockerRuntime(owner=f"{TEST_OWNER}-{n}", instance="pytest") for n in ("a", "b")]
    for r in runtimes:
        await r.start()
    try:
        factories = [SandboxFactory(r) for r in runtimes]
        spec = PoolSpec(name="python", container=ContainerSpec(image="rlsandbox/python-task:latest"), min_ready=0, max_total=2)
        sandbox = await factories[0].create(spec)
        try:
            folder = factories[0].socket_folder(sandbox.name)
            assert folder.is_dir()
            await Reconciler(factories[1], interval=3600).sweep(grace=0)  # the other node starts up
            assert folder.is_dir(), "another node's sweep removed this node's agent socket folder"
            assert (await sandbox.exec(ExecRequest(argv=("true",)))).exit_code == 0
        finally:
            await factories[0].destroy(sandbox)
        assert not folder.exists()  # its own node removes it
        roots = [f.socket_root for f in factories]
        assert roots[0] != roots[1] and roots[0].parent == roots[1].parent  # type: ignore[union-attr]
    finally:
        for r in runtimes:
            await r.close()


async def test_a_pool_with_a_long_name_gets_working_sandboxes(docker_runtime: DockerRuntime, images: dict[str, str]) -> None:
    """Pools made for images have long names (img-<image>-<digest>), and a sandbox's socket folder
    was named after its container: the agent's socket path went past the 107 bytes a unix socket
    may have ("AF_UNIX path too long"). The folder is now named by a digest of the container name."""
    factory = SandboxFactory(docker_runtime)
    name = "img-" + "r" * 80 + "-0123abcd"
    sandbox = await factory.create(PoolSpec(name=name, container=ContainerSpec(image="rlsandbox/python-task:latest")))
    try:
        assert len(str(factory.socket_folder(sandbox.name) / "agent.sock")) < 108 < len(sandbox.name) + 40
        assert (await sandbox.exec(ExecRequest(argv=("echo", "ok")))).stdout == b"ok\n"
    finally:
        await factory.destroy(sandbox)
