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
from helpers import BUSYBOX, FMT, PYTHON, build_image, daemon_config, eventually, running_daemon, swesmith_clone
from rlsandbox.client import AsyncClient, FailedPreconditionError, InvalidArgumentError
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


async def test_names_past_the_engines_length_limit_are_invalid_arguments(node: NodeDaemon, docker_runtime: DockerRuntime) -> None:
    """Found by the API fuzzer: a 300-character image name reached the engine and came back INTERNAL.
    The node's check agrees with the real engine at the limit, for each way the engine reads a name."""
    import aiodocker

    for longest in ("r.io:5000/" + "n" * 245, "a/" + "n" * 243, "n" * 237):
        with pytest.raises(aiodocker.DockerError, match="no such image"):
            await docker_runtime.docker.images.inspect(longest)  # within the limit: only absent
        with pytest.raises(aiodocker.DockerError, match="must not be more than 255"):
            await docker_runtime.docker.images.inspect(longest + "n")
    async with AsyncClient(node.address, timeout=60) as client:
        with pytest.raises(InvalidArgumentError, match="at most 255"):
            await client.create_session(image="x" * 300)


async def image_pool_removed(node: NodeDaemon, docker_runtime: DockerRuntime, tag: str) -> None:
    """Wait for the pool of the test image ``tag`` to go idle-evicted with its containers, then
    remove the image."""
    pool = image_pool_name(tag)

    async def pool_gone() -> bool:
        return pool not in node.pools and not await docker_runtime.list_containers({LABEL_POOL: pool})

    await eventually(pool_gone, timeout=30, what=f"pool {pool} and its containers removed")
    await docker_runtime.images.remove(tag)


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
        await image_pool_removed(node, docker_runtime, tag)


R2E_TESTS = """from oracle import expected
from pkg.fmt import width


def test_width():
    assert width(78, 2) == expected(78, 2)


class TestFmt:
    def test_zero(self):
        assert width(0, 0) == 0


def test_known_broken():
    assert False
"""


async def test_an_r2egym_record_runs_in_its_image_with_its_tests_hidden_and_its_venv_the_images(
    node: NodeDaemon, docker_runtime: DockerRuntime, tmp_path: Path
) -> None:
    """R2E-Gym's own layout: the repository at /testbed before its fix (the fix a later commit),
    its virtualenv inside it (/testbed/.venv), the hidden tests in the image at /r2e_tests, and a
    record that names tests without their file. Imported with the tests read from the image; the
    policy finds neither the tests nor the fix; the virtualenv is the image's in the clean room,
    whatever the episode did to its own (deleted, or made too big to read)."""
    from rlsandbox.daemon import cli
    from rlsandbox.daemon.grading.task import load_tasks

    repo, _, _, _ = swesmith_clone(tmp_path)  # HEAD has the bug; its parent is the fix
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "checkout", "-q", "-b", "fixed", "HEAD~1"], check=True)
    subprocess.run([*git, "checkout", "-q", "-"], check=True)  # the fix stays reachable, as in R2E-Gym's images
    (repo / "run_tests.sh").write_text(".venv/bin/python -W ignore -m pytest -rA r2e_tests\n")
    tests = tmp_path / "r2e_tests"
    tests.mkdir()
    (tests / "test_1.py").write_text(R2E_TESTS)
    tag = f"rls-test/r2egym:{uuid.uuid4().hex[:8]}"
    dockerfile = (
        f"FROM {PYTHON}\nCOPY repo /testbed\nCOPY r2e_tests /r2e_tests\nWORKDIR /testbed\n"
        "RUN python3 -m venv --without-pip --system-site-packages /testbed/.venv && "
        "echo 'import sys; sys.stderr.write(\"ran in the venv\\\\n\")' "
        "> /testbed/.venv/lib/python3.11/site-packages/r2e_marker.pth && "
        "echo 'def expected(total, indent): return 76' > /testbed/.venv/lib/python3.11/site-packages/oracle.py\n"
    )
    await build_image(docker_runtime, tag, dockerfile, repo=repo, r2e_tests=tests)
    before = "=== short test summary info ===\nFAILED r2e_tests/test_1.py::test_width - assert\n"
    before += "PASSED r2e_tests/test_1.py::TestFmt::test_zero\nFAILED r2e_tests/test_1.py::test_known_broken\n"
    record = {
        "repo_name": "fmt",
        "commit_hash": "f" * 40,
        "docker_image": tag,
        "problem_statement": "[ISSUE]\nwidth() is negative.\n[/ISSUE]",
        "expected_output_json": json.dumps(
            {"test_width": "PASSED", "TestFmt.test_zero": "PASSED", "test_known_broken": "FAILED"}
        ),
        "execution_result_content": json.dumps({"old_commit_res_stdout": before, "test_file_names": [], "test_file_codes": []}),
    }
    (tmp_path / "r2e.jsonl").write_text(json.dumps(record) + "\n")
    out = tmp_path / "tasks.jsonl"
    argv = ["tasks", "import-swebench", str(tmp_path / "r2e.jsonl"), "--image", "field", "--tests-from-image", "--out", str(out)]
    try:
        assert await asyncio.to_thread(cli.main, argv) == 0
        [task] = load_tasks(out)
        ev = task.spec.evaluation
        assert (ev.fail_to_pass, ev.pass_to_pass) == (
            ["r2e_tests/test_1.py::test_width"],
            ["r2e_tests/test_1.py::TestFmt::test_zero"],
        )
        assert ev.hidden_tests == {"r2e_tests/test_1.py": R2E_TESTS}
        async with AsyncClient(node.address, timeout=120) as client, client.session(task=task) as s:
            seen = await s.exec(
                "ls -d /r2e_tests r2e_tests run_tests.sh 2>&1 | grep -c 'No such file'; git status --porcelain; "
                "git log --all --oneline | wc -l; git log --all -p | grep -c 'total - indent'; command -v python"
            )
            assert seen.stdout == b"3\n1\n0\n/testbed/.venv/bin/python\n", (seen.stdout, seen.stderr)
            unsolved = await s.grade()
            # The policy writes tests that pass where the tests arrive: never read.
            await s.write_files({"r2e_tests/test_1.py": "def test_width():\n    pass\n"})
            cheated = await s.grade()
            # It shadows the virtualenv's module the tests compare with: the image's, not the project's.
            await s.write_files({"oracle.py": "def expected(total, indent):\n    return indent - total\n"})
            shadowed = await s.grade()
            await s.exec("rm oracle.py")
            # It fixes the code, and wrecks its own virtualenv: the clean room has the image's.
            await s.write_files({"pkg/fmt.py": FMT})
            wrecked = await s.exec("rm -rf .venv/lib && truncate -s 300M .venv/big && git status --porcelain")
            assert wrecked.exit_code == 0 and wrecked.stdout == b" M pkg/fmt.py\n", wrecked.stdout
            solved = await s.grade()
        assert (unsolved.reward, cheated.reward, shadowed.reward, solved.reward) == (0.0, 0.0, 0.0, 1.0), (
            shadowed.message,
            solved.message,
        )
        assert any("oracle.py" in t and "shadows" in t for t in shadowed.tampering), shadowed.tampering
        assert b"ran in the venv" in solved.log, solved.log[-2000:]
    finally:
        await image_pool_removed(node, docker_runtime, tag)
