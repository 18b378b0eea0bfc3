"""The framework adapters against the real frameworks from PyPI and a real daemon: Gymnasium
(``gymnasium.make`` and its own environment checker) and mini-swe-agent (its own ``DefaultAgent``
loop, driven by its own scripted ``DeterministicModel`` in place of an LLM), verifiers (its own
rollout loop and OpenAI client against a scripted model server), verl, SkyRL-gym. Each episode is a
session from a real task, graded in a clean room; infra errors are surfaced the framework's way;
no session is left behind."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from helpers import daemon_config, running_daemon
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.grading.task import Task, load_tasks
from rlsandbox.daemon.server import NodeDaemon

pytestmark = pytest.mark.docker

TASKS = Path(__file__).resolve().parent.parent / "fixtures" / "tasks"
BUG = "def multiply(a, b):\n    return a + b\n"
FIX = "def multiply(a, b):\n    return a * b\n"


@pytest.fixture(scope="module")
async def node(images: dict[str, str]) -> AsyncIterator[NodeDaemon]:
    pools = [
        PoolConfig(name="python", image="rlsandbox/python-task:latest", min_ready=2, max_total=12),
        PoolConfig(name="small", image="rlsandbox/python-task:latest", min_ready=0, max_total=2, memory_mb=48),
    ]
    async with running_daemon(daemon_config(pools=pools)) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def task() -> Task:
    return {t.id: t for t in load_tasks(TASKS)}["py-calc"]


def no_sessions_left(node: NodeDaemon) -> None:
    assert not node.sessions.sessions, f"sessions left open: {list(node.sessions.sessions)}"


async def script_in_venv(
    tmp_path: Path, node: NodeDaemon, task: Task, extra: str, pin: str | list[str], script: str, env: dict[str, str]
) -> dict[str, Any]:
    """Run ``script`` in a fresh virtualenv with the client (``[extra]``) and the framework pinned
    from PyPI; its arguments: the node's address, the task's spec and workspace files. Its last
    line of output, as JSON."""
    root = Path(__file__).resolve().parents[2]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    pins = [pin] if isinstance(pin, str) else pin
    await asyncio.to_thread(subprocess.run, [*pip, f"{root / 'client'}[{extra}]", *pins], check=True, timeout=900)
    spec, tar = tmp_path / "spec.json", tmp_path / "ws.tar"
    spec.write_text(task.spec_json())
    tar.write_bytes(task.workspace_tar)
    proc = await asyncio.create_subprocess_exec(
        str(venv / "bin/python"), "-c", script, node.address, str(spec), str(tar),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={"PATH": "/usr/bin:/bin", **env},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 0, err.decode()[-3000:]
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    result["stderr"] = err.decode()[-3000:]
    return result


async def test_gymnasium_env_episodes_are_graded_sessions(node: NodeDaemon, task: Task) -> None:

    import gymnasium

    def play() -> list[tuple[float, bool, bool, dict[str, object]]]:
        import rlsandbox.integrations.gymnasium  # noqa: F401 - registers rlsandbox/Sandbox-v0

        env = gymnasium.make("rlsandbox/Sandbox-v0", target=node.address, tasks=[task], max_steps=4, labels={"run": "gym"})
        outcomes = []
        try:
            obs, info = env.reset(seed=0)
            assert "multiply" in obs and info["task_id"] == "py-calc" and info["workdir"] == "/workspace"
            obs, reward, terminated, truncated, info = env.step("grep -n 'a + b' calc/__init__.py")
            assert "return a + b" in obs and "[exit code 0]" in obs and reward == 0.0 and not terminated
            view = env.step(json.dumps({"tool": "view", "path": "calc/__init__.py", "start": 1, "end": 3}))[0]
            assert "     1\t" in view
            edited = env.step(json.dumps({"tool": "edit", "path": "calc/__init__.py", "old": BUG, "new": FIX}))[0]
            assert edited == "edited calc/__init__.py"
            obs, reward, terminated, truncated, info = env.step('{"tool": "submit"}')
            outcomes.append((reward, terminated, truncated, info))
            # A second episode that never submits: truncated at max_steps, graded all the same.
            env.reset(options={"task": 0})
            bad = env.step(json.dumps({"tool": "edit", "path": "calc/__init__.py", "old": "nope", "new": "x"}))[0]
            assert "occurs 0 times" in bad
            assert "unknown tool" in env.step('{"tool": "rm -rf"}')[0]
            env.step("true")
            obs, reward, terminated, truncated, info = env.step("true")
            outcomes.append((reward, terminated, truncated, info))
            # Gymnasium's own checker: spaces, reset and step with sampled actions.
            from gymnasium.utils.env_checker import check_env

            check_env(env.unwrapped, skip_render_check=True)
        finally:
            env.close()
        return outcomes

    solved, timed_out = await asyncio.to_thread(play)
    assert solved[0] == 1.0 and solved[1] is True and solved[2] is False and solved[3]["status"] == "ok"
    assert "infra_error" not in solved[3]
    assert timed_out[0] == 0.0 and timed_out[1] is False and timed_out[2] is True and timed_out[3]["status"] == "ok"
    no_sessions_left(node)


@pytest.mark.parametrize("noticed", [False, True], ids=["step-meets-the-death", "session-already-ended"])
async def test_gymnasium_masks_an_infra_error_instead_of_scoring_it(node: NodeDaemon, task: Task, noticed: bool) -> None:
    """The sandbox is killed from outside mid-episode (what a node failure looks like): the step
    says so in info["infra_error"] with no reward, and the episode ends; whether the step meets the
    death (ABORTED) or the node has already ended the session (NOT_FOUND: a CI run met this race)."""

    from rlsandbox.integrations.gymnasium import SandboxEnv

    env = SandboxEnv(node.address, tasks=[task])
    try:
        _, info = await asyncio.to_thread(env.reset, seed=1)
        sandbox = node.sessions.sessions[info["session_id"]].sandbox
        assert sandbox is not None
        await node.runtime.docker.containers.container(sandbox.container_id).kill()
        for _ in range(100 if noticed else 0):
            if info["session_id"] not in node.sessions.sessions:
                break
            await asyncio.sleep(0.1)
        _, reward, terminated, _, step_info = await asyncio.to_thread(env.step, "true")
    finally:
        await asyncio.to_thread(env.close)
    assert reward == 0.0 and terminated and "infra_error" in step_info, step_info
    no_sessions_left(node)


@pytest.mark.parametrize("noticed", [False, True], ids=["step-meets-the-death", "session-already-ended"])
async def test_gymnasium_scores_a_sandbox_its_episode_killed_instead_of_masking_it(
    node: NodeDaemon, task: Task, noticed: bool
) -> None:
    """The episode fills /dev/shm past its sandbox's memory (48 MB) and the kernel OOM-kills the
    sandbox whole: the episode's doing. The step ends the episode graded, reward 0 with the cause
    as its limit, and no infra_error (masking it would make dying pay better than failing)."""
    from rlsandbox.integrations.gymnasium import SandboxEnv

    small = Task(task.spec.model_copy(update={"pool": "small"}), task.workspace_tar)
    env = SandboxEnv(node.address, tasks=[small])
    fill = "head -c 60000000 /dev/zero > /dev/shm/fill"
    try:
        _, info = await asyncio.to_thread(env.reset, seed=1)
        if noticed:
            await asyncio.to_thread(env.step, f"(sleep 0.3; {fill}) > /dev/null 2>&1 &")
            for _ in range(100):
                if info["session_id"] not in node.sessions.sessions:
                    break
                await asyncio.sleep(0.1)
        _, reward, terminated, truncated, step_info = await asyncio.to_thread(env.step, "true" if noticed else fill)
    finally:
        await asyncio.to_thread(env.close)
    assert reward == 0.0 and terminated and not truncated and "infra_error" not in step_info, step_info
    assert step_info["status"] == "ok" and "out of memory" in step_info["grade"].limits[0], step_info
    no_sessions_left(node)


MINI_SCRIPT = r"""
import json, sys
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments import get_environment
from minisweagent.models.test_models import DeterministicModel, make_output

