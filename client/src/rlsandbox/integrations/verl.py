"""A verl tool (``verl.tools.base_tool.BaseTool``) whose sandbox is one rlsandbox session for the
whole trajectory, and verl agent loop ``rlsandbox_tool_agent`` that grades it.

In verl's tool config (``actor_rollout_ref.rollout.multi_turn.tool_config_path``)::

    tools:
      - class_name: rlsandbox.integrations.verl.SandboxTool
        config: {type: native, target: "127.0.0.1:7420", labels: {run: my-run}}

per sample ``extra_info.tools_kwargs.sandbox.create_kwargs = {"task": <spec or ref>}``, and the
agent loop ``rlsandbox_tool_agent`` (``agent_name`` per sample, or the rollout's default; it is
``- {name: rlsandbox_tool_agent, _target_: rlsandbox.integrations.verl.SandboxToolAgentLoop}`` in the
file ``actor_rollout_ref.rollout.agent.agent_loop_config_path`` names; importing this module also
registers it).

How verl 0.9 calls a tool: its ``ToolAgentLoop`` runs ``create``, ``execute`` and ``release`` for
*every* tool call, so an instance is one call, not a trajectory. The tool keeps the session per
trajectory instead: the first call of a trajectory opens it (from the task in ``create_kwargs``),
later calls of the same trajectory (the same ``agent_data``) reuse it, and ``release`` of one call
leaves it open. ``execute`` answers with verl's ``ToolResponse`` (the text the model reads next), a
step reward of 0.0 and metrics. The model's ``submit`` grades the session in a clean room.

``rlsandbox_tool_agent`` is verl's ``ToolAgentLoop`` plus the end of the trajectory: it grades the
session (unless the model submitted; a trajectory that never called the tool gets the grade of the
untouched task), sets the output's ``reward_score`` (verl then computes no reward of its own),
puts the grade in ``extra_fields["rlsandbox"]`` and closes the session, also when the loop fails.
A sandbox the episode killed itself (out of memory at its limit) is graded reward 0, never masked.
An infra error (the node's fault, not the policy's) gives reward 0.0, ``extra_fields["rlsandbox"]
["infra_error"]`` and a response mask of zeros: the sample's tokens train nothing. With verl's
plain ``tool_agent`` loop the tool works the same, but only ``submit`` ends a session; others end
at their idle timeout (``idle_timeout`` in the tool config, 600 s by default).

Older rollouts that call ``create`` once per trajectory and ``calc_reward`` at its end (the
BaseTool lifecycle as documented) work too: without ``agent_data`` an instance is its own
trajectory, and its ``release`` ends the session.

verl is not a dependency (it needs torch): the classes subclass verl's when verl is importable and
follow the same interface otherwise. Checked against verl 0.9.1 from PyPI
(tests/integration/test_integrations.py: its tool registry and its ``ToolAgentLoop`` with a scripted model).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from rlsandbox.client import AsyncClient, AsyncSession, GradeResult, SandboxRPCError
from rlsandbox.integrations import tools

try:  # verl's classes when verl is installed; the same interface otherwise
    from verl.tools.base_tool import BaseTool as _Base
    from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

    VERL = True
except ImportError:  # pragma: no cover - depends on the environment
    VERL = False
    _Base = object

    @dataclass
    class ToolResponse:  # type: ignore[no-redef]
        """verl's ``ToolResponse`` fields this tool sets."""

        text: Optional[str] = None
        image: Any = None
        video: Any = None


TRAJECTORY = "rlsandbox_trajectory"  # agent_data.extra_fields key: the trajectory's session key
IDLE_TIMEOUT = 600.0  # seconds a session without calls lives when no agent loop ends it
MAX_TRAJECTORIES = 10_000  # trajectories a tool remembers (grades, infra errors) at most

SCHEMA: Dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "sandbox",
        "description": "Work in the task's sandbox: run a bash command, view or edit a file, or submit when done.",
        "parameters": {
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["bash", "view", "edit", "write", "submit"]},
                "command": {"type": "string", "description": "bash: the command"},
                "path": {"type": "string", "description": "view/edit/write: the file"},
                "old": {"type": "string", "description": "edit: the exact text to replace (once)"},
                "new": {"type": "string", "description": "edit: its replacement"},
                "content": {"type": "string", "description": "write: the file's content"},
            },
            "required": ["action"],
        },
    },
}


@dataclass
class _Trajectory:
    opening: Optional[asyncio.Future[AsyncSession]] = None  # the session, once (parallel calls share it)
    grade: Optional[GradeResult] = None
    infra_error: str = ""


