"""verifiers >= 0.4 (``verifiers.v1``): rlsandbox sessions as the boxes its agents run in.

verifiers 0.4 runs an ``Agent`` (harness x model x runtime) on a ``Task``; its runtime configs are
a closed set (subprocess, docker, podman, apptainer, prime, modal, e2b), but ``Agent.run(task,
runtime=box)`` borrows any live ``Runtime``. So an rlsandbox session is borrowed, not configured::

    from rlsandbox.integrations.verifiers_v1 import RlsandboxTask, agent_config, rollout

    config = agent_config("my-policy", vf.EvalClientConfig(base_url=...), max_turns=20)
    async with AsyncClient(node) as client, vf.Agent(config) as agent:
        traces = await asyncio.gather(*(rollout(agent, client, RlsandboxTask.of(task)) for _ in range(8)))

- :class:`RlsandboxRuntime`: verifiers' ``Runtime`` over one session (``run``, ``read`` with its
  cap enforced in the box, ``write``; ``config`` is a ``DockerConfig`` naming the session's
  image: the box is a Docker container of the node). :func:`rlsandbox_runtime` makes one per
  rollout and ends its session; :func:`rollout` runs an agent in it.
- :class:`RlsandboxTask`: a verifiers ``Task`` whose ``@reward`` is the session's clean-room
  grade, with ``resolved`` and ``tampering`` as metrics. A grade that could not score the work
  (``infra_error``, ``invalid_task``, the node lost) raises verifiers' ``SandboxError``: the
  trace ends ``sandbox_error``, not ok, and the trainer drops it. A sandbox the episode killed
  itself is graded (reward 0), never dropped: dying must not pay better than failing.
- :class:`RlsandboxHarness`: the agent loop in the trainer's process, its model calls through
  verifiers' interception endpoint (so they are the trace's turns, under its limits), its tools
  (``bash``, ``view``, ``edit``, ``write``) run in the session. The sandbox needs no network.
  verifiers' own harnesses (``bash``, ``mini_swe_agent``, ...) run a program *inside* the box,
  bootstrapped with ``uv`` and calling the model over HTTP: they need a pool with
  ``network = true``, an image with ``uv`` (or the internet to fetch it), and the model endpoint
  reachable from the node's containers. Pools have no network by default.

Checked against verifiers 0.4.0 from PyPI, its own ``Agent``, rollout, interception server and
scoring, with a scripted model server: docs/INTEGRATIONS.md.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import openai
from rlsandbox.client import AsyncClient, AsyncSession, GradeResult, SandboxRPCError
from rlsandbox.integrations import tools
from rlsandbox.integrations.tools import session_options
from verifiers.v1 import (
    Agent,
    AgentConfig,
    DockerConfig,
    Harness,
    HarnessConfig,
    ModelContext,
    ProgramResult,
    Runtime,
    SandboxError,
    Task,
    TaskData,
    Trace,
    reward,
)
from verifiers.v1.errors import MODEL_TRANSPORT_ERROR_EXIT_CODE
from verifiers.v1.runtimes.docker import DockerRuntimeInfo

__all__ = [
    "RlsandboxHarness",
    "RlsandboxHarnessConfig",
    "RlsandboxRuntime",
    "RlsandboxTask",
    "RlsandboxTaskData",
    "agent_config",
    "rlsandbox_runtime",
    "rollout",
]

SYSTEM_PROMPT = (
    "You work in a sandbox holding the task's repository. Use the tools to inspect and change it. "
    "When you are done, answer without calling a tool."
)


# -- the box ----------------------------------------------------------------------------------
class RlsandboxRuntime(Runtime):
    """verifiers' ``Runtime`` over one rlsandbox session. ``owned``: ``stop()`` ends the session
    (:func:`rlsandbox_runtime` makes owned ones); a borrowed box is never stopped by a rollout.

    ``is_local``: model endpoints stay the trainer's loopback URLs. :class:`RlsandboxHarness`
    reaches them from the trainer's process; a program inside the box cannot (see the module)."""

    is_local = True

    def __init__(self, session: AsyncSession, *, owned: bool = False, command_timeout: float = 600.0) -> None:
        super().__init__(name=f"rlsandbox-{session.id}")
        self.session = session
        self.owned = owned
        self.command_timeout = float(command_timeout)
        info = session.info
        self.config = DockerConfig(image=info.image or f"rlsandbox-pool:{info.pool}", workdir=info.workdir or None)
        self.info = DockerRuntimeInfo(**self.config.model_dump(), id=session.id)

    async def start(self) -> None:
        """The session is live already: nothing to provision."""
        if self.stopped:
            raise SandboxError(f"rlsandbox session {self.session.id} has been stopped")

    async def teardown(self) -> None:
        if not self.owned:
            return
        try:
            await self.session.close()
        except SandboxRPCError:  # the node went away: its reconciler removes the sandbox
            pass

    async def run(self, argv: list[str], env: dict[str, str]) -> ProgramResult:
        try:
            result = await self.session.exec(list(argv), env=self.process_env(env), timeout=self.command_timeout)
        except SandboxRPCError as e:
            # The episode killed its own sandbox: a killed command (the grade then says 0);
            # anything else is the node's: verifiers' SandboxError, the sample to drop.
            dead = tools.died(e)
            if dead is None:
                raise SandboxError(f"rlsandbox: {e}") from e
            result = dead
        return ProgramResult(*tools.outcome(result))

    async def _read(self, path: str, max_bytes: int | None = None) -> bytes:
        """At most ``max_bytes`` of ``path``, cut by the node (the whole file past the node's own
        read limit raises: a cut copy is never handed out as the file)."""
        try:
            found = (await self.session.read_files([path], max_bytes=max_bytes or 0)).get(path)
        except SandboxRPCError as e:
            raise SandboxError(f"rlsandbox: read {path!r}: {e}") from e
        if found is None or found.error:
            raise SandboxError(f"read {path!r}: {found.error if found else 'not found'}")
        if found.truncated and (max_bytes is None or len(found.data) < max_bytes):
            raise SandboxError(f"read {path!r}: {found.size} bytes, past the node's read limit")
        return found.data

    async def write(self, path: str, data: bytes) -> None:
        try:
            await self.session.write_files({path: data})
        except SandboxRPCError as e:
            raise SandboxError(f"rlsandbox: write {path!r}: {e}") from e


