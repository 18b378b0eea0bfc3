"""Warm pytest: a recycling pool's clean room forks the test runner from a warm interpreter that
imported it once (agent/sandbox_agent.py, "warm Python"). The runs it forks must be the runs a cold
`python3 -m pytest` would have been (same user, path, arguments, environment, results), and the
warm interpreter must stay out of every episode's reach."""

from __future__ import annotations

import io
import json
import re
import tarfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers import build_image, daemon_config, running_daemon
from rlsandbox.client import AsyncClient, AsyncSession
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.grading.task import Task, load_tasks
from rlsandbox.daemon.runtime.docker import DockerRuntime
from rlsandbox.daemon.server import NodeDaemon

pytestmark = pytest.mark.docker

CALC = Path(__file__).resolve().parent.parent / "fixtures" / "tasks" / "py-calc"
FIX = "def add(a, b):\n    return a + b\n\n\ndef multiply(a, b):\n    return a * b\n"
# A hidden test that says who ran it: the process that started pytest, the user, what it imports from.
WHERE = (
    "import gc, json, os, sys\n"
    "def test_where():\n"
    "    parent = open('/proc/%d/cmdline' % os.getppid(), 'rb').read().replace(b'\\0', b' ').decode()\n"
    "    facts = {'parent': parent, 'uid': os.getuid(), 'gid': os.getgid(), 'groups': os.getgroups(),\n"
    "             'path': sys.path, 'argv': sys.argv[1:], 'env': sorted(os.environ), 'cwd': os.getcwd(),\n"
    "             'executable': sys.executable, 'flags': list(sys.flags), 'main': sys.modules['__main__'].__file__,\n"
    "             'proc': os.stat('/proc/self/fd').st_uid, 'bytecode': sys.dont_write_bytecode,\n"
    "             'probe': getattr(__import__('builtins'), 'RLSB_PROBE', None), 'frozen': gc.get_freeze_count()}\n"
    "    print('WHERE' + json.dumps(facts) + 'WHERE')\n"
)
WARM_PROCESS = r"""
import os
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            cmd = open("/proc/%s/cmdline" % pid, "rb").read().split(b"\0")
        except OSError:
            continue
        if b"--warm" in cmd:
            print(pid)
"""


# An image whose site-packages reaches into the workspace at every interpreter start, as editable
# installs do (a path line), with an import line for a module the image does not have: whatever an
# episode names so in the workspace runs in every Python process that starts while it is there.
PTH_IMAGE = (
    "FROM rlsandbox/python-task:latest\n"
    "RUN echo '/workspace' > /usr/lib/python3/dist-packages/zz-workspace.pth"
    " && echo 'import rlsb_probe' >> /usr/lib/python3/dist-packages/zz-workspace.pth\n"
)
# The episode's module for it: it records the user of every interpreter that imported it.
PROBE = "import builtins, os\nbuiltins.RLSB_PROBE = os.getuid()\n"


@pytest.fixture(scope="module")
async def pth_image(images: dict[str, str], docker_runtime: DockerRuntime) -> AsyncIterator[str]:
    tag = f"rls-test/warm-pth:{uuid.uuid4().hex[:8]}"
    await build_image(docker_runtime, tag, PTH_IMAGE)
    try:
        yield tag
    finally:
        await docker_runtime.images.remove(tag)


@pytest.fixture(scope="module")
async def node(images: dict[str, str], pth_image: str) -> AsyncIterator[NodeDaemon]:
    recycling = {"min_ready": 2, "max_total": 2, "read_only_root": True, "recycle": True, "max_reuses": 100}
    pools = [
        PoolConfig(name="python", image="rlsandbox/python-task:latest", **recycling),
        PoolConfig(name="pth", image=pth_image, **recycling),
    ]
    async with running_daemon(daemon_config(pools=pools)) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def task() -> Task:
    calc = load_tasks(CALC / "task.yaml")[0]
    ev = calc.spec.evaluation
    hidden = {**ev.hidden_tests, "tests/test_where.py": WHERE}
    spec = calc.spec.model_copy(update={"evaluation": ev.model_copy(update={"hidden_tests": hidden})})
    return Task(spec, calc.workspace_tar)


def _where(log: bytes) -> dict[str, object]:
    found = re.search(r"WHERE(\{.*?\})WHERE", log.decode(errors="replace"))
    assert found, log.decode(errors="replace")[-3000:]
    facts: dict[str, object] = json.loads(found[1])
    return facts


