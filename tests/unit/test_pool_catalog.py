"""Pools per image (pool/catalog.py) over a fake engine: made once per image from the first
matching template, pulled when missing (or a clear error), the warm budget shared by demand,
idle pools removed, pulled images trimmed to the disk budget."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.errors import FailedPrecondition
from rlsandbox.daemon.grading.task import TaskSpec
from rlsandbox.daemon.model import check_image_reference, image_pool_name
from rlsandbox.daemon.pool import CreateLimiter
from rlsandbox.daemon.pool.catalog import PoolCatalog
from test_warm_pool import FakeFactory


class FakeImages:
    def __init__(self, local: set[str]) -> None:
        self.local = set(local)
        self.pulls: list[str] = []
        self.removed: list[str] = []

    async def config(self, image: str) -> dict[str, str] | None:
        return {"WorkingDir": "/testbed"} if image in self.local else None

    async def pull(self, image: str, *, auth: object = None) -> None:
        await asyncio.sleep(0.01)
        self.pulls.append(image)
        self.local.add(image)

    async def tag(self, source: str, target: str) -> None:
        self.local.add(target)

    async def size(self, image: str) -> int:
        return 100 if image in self.local else 0

    async def remove(self, image: str) -> None:
        self.local.discard(image)
        self.removed.append(image)


class Runtime:
    def __init__(self, images: FakeImages) -> None:
        self.images = images


def maker(template: PoolConfig):  # type: ignore[no-untyped-def]
    return lambda name, image, workdir: template.model_copy(update={"name": name, "image": image}).spec()


Made = tuple[PoolCatalog, FakeImages]


@pytest.fixture
async def catalog() -> AsyncIterator[Made]:
    images = FakeImages({"swe/a:1", "swe/b:1"})
    factory = FakeFactory()
    factory.runtime = Runtime(images)  # type: ignore[attr-defined]
    tasks: list[asyncio.Task[None]] = []

    def spawn(coro, name):  # type: ignore[no-untyped-def]
        tasks.append(asyncio.get_running_loop().create_task(coro, name=name))

    big = PoolConfig(name="swe", image="swe/*", memory_mb=4096, max_total=8)
    other = PoolConfig(name="other", image="other/*", max_total=2)
    cat = PoolCatalog(
        {}, factory=factory, limiter=CreateLimiter(4), max_waiters=16,  # type: ignore[arg-type]
        templates=[("swe/*", maker(big)), ("other/*", maker(other))], spawn=spawn,
        warm_budget=4, max_pools=2, idle_evict=60, registry="reg:5000", disk_budget_bytes=150,
    )  # fmt: skip
    yield cat, images
    await cat.close(timeout=5)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_one_pool_per_image_from_the_first_matching_template(
    catalog: Made,
) -> None:
    cat, images = catalog
    a1, a2 = await asyncio.gather(cat.for_image("swe/a:1"), cat.for_image("swe/a:1"))
    assert a1 is a2 and a1.name == image_pool_name("swe/a:1") and cat[a1.name] is a1
    assert a1.spec.container.limits.memory_bytes == 4096 << 20 and a1.spec.max_total == 8
    assert not images.pulls
    with pytest.raises(FailedPrecondition, match="no image_pools template matches image 'gpu/x:1'"):
        await cat.for_image("gpu/x:1")


async def test_a_missing_image_is_pulled_from_the_registry_and_tagged(
    catalog: Made,
) -> None:
    cat, images = catalog
    pool = await cat.for_image("other/new:2")
    assert images.pulls == ["reg:5000/other/new:2"] and "other/new:2" in images.local
    assert pool.spec.container.image == "other/new:2" and cat.pulled_total == 1
    cat.registry = ""
    with pytest.raises(FailedPrecondition, match="not on this node and no registry is configured"):
        await cat.for_image("other/absent:1")


async def test_the_warm_budget_follows_demand_and_idle_pools_go(catalog: Made) -> None:
    cat, _ = catalog
    a = await cat.for_image("swe/a:1")
    b = await cat.for_image("swe/b:1")
    cat.rebalance()
    assert (a.min_ready, b.min_ready) == (0, 0)  # no demand yet: nothing kept warm
    for _ in range(3):
        a.release(await a.acquire(5), "done")
    b.release(await b.acquire(5), "done")
    cat.rebalance()
    assert (a.min_ready, b.min_ready) == (3, 1)  # 4 ready in all, 3:1 like the demand
    cat.idle_evict = 0.0
    await cat._evict()
    assert not cat.image_pools and cat.evicted_total == 2


async def test_max_pools_removes_the_longest_unused_and_images_trim_to_the_disk_budget(
    catalog: Made,
) -> None:
    cat, images = catalog
    await cat.for_image("other/p:1")  # pulled (100 bytes)
    await cat.for_image("other/q:1")  # pulled (100 bytes): 200 > the 150 budget
    await cat._trim_images()
    assert not images.removed  # both in use by their pools
    await cat.for_image("swe/a:1")  # max_pools = 2: the longest unused pool goes
    assert image_pool_name("other/p:1") not in cat and len(cat.image_pools) == 2
    await cat._trim_images()
    assert images.removed == ["other/p:1"]  # unused now, least recently used, over budget


async def test_a_removed_image_pool_leaves_no_metric_series(catalog: Made) -> None:
    """One image per instance means thousands of pools over a run: their series go with them."""
    from rlsandbox.daemon.metrics import Metrics

    cat, _ = catalog
    metrics = Metrics()
    cat.on_evict = metrics.forget_pool
    pool = await cat.for_image("swe/a:1")
    metrics.exec_seconds.labels(pool.name).observe(0.01)
    metrics.create_seconds.labels(pool.name, "pool").observe(0.01)
    metrics.exec_seconds.labels("python").observe(0.01)
    assert pool.name in metrics.render().decode()
    cat.idle_evict = 0.0
    await cat._evict()
    text = metrics.render().decode()
    assert pool.name not in text and 'pool="python"' in text


@pytest.mark.parametrize(
    "image",
    ["rlsandbox/python-task:latest", "busybox", "127.0.0.1:5000/team/img:1.0", "localhost:5000/img",
     "swebench/sweb.eval.x86_64.django__django-11099:latest", "ghcr.io/a-b/c@sha256:" + "a" * 64],
)  # fmt: skip
def test_image_references_the_engine_parses_are_accepted(image: str) -> None:
    assert check_image_reference(image) == image


def test_the_name_limit_is_the_engines_and_leaves_out_tag_and_digest() -> None:
    """Found by the API fuzzer: a 300-character name passed this check and the engine refused it
    ("repository name must not be more than 255 characters"), an INTERNAL error for the caller.
    The limit is on the name as the engine normalises it (measured against dockerd 20.10: its image
    inspect refuses one character more)."""
    for longest in ("r.io:5000/" + "n" * 245, "a/" + "n" * 243, "n" * 237):  # docker.io/[library/] is added
        assert check_image_reference(longest) == longest
        assert check_image_reference(f"{longest}:{'t' * 128}@sha256:{'a' * 64}")
        with pytest.raises(ValueError, match="at most 255"):
            check_image_reference(longest + "n")


@pytest.mark.parametrize(
    "image",
    ["/etc/shadow", "../x", "UPPER/case", "a b", "x:", "", "a//b", "img:tag:tag", "x" * 600, "x" * 300,
     "a/" + "b" * 254 + ":1"],
)  # fmt: skip
def test_anything_else_is_refused_before_it_reaches_the_engine(image: str) -> None:
    """Found by the API fuzzer: an image named "/etc/shadow" made the engine client fail with an
    internal error (the path became a redirect); now it is INVALID_ARGUMENT, in a request and in a task."""
    with pytest.raises(ValueError, match="is not an image reference"):
        check_image_reference(image)
    with pytest.raises(ValueError, match=r"is not an image reference|at most 512 characters"):
        TaskSpec.model_validate({"id": "t", "image": image or "/", "evaluation": {"test_command": "true"}})


def test_an_image_pool_works_in_its_images_workdir_unless_the_template_names_one() -> None:
    from rlsandbox.daemon.server import _template_maker

    plain = _template_maker(PoolConfig(name="t", image="swe/*"))
    assert plain("p", "swe/a:1", "/testbed").container.workdir == "/testbed"  # SWE-bench's WORKDIR
    assert plain("p", "swe/a:1", "").container.workdir == "/workspace"  # none: the pools' default
    assert plain("p", "swe/a:1", "/").container.workdir == "/workspace"
    named = _template_maker(PoolConfig(name="t", image="swe/*", workdir="/work"))
    assert named("p", "swe/a:1", "/testbed").container.workdir == "/work"