target, spec_path, tar_path = sys.argv[1:4]
task = [json.load(open(spec_path)), open(tar_path, "rb").read()]
# Selected by import path, as a mini-swe-agent config does.
env = get_environment({"environment_class": "rlsandbox.integrations.minisweagent.RlsandboxEnvironment",
                       "target": target, "task": task, "labels": {"run": "mini"}, "timeout": 30})
fix = "sed -i '/def multiply/,/return/ s/a + b/a * b/' calc/__init__.py"
model = DeterministicModel(outputs=[
    make_output("look", [{"command": "grep -n 'return' calc/__init__.py"}]),
    make_output("fix", [{"command": fix}, {"command": "python3 -c 'import calc; print(calc.multiply(6, 7))'"}]),
    make_output("done", [{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff --stat"}]),
])
agent = DefaultAgent(model, env, system_template="You fix bugs.", instance_template="{{task}}", step_limit=10)
try:
    exit_info = agent.run("Fix multiply() in calc.")
    observations = [m["content"] for m in agent.messages if m.get("role") == "user"][1:]
    grade = env.grade()
    print(json.dumps({"exit": exit_info.get("exit_status"), "observations": observations, "status": grade.status,
                      "reward": grade.reward, "session": env.session.id}))
finally:
    env.cleanup()
"""


@pytest.mark.slow
async def test_mini_swe_agent_runs_its_own_loop_in_a_session(node: NodeDaemon, task: Task, tmp_path: Path) -> None:
    """mini-swe-agent (from PyPI, in its own virtualenv with the client) runs its DefaultAgent loop,
    its scripted DeterministicModel in place of an LLM, in a session from the task: the commands run
    in the sandbox, the submission ends the loop, and the grade is the reward."""
    mswea = {"MSWEA_SILENT_STARTUP": "1", "MSWEA_GLOBAL_CONFIG_DIR": str(tmp_path / "mswea")}
    result = await script_in_venv(tmp_path, node, task, "mini-swe-agent", "mini-swe-agent==2.4.6", MINI_SCRIPT, mswea)
    assert result["exit"] == "Submitted"
    assert "return a + b" in result["observations"][0] and "<returncode>0</returncode>" in result["observations"][0]
    # One observation per action: the fix (sed, no output), then the fixed code run in the sandbox.
    assert "<output>\n42\n</output>" in result["observations"][2], result["observations"]
    assert result["status"] == "ok" and result["reward"] == 1.0
    no_sessions_left(node)


# The scripted model server of the verifiers tests: a policy's turns by the model name a rollout
# asks for. Each script sets RUN (the label prefix of its sessions) before it.
SCRIPTED_CHAT = r"""
import asyncio, json, os, sys
from aiohttp import web
from rlsandbox.client import AsyncClient

target, spec_path, tar_path = sys.argv[1:4]
task = (json.load(open(spec_path)), open(tar_path, "rb").read())
BUG = "def multiply(a, b):\n    return a + b"
FIX = "def multiply(a, b):\n    return a * b"
CHECK = "python3 -c 'import calc; print(calc.multiply(6, 7))'"
HOOK = "import pytest\n@pytest.hookimpl(tryfirst=True)\ndef pytest_runtest_makereport(item, call):\n    call.excinfo = None\n"
POLICIES = {
    "fixer": [[("bash", {"command": "grep -n 'return' calc/__init__.py"})],
              [("edit", {"path": "calc/__init__.py", "old": BUG, "new": FIX})],
              [("view", {"path": "calc/__init__.py", "start": 8}), ("bash", {"command": CHECK})]],
    # Games the visible tests: replaces them with one that passes, and a conftest that hides failures.
    "hacker": [[("bash", {"command": "rm -rf tests && mkdir tests && echo 'def test_ok(): pass' > tests/test_multiply.py"}),
                ("write", {"path": "conftest.py", "content": HOOK})]],
    "idler": [],
    "looper": [[("bash", {"command": "true"})]] * 50,  # never stops: max_turns ends it
    "breaker": [[("bash", {"command": "echo never"})]],  # its sandbox is lost before this runs
    # Fills /dev/shm past its sandbox's memory (48 MB): the kernel kills the sandbox, its own doing.
    "bomber": [[("bash", {"command": "head -c 60000000 /dev/zero > /dev/shm/fill"})]],
}
seen = {"tools": [], "hidden_args": 0}

async def chat(request):
    body = await request.json()
    model, messages = body["model"], body["messages"]
    seen["tools"].append(sorted(t["function"]["name"] for t in body.get("tools", [])))
    seen["hidden_args"] += sum("session_id" in json.dumps(t["function"]["parameters"]) for t in body.get("tools", []))
    turn = sum(m["role"] == "assistant" for m in messages)
    if model == "breaker" and turn == 0:  # the node loses the sandbox mid-rollout
        async with AsyncClient(target) as c:
            for s in await c.list_sessions(labels={"run": RUN + "breaker"}):
                await c.close_session(s.session_id)
    script = POLICIES[model]
    if turn < len(script):
        calls = [{"id": f"call-{turn}-{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                 for i, (n, a) in enumerate(script[turn])]
        message, finish = {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"
    else:
        message, finish = {"role": "assistant", "content": "done"}, "stop"
    return web.json_response({"id": "x", "object": "chat.completion", "created": 0, "model": model,
                              "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

async def serve():
    # The model server on a free port: (its runner, the port).
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    os.environ["SCRIPTED_KEY"] = "none"
    return runner, site._server.sockets[0].getsockname()[1]
"""

VERIFIERS_SCRIPT = (
    'RUN = "vf-"\n'
    + SCRIPTED_CHAT
    + r"""
import verifiers as vf
from verifiers.types import ClientConfig

async def main():
    runner, port = await serve()
    config = ClientConfig(api_base_url=f"http://127.0.0.1:{port}/v1", api_key_var="SCRIPTED_KEY", max_retries=0)
    report = {}
    for model, n in (("fixer", 2), ("hacker", 1), ("idler", 1), ("breaker", 1)):
        # Loaded by module name, as a verifiers or prime-rl config names an environment.
        env = vf.load_environment("rlsandbox.integrations.verifiers", target=target, tasks=[task],
                                  labels={"run": f"vf-{model}"}, max_turns=6)
        results = await env.evaluate(config, model, num_examples=1, rollouts_per_example=n,
                                     state_columns=["sandbox_id", "rlsandbox_grade"], on_progress=[])
        await env._teardown()
        report[model] = [{"reward": o["reward"], "error": (o.get("error") or {}).get("error_chain_str"),
                          "grade": o.get("rlsandbox_grade"), "session": o.get("sandbox_id"),
                          "tool_outputs": [m["content"] for m in o["completion"] if m["role"] == "tool"]}
                         for o in results["outputs"]]
    async with AsyncClient(target) as c:
        left = [s.session_id for s in await c.list_sessions() if s.labels.get("run", "").startswith("vf-")]
    await runner.cleanup()
    print(json.dumps({"report": report, "tools": seen["tools"][0], "hidden_args": seen["hidden_args"], "left": left}))

asyncio.run(main())
"""
)


@pytest.mark.slow
async def test_verifiers_environment_rollouts_are_graded_sessions(node: NodeDaemon, task: Task, tmp_path: Path) -> None:
    """verifiers 0.3.1 (from PyPI, in its own virtualenv with the client) loads the environment by
    module name and runs its own rollout loop and OpenAI client against a scripted model server:
    the tool calls run in one session per rollout (a group of 2: two sessions), the reward is the
    clean-room grade (a policy that rewrites the tests gains nothing), a lost sandbox is verifiers'
    SandboxError in the rollout's error chain (the sample to drop), and no session is left."""
    offline = {"HOME": str(tmp_path), "HF_DATASETS_OFFLINE": "1", "NO_PROXY": "127.0.0.1"}
    result = await script_in_venv(tmp_path, node, task, "verifiers", "verifiers==0.3.1", VERIFIERS_SCRIPT, offline)
    report = result["report"]
    assert result["tools"] == ["bash", "edit", "view", "write"] and result["hidden_args"] == 0  # the session id is injected
    fixer = report["fixer"]
    assert len({r["session"] for r in fixer}) == 2  # a group: one session per rollout
    for r in fixer:
        assert r["error"] is None and r["reward"] == 1.0 and r["grade"]["resolved"], r
        assert "return a + b" in r["tool_outputs"][0] and r["tool_outputs"][1] == "edited calc/__init__.py"
        assert (
            "return a * b" in r["tool_outputs"][2]
            and r["tool_outputs"][3].startswith("42\n")
            and "[exit code 0]" in r["tool_outputs"][3]
        )
    [idle], [hacker] = report["idler"], report["hacker"]
    assert idle["error"] is None and idle["grade"]["status"] == "ok" and idle["reward"] < 1.0
    assert hacker["error"] is None and hacker["reward"] == idle["reward"] and not hacker["grade"]["resolved"], hacker
    [broken] = report["breaker"]
    # verifiers' own chain for a stop error in a tool: the rollout ends errored, the sample to drop.
    assert broken["error"].startswith("ToolCallError -> SandboxError") and broken["grade"] is None, (broken, result["stderr"])
    assert result["left"] == []
    no_sessions_left(node)


VERIFIERS_V1_SCRIPT = (
    'RUN = "vf1-"\n'
    + SCRIPTED_CHAT
    + r"""
import verifiers.v1 as vf
from rlsandbox.integrations.verifiers_v1 import RlsandboxTask, agent_config, rlsandbox_runtime, rollout

def summary(trace):
    tools = [m.content for b in trace.branches for m in b.messages if m.role == "tool"] if trace.branches else []
    return {"reward": trace.reward, "ok": trace.ok, "stop": trace.stop_condition, "metrics": dict(trace.metrics),
            "rewards": {k: getattr(v, "value", v) for k, v in dict(trace.rewards).items()}, "turns": trace.num_turns,
            "errors": [f"{e.type}: {e.message}"[:300] for e in trace.errors], "tool_outputs": tools,
            "runtime": trace.agent.runtime.model_dump(mode="json") if trace.agent.runtime else None}

async def main():
    runner, port = await serve()
    report = {}
    async with AsyncClient(target) as client:
        for model, n in (("fixer", 2), ("hacker", 1), ("looper", 1), ("breaker", 1), ("bomber", 1)):
            endpoint = vf.EvalClientConfig(base_url=f"http://127.0.0.1:{port}/v1", api_key_var="SCRIPTED_KEY")
            # The harness by its id, as a TOML config names it: verifiers imports rlsandbox_verifiers.
            config = agent_config(model, endpoint, max_turns=6, harness={"id": "rlsandbox-verifiers", "command_timeout": 60})
            async with vf.Agent(config) as agent:
                vtask = RlsandboxTask.of(task if model != "bomber" else (dict(task[0], pool="small"), task[1]))
                traces = await asyncio.gather(*(rollout(agent, client, vtask, labels={"run": f"vf1-{model}"}) for _ in range(n)))
            report[model] = [summary(t) for t in traces]
        # The runtime contract through verifiers' own framework methods.
        async with rlsandbox_runtime(client, task, labels={"run": "vf1-runtime"}) as rt:
            contract = {"alive": await rt.alive(), "read": (await rt.read("calc/__init__.py", max_bytes=4096)).decode()[:40]}
            try:
                await rt.read("calc/__init__.py", max_bytes=10)
                contract["capped"] = "no error"
            except vf.SandboxError as e:
                contract["capped"] = str(e)
            try:
                await rt.read("/nope")
                contract["missing"] = "no error"
            except vf.SandboxError as e:
                contract["missing"] = str(e)
            await rt.write("/tmp/x/y.txt", b"hi")
            view = rt.with_env({"GREETING": "hello"})
            r = await view.run(["sh", "-c", "echo $GREETING; cat /tmp/x/y.txt; exit 3"], {})
            contract["run"] = [r.exit_code, r.stdout, r.stderr]
            contract["program"] = (await rt.run_program(["sh", "-c", "kill -9 $$"], {})).exit_code
            contract["session"] = rt.session.id
        contract["alive_after"] = await rt.alive()
        contract["stopped"] = rt.stopped
        left = [s.session_id for s in await client.list_sessions() if s.labels.get("run", "").startswith("vf1-")]
    await runner.cleanup()
    print(json.dumps({"report": report, "contract": contract, "tools": seen["tools"][0], "left": left}))

asyncio.run(main())
"""
)


@pytest.mark.slow
async def test_verifiers_v1_agent_runs_in_a_borrowed_session(node: NodeDaemon, task: Task, tmp_path: Path) -> None:
    """verifiers 0.4.0 (from PyPI, its own virtualenv): its ``Agent`` runs the rlsandbox harness
    (loaded by its id, as a config names it) in an ``RlsandboxRuntime`` it borrows, its
    interception server recording the turns of a scripted model server: the tool calls run in one
    session per rollout, the reward is the clean-room grade (``resolved``/``tampering`` metrics;
    rewriting the tests gains nothing), ``max_turns`` ends a looping policy, a lost sandbox ends
    the trace ``sandbox_error`` (not ok: the sample to drop), verifiers' own runtime methods
    (``read``'s cap, ``with_env``, ``run_program``, ``alive``) hold, and no session is left."""
    offline = {"HOME": str(tmp_path), "HF_DATASETS_OFFLINE": "1", "NO_PROXY": "127.0.0.1"}
    result = await script_in_venv(tmp_path, node, task, "verifiers-v1", "verifiers==0.4.0", VERIFIERS_V1_SCRIPT, offline)
    report, contract = result["report"], result["contract"]
    assert result["tools"] == ["bash", "edit", "view", "write"]
    fixer = report["fixer"]
    assert len({r["runtime"]["id"] for r in fixer}) == 2  # a group: one session per rollout
    for r in fixer:
        assert r["ok"] and r["stop"] == "agent_completed" and r["reward"] == 1.0, r
        assert r["metrics"] == {"resolved": 1.0, "tampering": 0.0} and r["rewards"] == {"clean_room": 1.0}
        assert r["runtime"]["borrowed"] and r["runtime"]["type"] == "docker"
        assert r["runtime"]["image"] == "rlsandbox/python-task:latest"
        outputs = r["tool_outputs"]
        assert "return a + b" in outputs[0] and outputs[1] == "edited calc/__init__.py", outputs
        assert "return a * b" in outputs[2] and outputs[3].startswith("42\n") and "[exit code 0]" in outputs[3]
    [hacker] = report["hacker"]
    assert hacker["ok"] and hacker["reward"] == 0.0 and hacker["metrics"] == {"resolved": 0.0, "tampering": 1.0}, hacker
    [looper] = report["looper"]
    assert looper["ok"] and looper["stop"] == "max_turns" and looper["turns"] == 6 and looper["reward"] == 0.0, looper
    [broken] = report["breaker"]
    assert not broken["ok"] and broken["stop"] == "sandbox_error" and broken["rewards"] == {}, broken
    assert broken["errors"][0].startswith("SandboxError: rlsandbox:"), broken
    [bomber] = report["bomber"]  # killed by its own doing: graded 0, never dropped (dying must not pay)
    assert bomber["ok"] and bomber["reward"] == 0.0 and bomber["rewards"] == {"clean_room": 0.0}, bomber
    assert bomber["tool_outputs"][0].startswith("the sandbox was lost"), bomber
    assert contract["alive"] and contract["read"].startswith('"""A tiny calculator')
    assert "over the 10 byte limit" in contract["capped"] and "No such file" in contract["missing"]
    assert contract["run"] == [3, "hello\nhi", ""]  # with_env's view: the same box, its own env
    assert contract["program"] == 137  # killed by a signal: 128 + 9
    assert contract["stopped"] and not contract["alive_after"]  # the owner's stop ended the session
    assert result["left"] == []
    no_sessions_left(node)


async def test_skyrl_gym_text_env_episodes_are_graded_sessions(node: NodeDaemon, task: Task) -> None:
    """SkyRL-gym (from PyPI): ``skyrl_gym.make`` builds the env, the model's text carries tool
    calls in tags, the episode is graded at <submit/>, and text without a tool call is told how."""

    import skyrl_gym

    def play() -> tuple[list[dict[str, object]], dict[str, object]]:
        import rlsandbox.integrations.skyrl  # noqa: F401 - registers "rlsandbox"

        env = skyrl_gym.make("rlsandbox", env_config={"target": node.address, "labels": {"run": "skyrl"}},
                             extras={"task": task, "max_turns": 6})  # fmt: skip
        outs = []
        try:
            prompt, info = env.init([{"role": "user", "content": "fix multiply"}])
            assert prompt[0]["content"] == "fix multiply" and info["workdir"] == "/workspace"
            outs.append(env.step("I will look first. <bash>grep -n 'a + b' calc/__init__.py</bash>"))
            outs.append(env.step("Thinking without a tool call."))
            fix = json.dumps({"tool": "edit", "path": "calc/__init__.py", "old": BUG, "new": FIX})
            outs.append(env.step(fix))
            outs.append(env.step("Done. <submit/>"))
            metrics = env.get_metrics()
        finally:
            env.close()
        return outs, metrics

    outs, metrics = await asyncio.to_thread(play)
    assert "return a + b" in outs[0]["observations"][0]["content"] and outs[0]["reward"] == 0.0 and not outs[0]["done"]
    assert "No tool call found" in outs[1]["observations"][0]["content"]
    assert outs[2]["observations"][0]["content"] == "edited calc/__init__.py"
    assert outs[3]["done"] and outs[3]["reward"] == 1.0 and outs[3]["metadata"]["status"] == "ok"
    assert metrics == {"turns": 4, "resolved": 1.0, "graded": 1.0}
    no_sessions_left(node)


async def test_verl_tool_as_a_per_trajectory_instance_keeps_one_session(node: NodeDaemon, task: Task) -> None:
    """The BaseTool lifecycle as verl documents it (create per trajectory, execute, calc_reward,
    release), without verl (its stand-in types): the instance is the trajectory."""
    from rlsandbox.integrations.verl import SandboxTool

    tool = SandboxTool({"type": "native", "target": node.address, "labels": {"run": "verl"}})
    assert tool.get_openai_tool_schema()["function"]["name"] == "sandbox"
    solved, _ = await tool.create(create_kwargs={"task": task})
    other, _ = await tool.create("traj-2", task=task)

    async def text(instance: str, call: dict[str, object]) -> str:
        response, step_reward, _ = await tool.execute(instance, call)
        assert step_reward == 0.0
        return str(response.text)

    try:
        assert (await text(solved, {"action": "bash", "command": "grep -c 'a + b' calc/__init__.py"})).startswith("2\n")
        assert "     1\t" in await text(solved, {"action": "view", "path": "calc/__init__.py", "start": 1, "end": 2})
        assert (
            await text(solved, {"action": "edit", "path": "calc/__init__.py", "old": BUG, "new": FIX})
            == "edited calc/__init__.py"
        )
        assert "occurs 0 times" in await text(other, {"action": "edit", "path": "calc/__init__.py", "old": "x" * 9, "new": "y"})
        assert await text(solved, {"action": "submit"}) == "submitted: ok, reward 1.0"
        assert len(node.sessions.sessions) == 1  # the submitted trajectory's session ended at once
        assert await text(solved, {"action": "bash", "command": "true"}) == "already submitted: the sandbox is graded"
        assert await tool.calc_reward(solved) == 1.0
        assert await tool.calc_reward(other) == 0.0  # graded at the end: the other trajectory fixed nothing
        assert not tool.infra_error
        unknown, _, metrics = await tool.execute("nope", {"action": "bash", "command": "true"})
        assert "call create first" in str(unknown.text) and metrics == {"error": "no_instance"}
    finally:
        await tool.release(solved)
        await tool.release(other)
        await tool.aclose()
    no_sessions_left(node)


VERL_SCRIPT = r"""
import asyncio, json, sys, tempfile
import hydra
from omegaconf import OmegaConf
from tokenizers import Tokenizer, models, pre_tokenizers, decoders
from transformers import PreTrainedTokenizerFast
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
from verl.tools.base_tool import BaseTool
from verl.tools.tool_registry import initialize_tools_from_config
from verl.workers.rollout.replica import TokenOutput
import rlsandbox.integrations.verl as rv  # registers the rlsandbox_tool_agent loop
from rlsandbox.client import AsyncClient

target, spec_path, tar_path = sys.argv[1:4]
task = (json.load(open(spec_path)), open(tar_path, "rb").read())

# A byte-level tokenizer made here (no model to download): every byte a token, ChatML's specials.
alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
core.decoder = decoders.ByteLevel()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>")
tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<tool_call>", "</tool_call>"]})
tokenizer.chat_template = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

BUG = "def multiply(a, b):\n    return a + b"
FIX = "def multiply(a, b):\n    return a * b"
END = "<|im_end|>"
def call(**args):
    return "<tool_call>" + json.dumps({"name": "sandbox", "arguments": args}) + "</tool_call>"
POLICIES = {  # the model's turns (hermes tool calls); the fixer's first turn makes two calls at once
    "fixer": [call(action="bash", command="grep -c 'a + b' calc/__init__.py")
              + call(action="view", path="calc/__init__.py") + END,
              call(action="edit", path="calc/__init__.py", old=BUG, new=FIX) + END,
              call(action="submit") + END, "done" + END],
    "idler": ["I give up." + END],
    "breaker": [call(action="bash", command="true") + END, call(action="bash", command="echo never") + END, "oh" + END],
}
seen = {}

class ScriptedModel:
    # verl's LLM server client (generate -> TokenOutput), answering with a policy's turns.
    def __init__(self):
        self.turns = {}
    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        policy = sampling_params["policy"]
        n = self.turns[request_id] = self.turns.get(request_id, 0) + 1
        if n == 2:  # the trajectory's first tool calls ran
            async with AsyncClient(target) as c:
                mine = await c.list_sessions(labels={"run": "verl"})
                seen[policy] = len(mine)
                if policy == "breaker":  # the node loses the sandbox mid-rollout
                    for s in mine:
                        await c.close_session(s.session_id)
        text = POLICIES[policy][min(n, len(POLICIES[policy])) - 1]
        return TokenOutput(token_ids=tokenizer.encode(text, add_special_tokens=False), stop_reason="completed")

config = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
config.write("tools:\n  - class_name: rlsandbox.integrations.verl.SandboxTool\n"
             f"    config: {{type: native, target: '{target}', labels: {{run: verl}}}}\n")
config.close()
tools = initialize_tools_from_config(config.name)  # verl's own registry, as its rollout worker loads tools
assert isinstance(tools[0], BaseTool) and type(tools[0]) is rv.SandboxTool
# The agent loop's _target_, as docs/INTEGRATIONS.md gives it for agent_loop_config_path.
assert _agent_loop_registry["rlsandbox_tool_agent"]["_target_"] == "rlsandbox.integrations.verl.SandboxToolAgentLoop"
trainer = OmegaConf.create({"actor_rollout_ref": {"rollout": {
    "prompt_length": 4096, "response_length": 8192, "full_determinism": False,
    "multi_turn": {"max_user_turns": 8, "max_assistant_turns": 8, "max_parallel_calls": 2,
                   "max_tool_response_length": 1024, "tool_response_truncate_side": "middle", "format": "hermes"}}}})
model = ScriptedModel()

async def rollout(policy, agent="rlsandbox_tool_agent"):
    # As verl's AgentLoopWorker runs one sample: the registered loop, instantiated by hydra.
    loop = hydra.utils.instantiate(
        _agent_loop_registry[agent], trainer_config=DictConfigWrap(trainer), server_manager=model, tokenizer=tokenizer,
        processor=None, dataset_cls=None, data_config=DictConfigWrap(OmegaConf.create({})), tools=ToolListWrap(tools))
    out = await loop.run({"policy": policy}, raw_prompt=[{"role": "user", "content": "Fix calc.multiply."}],
                         tools_kwargs={"sandbox": {"create_kwargs": {"task": task}}})
    text = tokenizer.decode(out.response_ids)
    return {"reward": out.reward_score, "rlsandbox": out.extra_fields.get("rlsandbox"), "trained_tokens": sum(out.response_mask),
            "tool_outputs": [t.split(END)[0] for t in text.split("<|im_start|>tool\n")[1:]]}

async def main():
    report = {p: await rollout(p) for p in ("fixer", "idler", "breaker")}
    report["plain"] = await rollout("fixer", agent="tool_agent")  # verl's own loop
    async with AsyncClient(target) as c:
        report["left"] = [dict(s.labels) for s in await c.list_sessions(labels={"run": "verl"})]
    report["sessions_at_turn_2"] = seen
    print(json.dumps(report))

asyncio.run(main())
"""


async def test_verl_agent_loop_runs_a_trajectory_in_one_graded_session(node: NodeDaemon, task: Task, tmp_path: Path) -> None:
    """verl 0.9.1 from PyPI (with torch's CPU build): its tool registry loads the tool from a tool
    config, and its own ToolAgentLoop (and ``rlsandbox_tool_agent``, which grades at the end)
    run trajectories against a scripted model: every tool call of a trajectory, two at once
    included, in one session; the reward as the output's ``reward_score``; a lost sandbox masked."""
    pins = ["torch==2.13.0", "verl==0.9.1"]  # torch: the CPU build this machine keeps on disk
    result = await script_in_venv(tmp_path, node, task, "verl", pins, VERL_SCRIPT, {})
    fixer, idler, breaker, plain = result["fixer"], result["idler"], result["breaker"], result["plain"]
    assert fixer["reward"] == 1.0 and fixer["rlsandbox"]["resolved"], result
    outputs = fixer["tool_outputs"]
    assert outputs[0] == "2\n\n[exit code 0]" and "     9\t    return a + b" in outputs[1], outputs
    assert outputs[2:] == ["edited calc/__init__.py", "submitted: ok, reward 1.0"]
    assert result["sessions_at_turn_2"] == {"fixer": 1, "breaker": 1}  # two calls at once, one session
    # The idler never called the tool: the untouched task's grade, from a session opened for it.
    assert idler["reward"] == 0.0 and idler["rlsandbox"]["status"] == "ok" and idler["tool_outputs"] == []
    assert breaker["reward"] == 0.0 and "not found" in breaker["rlsandbox"]["infra_error"]
    assert breaker["trained_tokens"] == 0 and breaker["tool_outputs"][-1].startswith("the sandbox was lost")
    # verl's own loop: the same tool calls in one session; the reward is not the loop's to set.
    assert plain["tool_outputs"] == outputs and plain["reward"] is None and plain["trained_tokens"] > 0
    assert result["left"] == []  # the submit ended the plain loop's session too
    no_sessions_left(node)


async def test_slime_sandbox_protocol_runs_an_episode_in_a_session(node: NodeDaemon, task: Task, tmp_path: Path) -> None:
    """slime's ``Sandbox`` (async context manager, exec -> (code, out, err), write_file, read_file),
    as its rollouts call it: checked against its published protocol (slime is not on PyPI)."""
    from rlsandbox.client import SandboxRPCError
    from rlsandbox.integrations.slime import RlsandboxSandbox

    async with RlsandboxSandbox(task=task, target=node.address, labels={"run": "slime"}) as sb:
        assert sb.sandbox_id in node.sessions.sessions
        assert await sb.exec("grep -c 'a + b' calc/__init__.py") == (0, "2\n", "")
        assert await sb.exec("echo out; echo err >&2; exit 3") == (3, "out\n", "err\n")
        with pytest.raises(RuntimeError, match=r"exit=3"):
            await sb.exec("exit 3", check=True)
        assert (await sb.exec("kill -9 $$"))[0] == 128 + 9
        code, _, err = await sb.exec("sleep 5", timeout=1)
        assert code == 124 and "timed out" in err
        assert (await sb.exec("echo $GREETING", env={"GREETING": "hi"}))[1] == "hi\n"
        assert (await sb.exec("id -un", user="nobody"))[1] == "nobody\n"  # a root session can change user
        source = await sb.read_file("calc/__init__.py")
        await sb.write_file("calc/__init__.py", source.replace(BUG, FIX))
        await sb.write_file("/tmp/b.bin", b"\x00\x01")
        local = tmp_path / "notes.txt"
        local.write_text("from the host\n")
        await sb.write_file("/tmp/notes.txt", local, user="nobody")
        assert (await sb.exec("stat -c %U /tmp/notes.txt; wc -c < /tmp/b.bin"))[1] == "nobody\n2\n"
        assert await sb.read_file("/tmp/notes.txt") == "from the host\n"
        assert await sb.read_file("/no/such/file") == ""
        # slime's exec_and_wait pattern: a launcher started detached (setsid, its own output file),
        # its exit code dropped into a marker the rollout polls with short calls.
        await sb.write_file("/tmp/.t.sh", "#!/bin/bash\ncd /tmp\nsleep 0.3; echo built; exit 5\n")
        spawn = "chmod +x /tmp/.t.sh; setsid bash -c '/tmp/.t.sh; echo $? > /tmp/.t.done' < /dev/null > /tmp/.t.out 2>&1 &"
        assert (await sb.exec(spawn, timeout=30, check=True, idempotent=False))[0] == 0
        for _ in range(100):
            code, marker, _ = await sb.exec("test -f /tmp/.t.done && cat /tmp/.t.done", timeout=15, idempotent=True)
            if code == 0 and marker.strip():
                break
            await asyncio.sleep(0.05)
        assert marker.strip() == "5" and await sb.read_file("/tmp/.t.out") == "built\n"
        assert await sb.reward() == 1.0
        sid = sb.sandbox_id
    assert sid not in node.sessions.sessions

    # A sandbox lost mid-rollout: the exception is slime's way of dropping the sample.
    async with RlsandboxSandbox(task=task, target=node.address) as sb:
        sandbox = node.sessions.sessions[sb.sandbox_id].sandbox
        assert sandbox is not None
        await node.runtime.docker.containers.container(sandbox.container_id).kill()
        with pytest.raises(SandboxRPCError):
            await sb.exec("true")
    with pytest.raises(ValueError, match="image, a pool or a task"):
        RlsandboxSandbox()
    no_sessions_left(node)


async def test_rllm_sandbox_protocol_moves_files_and_never_writes_outside(node: NodeDaemon, task: Task, tmp_path: Path) -> None:
    """rLLM's ``Sandbox`` (sync exec that raises on failure, uploads, a detached process, close),
    as rLLM's flows get it (``env``): checked against its published protocol
    (rllm has no Python 3.11 distribution). A download from the untrusted sandbox writes only
    regular files inside the target folder."""
    import os

    from rlsandbox.integrations.rllm import RlsandboxSandbox, create_rlsandbox_sandbox

    project = tmp_path / "agent"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    os.chmod(project / "pkg" / "run.sh", 0o755)
    os.symlink("pkg/run.sh", project / "link")
    (tmp_path / "single.txt").write_text("one file\n")
    outside = tmp_path / "outside"

    def play() -> tuple[str, bool]:
        sb = create_rlsandbox_sandbox(name="task-1", image="", task=task, target=node.address)
        try:
            assert sb.exec("grep -c 'a + b' calc/__init__.py") == "2\n"
            with pytest.raises(RuntimeError, match=r"exit 3.*\n.*\n.*boom"):
                sb.exec("echo boom >&2; exit 3")
            sb.upload_dir(str(project), "/app/agent")
            sb.upload_file(str(tmp_path / "single.txt"), "/app/runner/single.txt")
            assert sb.exec("/app/agent/pkg/run.sh && readlink /app/agent/link && cat /app/runner/single.txt") == (
                "ran\npkg/run.sh\none file\n"
            )
            # What a hostile episode leaves for the trainer to download.
            sb.exec(
                "mkdir -p /out/sub && echo a > /out/a.txt && echo b > /out/sub/b.txt && ln -s /etc/passwd /out/pw"
                f" && ln -s {outside} /out/escape && mkfifo /out/fifo"
            )
            got = sorted(os.path.relpath(p, tmp_path / "dl") for p in sb.download_dir("/out", str(tmp_path / "dl")))
            assert got == ["a.txt", "sub/b.txt"]
            assert (tmp_path / "dl" / "sub" / "b.txt").read_text() == "b\n" and not outside.exists()
            sb.start_agent_process("while true; do date > /tmp/alive; sleep 0.2; done", port=8100)
            assert sb.exec("sleep 1; test -s /tmp/alive && echo yes") == "yes\n"
            with pytest.raises(NotImplementedError, match="no network"):
                sb.get_endpoint(8100)
            sb.exec("sed -i '/def multiply/,/return/ s/a + b/a * b/' calc/__init__.py")
            grade = sb.grade()
            alive = sb.is_alive()
        finally:
            sb.close()
        assert not sb.is_alive()
        with pytest.raises(RuntimeError, match="closed"):
            sb.exec("true")
        return f"{grade.status} {grade.reward}", alive

    assert await asyncio.to_thread(play) == ("ok 1.0", True)
    with pytest.raises(ValueError, match="image, a pool or a task"):
        RlsandboxSandbox(name="x")
    no_sessions_left(node)


MISUSES = [  # a model's arguments, and what it reads back instead of an error
    ({"tool": "bash", "command": "true", "timeout": 1e9}, "refused by the sandbox: timeout of 1e+09 s is over"),
    ({"tool": "bash", "command": "true", "timeout": "soon"}, "'timeout' must be a positive number"),
    ({"tool": "bash", "command": "true", "timeout": -3}, "'timeout' must be a positive number"),
    ({"tool": "bash", "command": "true", "cwd": ["/"]}, "'cwd' must be a path"),
    ({"tool": "view", "path": "calc/__init__.py", "start": "top"}, "must be line numbers"),
    ({"tool": "view", "path": "calc/\x00x"}, "refused by the sandbox"),
    ({"tool": "write", "path": "a\x00b", "content": "x"}, "refused by the sandbox"),
]


async def test_rllm_task_hooks_give_each_task_a_session_graded_in_a_clean_room(
    node: NodeDaemon, task: Task, tmp_path: Path
) -> None:
    """rLLM's per-task hooks (``AgentFlowEngine(..., hooks=...)``: setup -> TaskContext with the
    sandbox as the flow's ``env``, an evaluator, a teardown), on the stand-in types (rLLM is not on
    PyPI; checked by hand against rllm 0.3.0.pre's own types and ``run_agent_flow``)."""
    from rlsandbox.client import SandboxRPCError
    from rlsandbox.integrations.rllm import CleanRoomEvaluator, RlsandboxTaskHooks

    def fix(env: object) -> None:  # what a flow's run(task, config, *, env) does with its env
        source = env.exec("cat calc/__init__.py")  # type: ignore[attr-defined]
        env.exec("cat > calc/__init__.py <<'EOF'\n" + source.replace(BUG.strip(), FIX.strip()) + "EOF")  # type: ignore[attr-defined]

    rows = tmp_path / "tasks.jsonl"
    rows.write_text(json.dumps({**json.loads(task.spec_json()), "id": "calc-by-file"}) + "\n")
    by_id = RlsandboxTaskHooks({"py-calc": task}, target=node.address, labels={"run": "rllm"})
    by_file = RlsandboxTaskHooks(str(rows), target=node.address)
    rllm_task = type("RllmTask", (), {"id": "py-calc", "instruction": "fix calc.multiply"})()

    def play() -> tuple[Any, Any, Any]:  # blocking, as rLLM runs hooks and evaluators in its executor
        solved = by_id.setup(rllm_task, None, "py-calc:0")
        idle = by_id.setup(rllm_task, None, "py-calc:1")
        assert by_id.client is not None and solved.env.client is by_id.client  # one channel for the tasks
        assert node.sessions.sessions[solved.env.session.id].options.labels["rllm_uid"] == "py-calc:0"
        try:
            fix(solved.env)
            return solved.evaluator.evaluate(rllm_task, None), idle.evaluator.evaluate(rllm_task, None), solved
        finally:
            solved.teardown()
            idle.teardown()

    won, lost, solved = await asyncio.to_thread(play)
    assert (won.reward, won.is_correct, won.metadata["rlsandbox_status"]) == (1.0, True, "ok")
    assert [(s.name, s.value) for s in won.signals] == [("tests_passed", 1.0)]
    assert (lost.reward, lost.is_correct) == (0.0, False) and lost.signals[0].value == 0.4  # 2 of 5 listed tests
    assert not solved.env.is_alive()
    with pytest.raises(LookupError, match="no rlsandbox task"):
        by_id.spec(type("RllmTask", (), {"id": "other"})())

    # A task found in a JSONL by id; a sandbox lost before grading is an error, not a reward: rLLM
    # retries the rollout, then ends it with TerminationReason.ERROR.
    ctx = await asyncio.to_thread(by_file.setup, type("RllmTask", (), {"id": "calc-by-file"})(), None, "calc-by-file:0")
    assert isinstance(ctx.evaluator, CleanRoomEvaluator)
    session = node.sessions.sessions[ctx.env.session.id]
    assert session.sandbox is not None
    await node.runtime.docker.containers.container(session.sandbox.container_id).kill()
    with pytest.raises(SandboxRPCError, match="died"):
        await asyncio.to_thread(ctx.evaluator.evaluate, None, None)
    await asyncio.to_thread(ctx.teardown)
    by_id.close()
    by_file.close()
    assert by_id.client is None

    # rLLM sets tasks up from its executor's threads at once: one client for all of them (a
    # client made by each racing thread but one would never be closed).
    wide = RlsandboxTaskHooks({"py-calc": task}, target=node.address)

    def many() -> set[int]:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(8) as pool:
            contexts = list(pool.map(lambda i: wide.setup(rllm_task, None, f"py-calc:w{i}"), range(8)))
        for ctx in contexts:
            ctx.teardown()
        return {id(ctx.env.client) for ctx in contexts}

    assert await asyncio.to_thread(many) == {id(wide.client)}
    wide.close()
    no_sessions_left(node)


async def test_a_policys_bad_arguments_are_observations_never_errors(node: NodeDaemon, task: Task) -> None:
    """What the model's tool arguments cause (a timeout over the node's limit, a path with a NUL)
    is the policy's mistake: an observation it reads, never an error that would drop the sample as
    the node's; the same through the blocking and the async tool layer."""
    from rlsandbox.client import AsyncClient, Client
    from rlsandbox.integrations import tools

    async with AsyncClient(node.address) as c, c.session(task=task) as s:
        for call, said in MISUSES:
            assert said in (await tools.arun(s, call)).text, call
        assert "[exit code 0]" in (await tools.arun(s, {"tool": "bash", "command": "true", "timeout": "5"})).text

    def blocking() -> None:
        with Client(node.address) as c, c.session(task=task) as s:
            for call, said in MISUSES:
                assert said in tools.run(s, call).text, call

    await asyncio.to_thread(blocking)
    no_sessions_left(node)