async def _graded(
    client: AsyncClient, task: Task, fixed: bool, extra: dict[str, str] | None = None, refused: str = ""
) -> tuple[float | None, dict[str, object]]:
    """The reward and where the tests ran; no tampering but ``refused`` (a finding expected)."""
    async with client.session(task=task, acquire_timeout=60) as s:
        if fixed:
            await s.write_files({"calc/__init__.py": FIX})
        if extra:
            await s.write_files(extra)
        r = await s.grade()
    found = [t for t in r.tampering if not (refused and refused in t)]
    assert r.status == "ok" and not found, (r.message, r.tampering, r.log.decode()[-2000:])
    assert not refused or len(found) < len(r.tampering), (refused, r.tampering)
    facts = _where(r.log)
    facts["failures"] = _failures(r.log)
    return r.reward, facts


def _failures(log: bytes) -> str:
    """The run's failure reports (tracebacks with their source lines), as pytest printed them."""
    text = log.decode(errors="replace")
    start = text.find("= FAILURES =")
    if start < 0:
        return ""
    ends = [i for i in (text.find(" PASSES ", start), text.find(" short test summary info ", start)) if i > 0]
    return text[start : min(ends, default=len(text))]


def _same_run(facts: dict[str, object]) -> dict[str, object]:
    """What a run must have whatever started it (the report folder's name is random per grade)."""
    out = dict(facts)
    out.pop("parent")
    out.pop("frozen")
    out.pop("failures")
    out["path"] = [re.sub(r"\.rlsandbox-grade-[0-9a-f]+", "REPORT", p) for p in facts["path"]]  # type: ignore[attr-defined]
    return out


async def test_a_recycling_room_forks_pytest_from_its_warm_interpreter_as_a_cold_run_would_be(
    node: NodeDaemon, task: Task
) -> None:
    async with AsyncClient(node.address, timeout=120) as client:
        runs = [await _graded(client, task, fixed=i % 2 == 0) for i in range(8)]
    rewards = [reward for reward, _ in runs]
    assert rewards == [1.0, 0.0] * 4  # the fix passes and the bug fails, warm or not
    warm = [facts for _, facts in runs if "--warm pytest" in str(facts["parent"])]
    cold = [facts for _, facts in runs if "--warm" not in str(facts["parent"])]
    # Each of the two sandboxes runs its first grade the usual way while its warm interpreter starts.
    assert warm and cold, [facts["parent"] for _, facts in runs]
    for facts in warm + cold:
        assert facts["uid"] == facts["gid"] != 0 and facts["groups"] == [], facts  # the episode's user
        # The pytest guard makes the test process not dumpable (out of its children's reach), so its
        # /proc/self belongs to root, in a warm run as in a cold one.
        assert facts["proc"] == 0, facts
    # The warm interpreter's objects are frozen for the cycle collector (no copy-on-write walk).
    assert all(int(f["frozen"]) > 0 for f in warm) and all(f["frozen"] == 0 for f in cold), runs  # type: ignore[call-overload]
    # Same user, path, arguments, environment, working folder as the cold run.
    for f in warm:
        assert _same_run(f) == _same_run(cold[0]), json.dumps([_same_run(f), _same_run(cold[0])], indent=1)
    # A failing run reports its failures as a cold one does: each traceback with its source lines
    # (the warm interpreter hands its runs inspect's cache of loaded modules, filled once).
    reports = {reward: {f["failures"] for r, f in runs if r == reward and f in warm} for reward in (0.0, 1.0)}
    cold_reports = {reward: {f["failures"] for r, f in runs if r == reward and f in cold} for reward in (0.0, 1.0)}
    assert reports[1.0] == {""} and len(reports[0.0]) == 1, reports
    assert "def test_multiply" in next(iter(reports[0.0])) and "\nE   " in next(iter(reports[0.0])), reports
    assert not cold_reports[0.0] or cold_reports[0.0] == reports[0.0], (cold_reports, reports)


