"""A Harbor task end to end: `rlsandbox tasks import-harbor --build` builds its environment image
with the real engine, a daemon makes a pool for that image on demand, the oracle solution
(solution/solve.sh) run in a session scores 1.0, an untouched session the partial reward its
verifier writes, and a policy that plants a reward file or test files of its own gains nothing.
Then harbor itself (0.26, on Debian 13's Python 3.13 in a container: harbor needs >= 3.12) runs
trials on the adapter by import path, with its own verifier and with the rlsandbox one."""

from __future__ import annotations

import asyncio
import hashlib
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import tomllib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers import daemon_config, running_daemon
from rlsandbox.client import AsyncClient
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.images import ImageBuilder
from rlsandbox.daemon.runtime.docker import DockerRuntime
from rlsandbox.daemon.server import NodeDaemon

pytestmark = pytest.mark.docker

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "harbor"


@pytest.fixture(scope="module")
def harbor_tasks_file(images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("harbor") / "tasks.jsonl"
    cli = [sys.executable, "-m", "rlsandbox.daemon.cli", "tasks", "import-harbor", str(FIXTURES), "--build", "--out", str(out)]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "1 task(s) imported" in done.stderr
    return out


@pytest.fixture(scope="module")
def harbor_task(harbor_tasks_file: Path) -> dict[str, object]:
    [line] = harbor_tasks_file.read_text().splitlines()
    return dict(json.loads(line))


@pytest.fixture(scope="module")
async def node(harbor_task: dict[str, object]) -> AsyncIterator[NodeDaemon]:
    template = PoolConfig(name="harbor", image="rlsandbox-harbor/*", min_ready=0, max_total=8)
    config = daemon_config(pools=[], image_pools={"templates": [template]})
    async with running_daemon(config) as daemon:
        yield daemon


async def test_the_oracle_solution_scores_one_and_doing_nothing_scores_what_the_verifier_says(
    node: NodeDaemon, harbor_task: dict[str, object]
) -> None:
    solve = str(harbor_task["metadata"]["solution_script"])  # type: ignore[index]
    async with AsyncClient(node.address, timeout=120) as client:
        async with client.session(task=harbor_task) as s:
            assert s.info.workdir == "/app" and s.info.task_id == "fix-greeting"
            assert (await s.exec("ls /tests 2>&1 || echo no-tests")).stdout_text.strip().endswith("no-tests")
            assert (await s.exec(["bash", "-c", solve])).exit_code == 0
            solved = await s.grade()
        async with client.session(task=harbor_task) as s:
            untouched = await s.grade()
    assert solved.status == "ok" and solved.reward == 1.0, solved.message
    # The verifier's own partial credit: one of its three checks passes without the fix.
    assert untouched.status == "ok" and untouched.reward == pytest.approx(1 / 3), untouched.message


async def test_planted_reward_files_and_tests_gain_nothing(node: NodeDaemon, harbor_task: dict[str, object]) -> None:
    async with AsyncClient(node.address, timeout=120) as client, client.session(task=harbor_task) as s:
        hack = (
            "mkdir -p /logs/verifier /tests && echo 1.0 > /logs/verifier/reward.txt && "
            "printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh && "
            "mkdir -p .rlsandbox-harbor-tests && cp /tests/test.sh .rlsandbox-harbor-tests/test.sh && "
            "printf 'def test_x():\\n    pass\\n' > .rlsandbox-harbor-tests/test_extra.py"
        )
        assert (await s.exec(hack)).exit_code == 0
        result = await s.grade()
    assert result.status == "ok" and result.reward == pytest.approx(1 / 3), result.message
    assert any(".rlsandbox-harbor-tests" in t for t in result.tampering), result.tampering


async def test_code_under_test_that_spoils_the_reward_file_scores_zero_not_a_masked_episode(
    node: NodeDaemon, harbor_task: dict[str, object]
) -> None:
    """A failing policy would rather be masked than penalised: its greet.py, imported by the
    verifier (as root), plants a .pth file that the verifier's next Python (the one that writes
    the reward) runs as it starts, turning the reward file into garbage, a FIFO (a read would
    block) or a symlink. Each of those scores 0.0 with status ok, never an invalid task."""
    spoil = {
        "garbage": "open(f, 'w').write('not-a-number')",
        "fifo": "os.mkfifo(f)",
        "symlink": "os.symlink('/etc/hostname', f)",
    }
    async with AsyncClient(node.address, timeout=120) as client:
        for how, command in spoil.items():
            line = f"import os; f = '/logs/verifier/reward.txt'; os.path.lexists(f) and (os.unlink(f), {command})\n"
            code = (
                "import os, site\n"
                "folder = next(d for d in site.getsitepackages() if os.path.isdir(d))\n"
                f"open(os.path.join(folder, 'zz-spoil.pth'), 'w').write({line!r})\n"
                "def greet(name):\n    return 'Hello ' + name\n"
            )
            async with client.session(task=harbor_task) as s:
                await s.write_files({"greet.py": code})
                result = await s.grade()
            assert result.status == "ok" and result.reward == 0.0, (how, result.status, result.message)
            assert "reward 0" in result.message, (how, result.message)


UNFIXED = "def greet(name):\n    return 'Hello ' + name\n"  # the verifier's partial credit: 1/3


@pytest.mark.parametrize("how", ["shadow-the-reader", "write-after-the-verifier"])
async def test_code_under_test_cannot_give_itself_the_reward_once_the_verifier_has_written_it(
    node: NodeDaemon, harbor_task: dict[str, object], how: str
) -> None:
    """The verifier imports the agent's greet.py as root. That code may not decide the reward after
    the verifier wrote it: a module planted where an interpreter started in the workspace finds it
    first (``json.py``, which a reward command run there would have imported: 1.0 before), and a
    process left to write 1.0 once the verifier is done (2 s later), both leave the verifier's
    1/3. The reward file is read by the daemon, once every process the tests started has ended;
    the grade's message names them."""
    planted = {
        "shadow-the-reader": (
            "open('/app/json.py', 'w').write('print(1.0, flush=True)\\nimport os\\nos._exit(0)\\n')\n"
            "open('/app/math.py', 'w').write('print(1.0, flush=True)\\nimport os\\nos._exit(0)\\n')\n"
        ),
        "write-after-the-verifier": (
            "import subprocess\n"
            "f = '/logs/verifier/reward.txt'\n"
            "late = f'while [ ! -s {f} ]; do sleep 0.01; done; sleep 2; echo 1.0 > {f}; echo 1.0 > {f}.late'\n"
            "subprocess.Popen(['setsid', 'sh', '-c', late], start_new_session=True)\n"
        ),
    }[how]
    async with AsyncClient(node.address, timeout=120) as client, client.session(task=harbor_task) as s:
        await s.write_files({"greet.py": planted + UNFIXED})
        result = await s.grade()
    assert result.status == "ok" and result.reward == pytest.approx(1 / 3), (result.reward, result.message)
    if how == "write-after-the-verifier":
        assert "still ran as the test command ended" in result.message and "sleep 2" in result.message, result.message


def harbor_environment(node: NodeDaemon, mode: str = "no-network", **kwargs: object) -> object:
    """The adapter as harbor's trial constructs it (by import path, with harbor's own arguments).
    harbor needs Python >= 3.12, so here it runs on the adapter's stand-in base."""
    from types import SimpleNamespace

    from rlsandbox.integrations.harbor import RlsandboxEnvironment

    return RlsandboxEnvironment(
        environment_dir=FIXTURES / "fix-greeting" / "environment",
        environment_name="fix-greeting",
        session_id="fix-greeting__t1__env",
        trial_paths=None,
        task_env_config=SimpleNamespace(docker_image=None, workdir=None),
        network_policy=SimpleNamespace(network_mode=SimpleNamespace(value=mode)),
        persistent_env={"FROM_TRIAL": "yes"},
        target=node.address,
        **kwargs,
    )


async def test_harbor_environment_runs_a_trial_on_the_image_the_importer_built(
    node: NodeDaemon, harbor_task: dict[str, object], tmp_path: Path
) -> None:
    """A harbor trial's calls, in its order: start, the agent's commands, the oracle's upload and
    run, harbor's own verifier (tests uploaded, test.sh run, /logs/verifier downloaded), stop."""
    from rlsandbox.integrations.harbor import RlsandboxEnvironment

    env = harbor_environment(node)
    assert isinstance(env, RlsandboxEnvironment) and RlsandboxEnvironment.type() == "rlsandbox"
    assert env._task_image() == harbor_task["image"]  # the tag import-harbor --build gave it
    await env.start(force_build=False)
    try:
        assert env.session.info.image == harbor_task["image"]
        pwd = await env.exec("pwd; echo $FROM_TRIAL $EXTRA", env={"EXTRA": "x"})
        assert (pwd.return_code, pwd.stdout, pwd.stderr) == (0, "/app\nyes x\n", "")
        failed = await env.exec("echo oops >&2; exit 4", cwd="/tmp")
        assert (failed.return_code, failed.stderr) == (4, "oops\n")
        assert (await env.exec("sleep 5", timeout_sec=1)).return_code == 124
        assert (await env.exec("id -un", user="nobody")).stdout == "nobody\n"
        env.default_user = "nobody"  # what harbor sets for a task's agent user
        assert (await env.exec("id -un")).stdout == "nobody\n"
        assert (await env.exec("id -un", user="root")).stdout == "root\n"
        env.default_user = None
        await env.upload_file(FIXTURES / "fix-greeting" / "solution" / "solve.sh", "/solution/solve.sh")
        assert (await env.exec("bash /solution/solve.sh")).return_code == 0
        await env.upload_dir(FIXTURES / "fix-greeting" / "tests", "/tests")
        # As harbor's verifier runs it: with [verifier] env from task.toml.
        verify = await env.exec("mkdir -p /logs/verifier && bash /tests/test.sh", env={"GREETING_LANG": "en"}, timeout_sec=120)
        assert verify.return_code == 0, verify.stdout
        await env.download_dir("/logs/verifier", tmp_path / "verifier")
        assert (tmp_path / "verifier" / "reward.txt").read_text().strip() == "1.0"
        await env.download_file("/app/greet.py", tmp_path / "out" / "greet.py")
        assert "Hello, {name" in (tmp_path / "out" / "greet.py").read_text()
        with pytest.raises(FileNotFoundError):
            await env.download_file("/no/such/file", tmp_path / "missing")
        sid = env.session.id
    finally:
        await env.stop(delete=True)
    assert sid not in node.sessions.sessions
    with pytest.raises(RuntimeError, match="not started"):
        await env.exec("true")


async def test_harbor_environment_refuses_network_it_cannot_give_and_grades_a_task_in_a_clean_room(
    node: NodeDaemon, harbor_task: dict[str, object]
) -> None:
    with pytest.raises(ValueError, match=r"no network.*'public'"):
        harbor_environment(node, mode="public")
    env = harbor_environment(node, mode="public", public_network_as_none=True, task=harbor_task)
    await env.start(force_build=False)  # type: ignore[attr-defined]
    try:
        # What harbor's in-environment verifier would trust, planted by an agent that fixed nothing.
        planted = "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && cat /logs/verifier/reward.txt"
        assert (await env.exec(planted)).stdout == "1\n"  # type: ignore[attr-defined]
        grade = await env.grade()  # type: ignore[attr-defined]
    finally:
        await env.stop(delete=True)  # type: ignore[attr-defined]
    # The clean room ran the task's own tests on the agent's workspace: one check of three passes.
    assert grade.status == "ok" and grade.reward == pytest.approx(1 / 3), grade.message
    assert not node.sessions.sessions


# -- inside harbor itself ---------------------------------------------------------------------------
HARBOR_VERSION = "0.26.0"  # the release the adapter follows
REPO = FIXTURES.parent.parent.parent
RUNNER = FIXTURES.parent / "harbor_runner"  # images.toml of the Python 3.13 image harbor runs on


def _harbor_site() -> Path:
    """harbor and the client's own dependencies as cp313 wheels, installed once into a folder the
    runner mounts (kept between runs, keyed by what is installed)."""
    client = tomllib.loads((REPO / "client" / "pyproject.toml").read_text())["project"]
    wanted = [*client["dependencies"], f"harbor=={HARBOR_VERSION}"]
    key = hashlib.sha256("\n".join(wanted).encode()).hexdigest()[:12]
    site = Path(tempfile.gettempdir()) / f"rlsandbox-test-harbor-cp313-{key}"
    if (site / ".complete").is_file():
        return site
    partial = Path(tempfile.mkdtemp(prefix=site.name + ".", dir=site.parent))
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--target", str(partial)]
    pip += ["--python-version", "3.13", "--implementation", "cp", "--only-binary=:all:"]
    for tag in ("manylinux2014", "manylinux_2_17", "manylinux_2_28"):
        pip += ["--platform", f"{tag}_{platform.machine()}"]
    done = subprocess.run([*pip, *wanted], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        pytest.fail(f"pip could not install harbor {HARBOR_VERSION}'s cp313 wheels (it needs PyPI):\n{done.stderr[-3000:]}")
    (partial / ".complete").touch()
    try:
        partial.rename(site)
    except OSError:  # another run made it meanwhile
        shutil.rmtree(partial, ignore_errors=True)
    return site


@pytest.fixture(scope="module")
async def harbor_runner(docker_runtime: DockerRuntime) -> tuple[str, Path]:
    """(the image harbor runs on, the folder of harbor's packages)."""
    [built] = await ImageBuilder(docker_runtime, RUNNER).build(["harbor-runner"])
    return built.tag, await asyncio.to_thread(_harbor_site)


async def harbor_trial(
    runner: tuple[str, Path],
    node: NodeDaemon,
    out: Path,
    agent: str,
    *,
    tasks: Path | None = None,
    verifier: str = "",
    task_dir: Path | None = None,
    job: int = 0,
) -> dict[str, object]:
    """`harbor trials start` of the fixture task with ``agent`` on the rlsandbox environment (by
    import path, on the host's network to reach the daemon); harbor's result.json. With ``job``:
    `harbor jobs start` of that many trials at once; ``{"trials": [each trial's result.json]}``."""
    image, site = runner
    out.mkdir(parents=True)
    name = f"rlsandbox-test-harbor-{uuid.uuid4().hex[:8]}"
    argv = ["docker", "run", "--rm", "--name", name, "--label", "rlsandbox.test=harbor-runner", "--network", "host"]
    argv += ["-v", f"{site}:/harbor-site:ro", "-v", f"{REPO / 'client' / 'src'}:/client:ro"]
    argv += ["-v", f"{FIXTURES.parent}:/fixtures:ro", "-v", f"{out}:{out}", "-e", "HOME=/tmp"]
    argv += ["-e", "PYTHONPATH=/harbor-site:/client:/fixtures/harbor_agents", "-e", "PYTHONDONTWRITEBYTECODE=1"]
    if tasks is not None:
        argv += ["-v", f"{tasks}:{tasks}:ro"]
    if task_dir is not None:
        argv += ["-v", f"{task_dir}:{task_dir}:ro"]
    task = str(task_dir) if task_dir is not None else "/fixtures/harbor/fix-greeting"
    argv += [image, "python3", "-m", "harbor.cli.main"]
    if job:
        argv += ["jobs", "start", "-p", task, "-k", str(job), "-n", str(job), "-o", str(out)]
    else:
        argv += ["trials", "start", "-p", task, "--trials-dir", str(out)]
    argv += ["--agent", agent, "--env", "rlsandbox.integrations.harbor:RlsandboxEnvironment"]
    argv += ["--environment-kwarg", f"target={node.address}", "--environment-kwarg", "public_network_as_none=true"]
    if tasks is not None:
        argv += ["--environment-kwarg", f"tasks={tasks}"]
    if verifier:
        argv += ["--verifier", verifier]
    try:
        done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=300)
    finally:
        await asyncio.to_thread(subprocess.run, ["docker", "rm", "-f", name], capture_output=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    if job:
        return {"trials": [json.loads(r.read_text()) for r in out.glob("*/*/result.json")]}
    [result] = out.glob("*/result.json")
    return dict(json.loads(result.read_text()))


def reward(result: dict[str, object]) -> object:
    assert result["exception_info"] is None, result["exception_info"]
    return result["verifier_result"]["rewards"]["reward"]  # type: ignore[index]


RLSANDBOX_VERIFIER = "rlsandbox.integrations.harbor:RlsandboxVerifier"


async def test_harbor_runs_trials_on_the_adapter_with_its_own_verifier(
    node: NodeDaemon, harbor_tasks_file: Path, harbor_runner: tuple[str, Path], tmp_path: Path
) -> None:
    """harbor's trial, start to stop, on the real BaseEnvironment: its log folders, the oracle's
    upload and run, its verifier's tests upload, run and /logs/verifier download."""
    oracle = await harbor_trial(harbor_runner, node, tmp_path / "oracle", "oracle")
    assert reward(oracle) == 1.0
    nothing = await harbor_trial(harbor_runner, node, tmp_path / "nop", "nop")
    assert reward(nothing) == pytest.approx(1 / 3)  # the verifier's partial credit, untouched
    assert not node.sessions.sessions  # every trial's session closed at its stop


async def test_the_rlsandbox_verifier_gives_harbor_a_reward_the_agent_cannot_reach(
    node: NodeDaemon, harbor_tasks_file: Path, harbor_runner: tuple[str, Path], tmp_path: Path
) -> None:
    """An agent that fixes nothing and swaps the interpreter the verifier script computes its
    reward with: harbor's own verifier (in the agent's environment) pays 1.0; the rlsandbox
    verifier (the task's tests in a clean room) pays what the work is worth."""
    swap = "rlsandbox_test_agents:InterpreterSwapAgent"
    hacked = await harbor_trial(harbor_runner, node, tmp_path / "own", swap, tasks=harbor_tasks_file)
    assert reward(hacked) == 1.0  # the hole this verifier closes
    graded = await harbor_trial(
        harbor_runner, node, tmp_path / "ours", swap, tasks=harbor_tasks_file, verifier=RLSANDBOX_VERIFIER
    )
    assert reward(graded) == pytest.approx(1 / 3)
    [grade] = (tmp_path / "ours").glob("*/verifier/grade.json")
    doc = json.loads(grade.read_text())
    assert doc["status"] == "ok" and doc["counts"]["passed"] == 1 and doc["session_id"]
    oracle = await harbor_trial(
        harbor_runner, node, tmp_path / "oracle", "oracle", tasks=harbor_tasks_file, verifier=RLSANDBOX_VERIFIER
    )
    assert reward(oracle) == 1.0
    # Without the task the verifier cannot grade: harbor records the error, no reward.
    lost = await harbor_trial(harbor_runner, node, tmp_path / "no-task", "nop", verifier=RLSANDBOX_VERIFIER)
    assert lost["verifier_result"] is None
    assert "no task to grade by" in str(lost["exception_info"])
    # A task whose verifier runs in a separate environment: harbor would hand the verifier a fresh
    # sandbox, whose grade would be the untouched task's; refused, no reward.
    separate = tmp_path / "separate" / "fix-greeting"
    shutil.copytree(FIXTURES / "fix-greeting", separate)
    toml = (separate / "task.toml").read_text().replace("[verifier]\n", '[verifier]\nenvironment_mode = "separate"\n')
    (separate / "task.toml").write_text(toml)
    refused = await harbor_trial(
        harbor_runner,
        node,
        tmp_path / "separate-out",
        "oracle",
        tasks=harbor_tasks_file,
        verifier=RLSANDBOX_VERIFIER,
        task_dir=separate,
    )
    assert refused["verifier_result"] is None
    assert "environment_mode = 'shared'" in str(refused["exception_info"])
    # A multi-step task: each step has tests of its own, which the clean room does not run.
    steps = tmp_path / "steps" / "fix-greeting"
    shutil.copytree(FIXTURES / "fix-greeting", steps)
    for part in ("tests", "solution"):
        shutil.copytree(steps / part, steps / "steps" / "one" / part)
    shutil.copy(steps / "instruction.md", steps / "steps" / "one" / "instruction.md")
    (steps / "task.toml").write_text((steps / "task.toml").read_text() + '\n[[steps]]\nname = "one"\n')
    stepped = await harbor_trial(
        harbor_runner,
        node,
        tmp_path / "steps-out",
        "oracle",
        tasks=harbor_tasks_file,
        verifier=RLSANDBOX_VERIFIER,
        task_dir=steps,
    )
    [step] = stepped["step_results"]  # type: ignore[misc]
    assert step["verifier_result"] is None and "multi-step" in str(step["exception_info"])
    assert not node.sessions.sessions


async def test_a_harbor_job_as_wide_as_the_pool_grades_every_trial(
    node: NodeDaemon, harbor_tasks_file: Path, harbor_runner: tuple[str, Path], tmp_path: Path
) -> None:
    """8 trials at once on a pool of at most 8: every sandbox is a trial's session when they grade,
    and each grade needs a clean room of the same pool. Without the pool's room headroom every
    grade waited 30 s for a room and ended an infra error (found running this job by hand)."""
    job = await harbor_trial(
        harbor_runner, node, tmp_path / "job", "oracle", tasks=harbor_tasks_file, verifier=RLSANDBOX_VERIFIER, job=8
    )
    trials = job["trials"]
    assert isinstance(trials, list) and len(trials) == 8
    assert [reward(t) for t in trials] == [1.0] * 8
    assert not node.sessions.sessions