def _session(runtime: Runtime) -> AsyncSession:
    session = getattr(runtime, "session", None)
    if not isinstance(session, AsyncSession):
        raise SandboxError(f"{type(runtime).__name__} is not an rlsandbox session: run the agent in an RlsandboxRuntime")
    return session


@asynccontextmanager
async def rlsandbox_runtime(
    client: AsyncClient,
    task: Any = None,
    *,
    pool: str = "",
    image: str = "",
    labels: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    command_timeout: float = 600.0,
) -> AsyncIterator[RlsandboxRuntime]:
    """A session of ``task`` (a spec, ``(spec, workspace_tar)``, a loaded ``Task``, a ref), or an
    ungraded one of ``pool``/``image``, as a runtime; its session ends on exit, whatever happened.
    A session that cannot be made is verifiers' ``SandboxError``."""
    try:
        options = session_options(task=task, image=image, pool=pool, labels=labels, env=env)
        session = await client.create_session(pool if task is None else "", **options)
    except SandboxRPCError as e:
        raise SandboxError(f"rlsandbox: no session for this rollout: {e}") from e
    runtime = RlsandboxRuntime(session, owned=True, command_timeout=command_timeout)
    try:
        yield runtime
    finally:
        await runtime.stop()


def agent_config(model: str, client: Any, **fields: Any) -> AgentConfig:
    """An ``AgentConfig`` for rollouts in rlsandbox sessions: this module's harness (unless
    ``harness`` is given) and a local runtime policy. The policy is for boxes the agent would make
    itself, which :func:`rollout` never asks for; verifiers' default (prime) would put its
    interception server behind a prime tunnel, which needs a prime login."""
    fields.setdefault("harness", RlsandboxHarnessConfig())
    fields.setdefault("runtime", DockerConfig())
    return AgentConfig(model=model, client=client, **fields)


async def rollout(agent: Agent, client: AsyncClient, task: RlsandboxTask, **options: Any) -> Trace:
    """One rollout of ``agent`` on ``task`` in a session of its own (``options``: those of
    :func:`rlsandbox_runtime`). A session that cannot be made raises verifiers' ``SandboxError``."""
    async with rlsandbox_runtime(client, task.rlsandbox_task, **options) as runtime:
        return await agent.run(task, runtime=runtime)


# -- the task and its reward ------------------------------------------------------------------
class RlsandboxTaskData(TaskData):
    task_id: str = ""
    """The rlsandbox task's id (traced with the trace's task)."""