class SandboxTool(_Base):  # type: ignore[misc,valid-type]
    SCHEMA = SCHEMA

    def __init__(self, config: Optional[Dict[str, Any]] = None, tool_schema: Any = None) -> None:
        # Not BaseTool.__init__: it prints the schema. It sets these three.
        self.config = dict(config or {})
        if tool_schema is None:
            tool_schema = OpenAIFunctionToolSchema.model_validate(SCHEMA) if VERL else SCHEMA
        self.tool_schema = tool_schema
        self.name = "sandbox"
        self._client: Optional[AsyncClient] = None
        self._client_loop: Optional[asyncio.AbstractEventLoop] = None
        self.labels = {str(k): str(v) for k, v in dict(self.config.get("labels") or {}).items()}
        self.idle_timeout = float(self.config.get("idle_timeout", IDLE_TIMEOUT))
        self._instances: Dict[str, Tuple[Dict[str, Any], str]] = {}  # instance -> (create kwargs, trajectory)
        self._trajectories: Dict[str, _Trajectory] = {}
        self.infra_error: Dict[str, str] = {}  # trajectory (or instance) -> why it could not be graded

    def get_openai_tool_schema(self) -> Any:
        return self.tool_schema

    @property
    def client(self) -> AsyncClient:
        """The node's client, made in the loop that uses it: verl makes its tools before its event
        loop runs (a gRPC channel belongs to the loop it was made in)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client = AsyncClient(
                str(self.config.get("target", "127.0.0.1:7420")), timeout=float(self.config.get("timeout", 120))
            )
            self._client_loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the client (sessions still open stay to their idle timeout)."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def create(self, instance_id: Optional[str] = None, **kwargs: Any) -> Tuple[str, ToolResponse]:
        """An instance: verl's agent loop makes one per call. Its ``create_kwargs`` (or keywords):
        ``task`` (spec or ref) or ``pool``: where the trajectory's session starts."""
        instance_id = instance_id or str(uuid.uuid4())
        self._instances[instance_id] = (dict(kwargs.get("create_kwargs") or kwargs), instance_id)
        return instance_id, ToolResponse()

    async def execute(
        self, instance_id: str, parameters: Dict[str, Any], **kwargs: Any
    ) -> Tuple[ToolResponse, float, Dict[str, Any]]:
        """One tool call in its trajectory's session: (what the model reads next, a step reward of
        0.0, metrics)."""
        found = self._instances.get(instance_id)
        if found is None:
            return ToolResponse(text=f"no sandbox for {instance_id}: call create first"), 0.0, {"error": "no_instance"}
        create_kwargs, key = found
        agent_data = kwargs.get("agent_data")
        extra = getattr(agent_data, "extra_fields", None)
        if isinstance(extra, dict):  # verl's agent loop: the trajectory is its agent_data
            key = extra.setdefault(TRAJECTORY, uuid.uuid4().hex)
            self._instances[instance_id] = (create_kwargs, key)
        trajectory = self._trajectory(key)
        if trajectory.infra_error:
            return ToolResponse(text=f"the sandbox was lost: {trajectory.infra_error}"), 0.0, {"infra_error": True}
        if trajectory.grade is not None:
            return ToolResponse(text="already submitted: the sandbox is graded"), 0.0, {"submitted": True}
        call = {**parameters, "tool": parameters.get("action", parameters.get("tool", ""))}
        session = None
        try:
            session = await self._session(key, trajectory, create_kwargs)
            obs = await tools.arun(session, call)
        except SandboxRPCError as e:  # the node's (the policy's own are observations): mask the trajectory
            lost = await tools.alost(session, e) if session is not None else None
            if lost is None:
                trajectory.infra_error = self.infra_error[key] = e.message
                return ToolResponse(text=f"the sandbox was lost: {e.message}"), 0.0, {"infra_error": True}
            obs = tools.Observation(f"the sandbox was lost: {e.message}", grade=lost)  # the episode killed it: reward 0
        if obs.grade is not None:  # submitted: graded, and the sandbox is done with
            trajectory.grade = obs.grade
            await self._close(trajectory)
        return ToolResponse(text=obs.text), 0.0, {"exit_code": obs.exit_code}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The trajectory's reward: its grade (graded now unless the model submitted); 0.0 with
        ``infra_error`` set when it cannot be graded."""
        found = self._instances.get(instance_id)
        key = found[1] if found else instance_id
        grade = await self.grade(key, found[0] if found else {})
        return float(grade.reward) if grade is not None and grade.reward is not None else 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """The end of an instance. One that is its own trajectory (no agent_data) ends the session;
        a call of an agent loop's trajectory leaves it to :meth:`finish`."""
        found = self._instances.pop(instance_id, None)
        if found is not None and found[1] == instance_id:
            await self.finish(instance_id, grade=False)

    async def grade(self, key: str, create_kwargs: Optional[Dict[str, Any]] = None) -> Optional[GradeResult]:
        """The trajectory's grade, graded now unless it was (a trajectory without a session: the
        untouched task's grade, in a session opened for it). None when it cannot be graded
        (``infra_error[key]`` says why)."""
        trajectory = self._trajectory(key)
        if trajectory.grade is None and not trajectory.infra_error:
            try:
                session = await self._session(key, trajectory, create_kwargs or {})
                trajectory.grade = await session.grade()
            except SandboxRPCError as e:
                trajectory.infra_error = e.message
        if trajectory.grade is not None and trajectory.grade.reward is None:
            trajectory.infra_error = trajectory.grade.message or trajectory.grade.status
        if trajectory.infra_error:
            self.infra_error[key] = trajectory.infra_error
            return None
        return trajectory.grade

    async def finish(
        self, key: str, create_kwargs: Optional[Dict[str, Any]] = None, *, grade: bool = True
    ) -> Optional[GradeResult]:
        """The end of a trajectory: its grade (``grade``; None when it cannot be graded), then its
        session closed."""
        result = await self.grade(key, create_kwargs) if grade else None
        trajectory = self._trajectories.pop(key, None)
        if trajectory is not None:
            await self._close(trajectory)
        return result

    @staticmethod
    async def _close(trajectory: _Trajectory) -> None:
        opening, trajectory.opening = trajectory.opening, None
        if opening is None:
            return
        try:
            session = await opening
        except Exception:  # it never opened: nothing to close
            return
        try:
            await session.close()
        except SandboxRPCError:
            pass  # gone already (a lost sandbox): its node ended it

    def _trajectory(self, key: str) -> _Trajectory:
        found = self._trajectories.get(key)
        if found is None:
            # Bounded: with verl's plain tool_agent loop nothing ends a trajectory here (its session
            # ends at the node's idle timeout; a submitted one at once). The oldest are forgotten.
            while len(self._trajectories) >= MAX_TRAJECTORIES:
                self._trajectories.pop(next(iter(self._trajectories)))  # its session: to its idle timeout
            while len(self.infra_error) >= MAX_TRAJECTORIES:
                self.infra_error.pop(next(iter(self.infra_error)))
            found = self._trajectories[key] = _Trajectory()
        return found

    async def _session(self, key: str, trajectory: _Trajectory, create_kwargs: Dict[str, Any]) -> AsyncSession:
        if trajectory.opening is None:
            trajectory.opening = asyncio.ensure_future(self._open(key, create_kwargs))
        try:
            return await asyncio.shield(trajectory.opening)
        except SandboxRPCError:
            trajectory.opening = None  # the next call tries again
            raise

    async def _open(self, key: str, create_kwargs: Dict[str, Any]) -> AsyncSession:
        labels = {**self.labels, "trajectory": key}
        task = create_kwargs.get("task")
        options: Dict[str, Any] = {"labels": labels, "idle_timeout": self.idle_timeout}
        if task is not None:
            return await self.client.create_session(task=task, **options)
        return await self.client.create_session(str(create_kwargs.get("pool") or self.config.get("pool", "")), **options)