async def test_the_warm_interpreter_is_out_of_the_episodes_reach(node: NodeDaemon, task: Task) -> None:
    """An episode in a sandbox whose warm interpreter is alive can neither kill, trace nor read it,
    finds nothing else left behind, and the grades after it are still right."""
    async with AsyncClient(node.address, timeout=120) as client:
        for _ in range(6):
            await _graded(client, task, fixed=True)
        attacked = 0
        # A warm interpreter starts at the end of a clean room's reset, when its imports finish
        # within a few seconds (on a loaded machine a reset may give up on one: try again). Sessions
        # prefer sandboxes without one, so a session meets one only where no other is ready: while
        # a graded session holds the pool's other sandbox (max_total 2), the next session gets the
        # room that session's grade just used. (Left to timing, CI once met none in 24 sessions.)
        for _ in range(12):
            if attacked >= 3:
                break
            async with client.session(task=task, acquire_timeout=60) as holder:
                await holder.write_files({"calc/__init__.py": FIX})
                assert (await holder.grade()).reward == 1.0
                async with client.session("python", acquire_timeout=60) as s:
                    pids = (await s.exec(["python3", "-c", WARM_PROCESS])).stdout.split()
                    if not pids:
                        continue
                    attacked += 1
                    await _attack(s, pids[0].decode())
        assert attacked, "no episode met a warm interpreter"
        for i in range(4):
            reward, _ = await _graded(client, task, fixed=i % 2 == 0)
            assert reward == (1.0 if i % 2 == 0 else 0.0)


async def _attack(s: AsyncSession, pid: str) -> None:
    owner = (await s.exec(f"stat -c %u /proc/{pid}")).stdout.strip()
    assert owner == b"0"
    for attempt in (
        f"kill -9 {pid}",
        f"kill -STOP {pid}",
        f"cat /proc/{pid}/environ",
        f"head -c 1 /proc/{pid}/mem",
        f"ls /proc/{pid}/fd",
        "python3 -c 'import ctypes,sys; l=ctypes.CDLL(None,use_errno=True); "
        f"sys.exit(0 if l.ptrace(16, {pid}, 0, 0) == 0 else 1)'",  # PTRACE_ATTACH
    ):
        r = await s.exec(attempt)
        assert r.exit_code != 0, (attempt, r)
    state = (await s.exec(f"cat /proc/{pid}/stat")).stdout.split()[2]
    assert state in (b"S", b"R"), state  # still alive, not stopped


async def test_no_file_of_an_episode_ever_runs_in_the_warm_interpreter(node: NodeDaemon, task: Task) -> None:
    """In an image whose .pth imports a module from the workspace at every start, an episode's
    module of that name would run in every test process before the runner and its guard: a name
    the image's interpreter imports as it starts is reserved (issue 44), so the clean room refuses
    the episode's file (reported; with the task's "report" policy the fix still pays), and it runs
    neither in a fresh interpreter nor in the warm one, which is root and outlives episodes. (The
    warm interpreter starts at a reset, when no episode's file exists anywhere.)"""
    ev = task.spec.evaluation.model_copy(update={"tampering_policy": "report"})
    pth_task = Task(task.spec.model_copy(update={"pool": "pth", "evaluation": ev}), task.workspace_tar)
    refused = "rlsb_probe.py: added (shadows the module 'rlsb_probe'"
    async with AsyncClient(node.address, timeout=120) as client:
        runs = [await _graded(client, pth_task, fixed=True, extra={"rlsb_probe.py": PROBE}, refused=refused) for _ in range(6)]
    assert [reward for reward, _ in runs] == [1.0] * 6
    warm = [facts for _, facts in runs if "--warm pytest" in str(facts["parent"])]
    assert warm, [facts["parent"] for _, facts in runs]
    assert {facts["probe"] for _, facts in runs} == {None}, [facts["probe"] for _, facts in runs]  # it never ran


# A hidden test that says where it runs, leaves a process in a session of its own, and hangs when
# the episode left a HANG file.
LEAVE = (
    "import os, subprocess, sys, time\n"
    "def test_leave():\n"
    "    parent = open('/proc/%d/cmdline' % os.getppid(), 'rb').read().replace(b'\\0', b' ').decode()\n"
    "    print('PARENT ' + parent, flush=True)\n"
    "    subprocess.Popen(['sleep', '1000'], start_new_session=True)\n"
    "    if os.path.exists('HANG'):\n"
    "        time.sleep(1000)\n"
)
LEFT = r"""
import os
me = {1, os.getpid(), os.getppid()}
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) not in me:
        cmd = open("/proc/%s/cmdline" % pid, "rb").read().replace(b"\0", b" ").decode()
        if "--warm pytest" not in cmd:
            print(pid, cmd)
"""


