"""A verl tool (``verl.tools.base_tool.BaseTool``'s interface) whose instance is an rlsandbox
session that lives across the tool calls of one trajectory.

In verl's tool config::

    tools:
      - class_name: rlsandbox.integrations.verl.SandboxTool
        config: {type: native, target: "127.0.0.1:7420", labels: {run: my-run}}
        tool_schema: null          # the tool's own schema (SandboxTool.SCHEMA) is used

and per sample, in ``extra_info.tools_kwargs.sandbox.create_kwargs``: ``{"task": <spec or ref>}``.
verl then calls ``create`` (a session from the task) at the trajectory's start, ``execute`` for
each call the model makes (``{"action": "bash"|"view"|"edit"|"write"|"submit", ...}``),
``calc_reward`` (the clean-room grade; an infra error is ``0.0`` with the instance's
``infra_error`` set, for the reward function to mask), and ``release`` (the session ends).

verl itself is not a dependency (it needs torch): the class subclasses verl's ``BaseTool`` when
verl is importable and follows the same interface otherwise (checked against that interface:
docs/INTEGRATIONS.md).
"""

from __future__ import annotations

import uuid
from typing import Any, Dict, Optional, Tuple

from rlsandbox.client import AsyncClient, AsyncSession, GradeResult, SandboxRPCError
from rlsandbox.integrations import tools

try:  # verl's base class when verl is installed; the same interface otherwise
    from verl.tools.base_tool import BaseTool as _Base
except ImportError:  # pragma: no cover - depends on the environment
    _Base = object

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


class SandboxTool(_Base):  # type: ignore[misc,valid-type]
    SCHEMA = SCHEMA

    def __init__(self, config: Optional[Dict[str, Any]] = None, tool_schema: Any = None) -> None:
        self.config = dict(config or {})
        self.tool_schema = tool_schema if tool_schema is not None else SCHEMA
        self.name = "sandbox"
        self.client = AsyncClient(
            str(self.config.get("target", "127.0.0.1:7420")), timeout=float(self.config.get("timeout", 120))
        )
        self.labels = {str(k): str(v) for k, v in dict(self.config.get("labels") or {}).items()}
        self._sessions: Dict[str, AsyncSession] = {}
        self._grades: Dict[str, GradeResult] = {}
        self.infra_error: Dict[str, str] = {}

    def get_openai_tool_schema(self) -> Any:
        return self.tool_schema

    async def create(self, instance_id: Optional[str] = None, **kwargs: Any) -> str:
        """A session for one trajectory: from ``task`` (spec or ref), or of ``pool``."""
        instance_id = instance_id or str(uuid.uuid4())
        labels = {**self.labels, "trajectory": instance_id}
        task = kwargs.get("task") or (kwargs.get("create_kwargs") or {}).get("task")
        if task is not None:
            session = await self.client.create_session(task=task, labels=labels)
        else:
            session = await self.client.create_session(str(kwargs.get("pool") or self.config.get("pool", "")), labels=labels)
        self._sessions[instance_id] = session
        return instance_id

    async def execute(self, instance_id: str, parameters: Dict[str, Any], **kwargs: Any) -> Tuple[str, float, Dict[str, Any]]:
        """One tool call: (the text the model reads next, a step reward of 0.0, metrics)."""
        session = self._sessions.get(instance_id)
        if session is None:
            return f"no sandbox for {instance_id}: call create first", 0.0, {"error": "no_instance"}
        call = {**parameters, "tool": parameters.get("action", parameters.get("tool", ""))}
        try:
            obs = await tools.arun(session, call)
        except SandboxRPCError as e:  # the node's (the policy's own are observations): mask the trajectory
            self.infra_error[instance_id] = e.message
            return f"the sandbox was lost: {e.message}", 0.0, {"infra_error": True}
        if obs.grade is not None:
            self._grades[instance_id] = obs.grade
        return obs.text, 0.0, {"exit_code": obs.exit_code}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The trajectory's reward: its grade (graded now unless the model submitted)."""
        grade = self._grades.get(instance_id)
        session = self._sessions.get(instance_id)
        if grade is None and session is not None and instance_id not in self.infra_error:
            grade = self._grades[instance_id] = await session.grade()
        if grade is None or grade.reward is None:
            self.infra_error.setdefault(instance_id, grade.message if grade else "no grade")
            return 0.0
        return float(grade.reward)

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        session = self._sessions.pop(instance_id, None)
        self._grades.pop(instance_id, None)
        if session is not None:
            await session.close()