if VERL:  # pragma: no cover - verl needs torch
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

    @register("rlsandbox_tool_agent")
    class SandboxToolAgentLoop(ToolAgentLoop):  # type: ignore[misc,valid-type]
        """verl's ``ToolAgentLoop``, whose trajectory's sandbox is graded and closed at its end."""

        async def run(self, sampling_params: Dict[str, Any], priority: int = 0, **kwargs: Any) -> AgentLoopOutput:
            self._rlsandbox_key = uuid.uuid4().hex
            tool = next((t for t in self.tools.values() if isinstance(t, SandboxTool)), None)
            create_kwargs = dict((((kwargs.get("tools_kwargs") or {}).get("sandbox") or {}).get("create_kwargs")) or {})
            try:
                output = await super().run(sampling_params, priority, **kwargs)
            except BaseException:
                if tool is not None:
                    await tool.finish(self._rlsandbox_key, grade=False)
                raise
            if tool is None:
                return output
            grade = await tool.finish(self._rlsandbox_key, create_kwargs)
            if grade is None:
                error = tool.infra_error.pop(self._rlsandbox_key, "no grade")
                output.reward_score = 0.0
                output.response_mask = [0] * len(output.response_mask)  # an infra error trains nothing
                output.extra_fields["rlsandbox"] = {"infra_error": error}
            else:
                output.reward_score = float(grade.reward if grade.reward is not None else 0.0)
                output.extra_fields["rlsandbox"] = tools.grade_record(grade)
            return output

        async def _call_tool(self, tool_call: Any, tools_kwargs: Dict[str, Any], agent_data: Any) -> Any:
            agent_data.extra_fields.setdefault(TRAJECTORY, self._rlsandbox_key)  # the key run() ends
            return await super()._call_tool(tool_call, tools_kwargs, agent_data)