async def test_a_warm_run_that_hangs_or_leaves_processes_ends_as_a_cold_one(node: NodeDaemon, task: Task) -> None:
    """A warm run past its timeout is killed and graded `timeout`; what it left running, in a session
    of its own, is ended by the reset like anything of the episode's user; the next episodes in
    those sandboxes find nothing but the agent and the warm interpreter."""
    ev = task.spec.evaluation
    spec = task.spec.model_copy(
        update={
            "evaluation": ev.model_copy(
                update={
                    "hidden_tests": {**ev.hidden_tests, "tests/test_zz_leave.py": LEAVE},
                    "test_command": "python3 -m pytest -rA -s -p no:cacheprovider tests",
                    "timeout": 5,
                }
            )
        }
    )
    leaving = Task(spec, task.workspace_tar)
    async with AsyncClient(node.address, timeout=120) as client:
        parents = []
        for i in range(6):
            hang = i >= 4  # after both sandboxes have their warm interpreter
            async with client.session(task=leaving, acquire_timeout=60) as s:
                await s.write_files({"calc/__init__.py": FIX, **({"HANG": ""} if hang else {})})
                r = await s.grade()
            log = r.log.decode(errors="replace")
            assert r.status == ("timeout" if hang else "ok"), (r.status, r.message, log[-1500:])
            # The listed tests all finished before the hang: the reward counts what finished.
            assert r.reward == 1.0, (r.reward, r.message)
            parents += re.findall(r"PARENT (.*)", log)
        assert any("--warm pytest" in p for p in parents[-2:]), parents  # the hanging runs were warm
        async with client.session("python", acquire_timeout=60) as a, client.session("python", acquire_timeout=60) as b:
            for s in (a, b):
                left = await s.exec(["python3", "-c", LEFT])
                assert left.ok and left.stdout == b"", left


# A project module named like one the warm interpreter has loaded (pytest imports `iniconfig`).
PROJECT_INICONFIG = (
    "class IniConfig:\n    pass\n\n\nclass SectionWrapper:\n    pass\n\n\nclass ParseError(Exception):\n    pass\n"
)
WHICH_INICONFIG = (
    "import os, sys\n"
    "def test_which():\n"
    "    parent = open('/proc/%d/cmdline' % os.getppid(), 'rb').read().replace(b'\\0', b' ').decode()\n"
    "    print('WHICH %s FROM %s' % (sys.modules['iniconfig'].__file__, parent))\n"
)


async def test_a_project_module_named_like_a_warm_one_makes_the_run_cold(node: NodeDaemon, task: Task) -> None:
    """Where the workspace holds a module the warm interpreter already loaded, a fresh interpreter
    would import the workspace's: such a run is started fresh, and it does."""
    with tarfile.open(fileobj=io.BytesIO(task.workspace_tar)) as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]  # type: ignore[union-attr]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for member, data in members:
            tar.addfile(member, io.BytesIO(data) if data is not None else None)
        info = tarfile.TarInfo("iniconfig.py")
        info.size = len(PROJECT_INICONFIG)
        tar.addfile(info, io.BytesIO(PROJECT_INICONFIG.encode()))
    ev = task.spec.evaluation
    hidden = {**ev.hidden_tests, "tests/test_which.py": WHICH_INICONFIG}
    spec = task.spec.model_copy(update={"evaluation": ev.model_copy(update={"hidden_tests": hidden})})
    project = Task(spec, out.getvalue())
    async with AsyncClient(node.address, timeout=120) as client:
        for _ in range(4):  # one warm grade first, so both sandboxes have their warm interpreter
            await _graded(client, task, fixed=True)
        seen = []
        for _ in range(4):
            async with client.session(task=project, acquire_timeout=60) as s:
                await s.write_files({"calc/__init__.py": FIX})
                r = await s.grade()
            assert r.status == "ok" and r.reward == 1.0, (r.message, r.log.decode()[-1500:])
            seen += re.findall(r"WHICH (\S+) FROM (.*)", r.log.decode(errors="replace"))
    assert len(seen) == 4, seen
    for where, parent in seen:
        assert where == "/workspace/iniconfig.py" and "--warm" not in parent, (where, parent)
