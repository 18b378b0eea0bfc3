"""A real dataset record round-trips: SWE-bench Lite's marshmallow-code__marshmallow-1359, read
from the Parquet file SWE-bench published (../shared/datasets, in place), imported from a clone
whose base commit is marshmallow 3.0.0's source archive from PyPI (the release before the fix:
the record's patches apply to it as they are), its environment built from PyPI's wheels
(`tasks build-env`), validated through a real daemon: the gold patch scores 1.0 although the
record lists four of its tests by ids cut at a space, the empty patch 0. An agent in the episode
runs the tests as the grader does (PYTHONPATH=src reaches it)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from helpers import daemon_config, running_daemon
from rlsandbox.client import AsyncClient
from rlsandbox.daemon import cli
from rlsandbox.daemon.cli_tasks import read_records
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.grading.audit import audit
from rlsandbox.daemon.grading.mine import history_from_archives
from rlsandbox.daemon.grading.task import load_tasks
from rlsandbox.daemon.grading.validate import validate
from rlsandbox.daemon.images.environments import build_environment
from rlsandbox.daemon.runtime.docker import DockerRuntime

ROOT = Path(__file__).resolve().parent.parent.parent
DATASETS = ROOT.parent / "shared" / "datasets"
FIXTURES = ROOT / ".venv" / "test-fixtures"
RECORD = "marshmallow-code__marshmallow-1359"
pytestmark = pytest.mark.skipif(not DATASETS.is_dir(), reason=f"no shared dataset records beside the checkout ({DATASETS})")


def clone_of_the_releases(tmp_path: Path, *versions: str) -> tuple[Path, list[str]]:
    """A git clone whose commits are the source trees of marshmallow's ``versions``, in order
    (a history built from successive releases: real code, real tests, real changes)."""
    archives = [FIXTURES / "sdists" / f"marshmallow-{v}.tar.gz" for v in versions]
    assert all(a.is_file() for a in archives), f"no marshmallow sdists in {FIXTURES}: run bash scripts/test_fixtures.sh"
    repo = tmp_path / "marshmallow"
    return repo, history_from_archives(archives, repo)


REQUIREMENTS = ["pytz", "simplejson", "python-dateutil", "setuptools<70"]  # setuptools: distutils, which it imports


async def test_a_swebench_lite_record_round_trips(docker_runtime: DockerRuntime, tmp_path: Path) -> None:
    record = next(r for r in read_records(DATASETS / "swe-bench" / "SWE-bench_Lite-dev.parquet") if r["instance_id"] == RECORD)
    repo, [commit] = clone_of_the_releases(tmp_path, "3.0.0")
    # The one field the clone changes: its commit id is not upstream's (the tree is the release's).
    (tmp_path / "in.jsonl").write_text(json.dumps({**record, "base_commit": commit}) + "\n")
    imported, built = tmp_path / "tasks.jsonl", tmp_path / "out" / "tasks.jsonl"
    built.parent.mkdir()
    argv = ["tasks", "import-swebench", str(tmp_path / "in.jsonl"), "--pool", "python", "--repo", str(repo)]
    assert await asyncio.to_thread(cli.main, [*argv, "--env", "PYTHONPATH=src", "--out", str(imported)]) == 0
    build = ["tasks", "build-env", str(imported), *(a for r in REQUIREMENTS for a in ("--requirement", r)),
             "--wheelhouse", str(FIXTURES / "wheels"), "--offline", "--out", str(built)]  # fmt: skip
    assert await asyncio.to_thread(cli.main, build) == 0
    task = load_tasks(built)[0]
    env = task.spec.metadata["environment"]
    assert task.spec.image == env["image"] and any(p.startswith("pytz-") for p in env["packages"])
    assert task.spec.evaluation.id_match == "first-word" and task.spec.workspace.path == "/workspace"
    # The same packages again: the same image, found by its content.
    assert await asyncio.to_thread(cli.main, [*build[:-1], str(tmp_path / "again.jsonl")]) == 0
    assert load_tasks(tmp_path / "again.jsonl")[0].spec.image == task.spec.image
    try:
        template = PoolConfig(name="envs", image="rlsandbox-env/*", min_ready=0, max_total=8)
        config = daemon_config(pools=[], image_pools={"templates": [template], "idle_evict": 1.0})
        async with running_daemon(config) as node, AsyncClient(node.address, timeout=180) as client:
            async with client.session(task=task) as s:  # the agent runs the tests as the grader does (not the new one)
                ran = await s.exec("python3 -m pytest -rA -p no:cacheprovider tests/test_fields.py", timeout=120)
                assert ran.exit_code == 0 and b"= 76 passed" in ran.stdout, ran.stdout[-1500:]
                assert b"test_datetime_list_inner_format" not in ran.stdout  # the record's test patch is the clean room's
                await s.write_files({"src/marshmallow/fields.py": "broken = (\n"})
                broken = await s.grade()
            report = await validate(client, [task], runs=1, concurrency=2)
            audited = await audit(client, [task], concurrency=2)  # its one hunk's function, stubbed twice
            async with client.session(task=task) as s:
                applied = await s.exec(["git", "apply", "-"], stdin=record["patch"].encode())
                assert applied.exit_code == 0, applied.stderr
                solved = await s.grade()
    finally:
        await docker_runtime.images.remove(task.spec.image)
    assert [v.verdict for v in report.tasks] == ["valid"], [v.problems for v in report.tasks]
    assert [(v.verdict, v.tried, v.accepted) for v in audited.tasks] == [("strong", 2, [])], audited.tasks
    assert (broken.status, broken.reward) == ("ok", 0.0), broken.message
    assert (solved.status, solved.reward) == ("ok", 1.0), (solved.message, solved.log[-2000:])
    graded = {t.id: t.outcome for t in solved.tests}
    cut = "tests/test_fields.py::TestErrorMessages::test_make_error[required-Missing"
    assert graded[cut] == "passed" and "cut at the first space" in solved.message, solved.message
    assert not solved.tampering, solved.tampering


async def test_mining_two_releases_finds_the_records_test(docker_runtime: DockerRuntime, tmp_path: Path) -> None:
    """`tasks mine` on a history of two releases (marshmallow 3.0.0, then 3.0.1): the commit
    changes code and tests, its tests run twice before and after in clean rooms, and the one test
    that fails before and passes after is the one SWE-bench Lite lists for the fix inside that
    release (marshmallow-1359); the packaging metadata that changed with the release (its
    *.egg-info) is not part of the gold patch. The mined task validates."""
    record = next(
        r for r in read_records(DATASETS / "swe-bench" / "SWE-bench_Lite-dev.sample.jsonl") if r["instance_id"] == RECORD
    )
    repo, commits = clone_of_the_releases(tmp_path, "3.0.0", "3.0.1")
    env = await build_environment(docker_runtime, "marshmallow", REQUIREMENTS, wheelhouse=FIXTURES / "wheels", offline=True)
    try:
        template = PoolConfig(name="envs", image="rlsandbox-env/*", min_ready=0, max_total=8)
        config = daemon_config(pools=[], image_pools={"templates": [template], "idle_evict": 1.0})
        async with running_daemon(config) as node, AsyncClient(node.address, timeout=180) as client:
            argv = ["tasks", "mine", "--repo", str(repo), "--image", env.tag, "--env", "PYTHONPATH=src", "--runs", "2",
                    "--target", node.address, "--out", str(tmp_path / "mined")]  # fmt: skip
            assert await asyncio.to_thread(cli.main, argv) == 0
            [task] = load_tasks(tmp_path / "mined")
            report = await validate(client, [task], runs=1, concurrency=2)
    finally:
        await docker_runtime.images.remove(env.tag)
    ev = task.spec.evaluation
    assert task.spec.metadata["commit"] == commits[1] and task.spec.metadata["base_commit"] == commits[0]
    assert ev.fail_to_pass == json.loads(record["FAIL_TO_PASS"])  # the record's own, found by running
    assert {t.split(" ")[0] for t in ev.pass_to_pass} >= set(json.loads(record["PASS_TO_PASS"]))
    assert task.spec.gold_patch and "src/marshmallow/fields.py" in task.spec.gold_patch
    assert "egg-info" not in task.spec.gold_patch and "tests/test_fields.py" in (ev.test_patch or "")
    assert task.spec.problem_statement == "marshmallow-3.0.1"
    assert [v.verdict for v in report.tasks] == ["valid"], [v.problems for v in report.tasks]