class RlsandboxTask(Task[RlsandboxTaskData]):
    """An rlsandbox task as a verifiers task: its problem statement is the prompt, its reward the
    session's clean-room grade. ``rlsandbox_task``: what :func:`rollout` makes the session of."""

    NEEDS_CONTAINER = True
    rlsandbox_task: Any = None

    @classmethod
    def of(cls, task: Any, *, prompt: str | None = None, system_prompt: str | None = SYSTEM_PROMPT) -> RlsandboxTask:
        spec = task[0] if isinstance(task, tuple) else task
        spec = json.loads(spec) if isinstance(spec, str) else spec
        task_id = str(spec.get("id", "")) if isinstance(spec, Mapping) else str(getattr(spec, "id", "") or "")
        text = prompt if prompt is not None else tools.task_statement(task) or "Solve the task."
        made = cls(RlsandboxTaskData(id=task_id or None, task_id=task_id, prompt=text, system_prompt=system_prompt))
        made.rlsandbox_task = task
        return made

    @reward
    async def clean_room(self, trace: Trace, runtime: Runtime) -> float:
        """The session's clean-room grade; ``resolved`` and ``tampering`` go to the metrics."""
        session = _session(runtime)
        try:
            grade: GradeResult = await session.grade()
        except SandboxRPCError as e:
            lost = await tools.alost(session, e)  # the episode killed its sandbox: graded, 0
            if lost is None:
                raise SandboxError(f"rlsandbox: the grade failed: {e}") from e
            grade = lost
        if grade.reward is None:
            raise SandboxError(f"rlsandbox: not scored ({grade.status}): {grade.message}")
        trace.record_metric("resolved", float(grade.resolved))
        trace.record_metric("tampering", float(bool(grade.tampering)))
        return float(grade.reward)


# -- the agent loop -----------------------------------------------------------------------------
def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    params = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


_TEXT = {"type": "string"}
TOOLS = [
    _function(
        "bash",
        "Run a bash command in the sandbox (in the repository) and return its output and exit code.",
        {"command": _TEXT, "timeout": {"type": "number", "description": "seconds (0: the default)"}},
        ["command"],
    ),
    _function(
        "view",
        "Show a file's lines, numbered (at most 400).",
        {"path": _TEXT, "start": {"type": "integer"}, "end": {"type": "integer"}},
        ["path"],
    ),
    _function(
        "edit",
        "Replace text in a file: `old` must occur exactly once.",
        {"path": _TEXT, "old": _TEXT, "new": _TEXT},
        ["path", "old", "new"],
    ),
    _function("write", "Write a whole file (its folders are made).", {"path": _TEXT, "content": _TEXT}, ["path", "content"]),
]


class RlsandboxHarnessConfig(HarnessConfig):
    id: str = "rlsandbox-verifiers"  # the module verifiers imports it by: rlsandbox_verifiers
    command_timeout: float = 120.0
    """Seconds a bash call may run when the model does not say."""


class RlsandboxHarness(Harness[RlsandboxHarnessConfig]):
    """A tool-calling loop in the trainer's process: each model call goes through verifiers'
    interception ``endpoint`` (recorded as the trace's turn; the run's limits and ``@stop``s end
    the loop there), each tool call runs in the rollout's session. Ends when the model answers
    without a tool call."""

    APPENDS_SYSTEM_PROMPT = True
    NEEDS_CONTAINER = True

    async def launch(
        self,
        ctx: ModelContext,
        trace: Trace,
        runtime: Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: TaskData,
        tool_interception_url: str | None = None,
    ) -> ProgramResult:
        session = _session(runtime)
        system, prompt = self.resolve_text_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": prompt or "Solve the task."})
        seq = 0
        async with openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0) as llm:
            while True:
                try:
                    completion = await llm.chat.completions.create(model=ctx.model, messages=messages, tools=TOOLS)  # type: ignore[arg-type]
                except openai.APIStatusError as e:
                    if trace.stop_condition is not None:  # a limit or @stop refused the call: done
                        return ProgramResult(0, "", "")
                    return ProgramResult(1, "", f"the model call failed: {e}")
                except openai.APIConnectionError as e:
                    return ProgramResult(MODEL_TRANSPORT_ERROR_EXIT_CODE, "", f"the model endpoint: {e}")
                message = completion.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    return ProgramResult(0, message.content or "", "")
                for call in message.tool_calls:
                    seq += 1
                    text = await self._tool(session, call.function.name, call.function.arguments, seq)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": text})

    async def _tool(self, session: AsyncSession, name: str, arguments: str, seq: int) -> str:
        try:
            args = json.loads(arguments or "{}")
        except ValueError:
            return f"the arguments of {name} are not JSON: {arguments[:200]!r}"
        if not isinstance(args, dict) or name not in ("bash", "view", "edit", "write"):
            return f"unknown tool {name!r}: use bash, view, edit or write"
        try:
            return (await tools.arun(session, {**args, "tool": name}, timeout=self.config.command_timeout, seq=seq)).text
        except SandboxRPCError as e:
            if e.fault:  # the episode killed its sandbox: it is graded (reward 0), not dropped
                return f"the sandbox was lost: {e.message}"
            raise SandboxError(f"rlsandbox: {e}") from e
