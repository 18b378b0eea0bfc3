"""A verifiers environment whose rollouts are rlsandbox sessions: a ``vf.StatefulToolEnv``, the
classic stack that prime-rl trains with and SkyRL's verifiers path runs (``import verifiers as
vf``; verifiers >= 0.3 keeps it as ``verifiers.legacy``).

Load it by its module name, as any verifiers environment::

    env = vf.load_environment("rlsandbox.integrations.verifiers", target="127.0.0.1:7420",
                              tasks=[spec_or_task, ...], max_turns=20)

or, in a prime-rl orchestrator config, ``[[env]] id = "rlsandbox.integrations.verifiers"`` with
the same ``args``. Each rollout gets its own session from its example's task (a GRPO group is N
rollouts: N sessions), the model's tools are ``bash``, ``view``, ``edit`` and ``write`` in that
session (the session's id is injected, never shown to the model), the rollout ends when the model
answers without a tool call or at ``max_turns``, and the reward is the session's clean-room grade.

- Examples: ``tasks`` (specs as mappings or JSON, ``(spec, workspace_tar)`` pairs, ``Task``
  objects from ``load_tasks``, ``TaskRef``/``PrefetchInfo``) make the dataset, one row per task
  with the problem statement as the question; or pass a ``dataset`` whose rows carry
  ``info["task"]`` (a spec as JSON, or ``{"ref": ...}`` for a task pushed to the node's object
  store). Without tasks, ``pool=`` or ``image=`` gives ungraded sessions (reward 0.0).
- Infra errors are verifiers' ``vf.SandboxError``, as in verifiers' own ``SandboxEnv``: a session
  that cannot be made or a grade that could not score the work (``infra_error``,
  ``invalid_task``) set ``state["error"]``, which verifiers retries (``max_retries``); a sandbox
  lost mid-rollout stops the rollout in its tool call (``stop_errors``: ``ToolCallError`` chained
  from the ``SandboxError``). Either way the rollout carries an error, its reward 0.0 means
  nothing, and the trainer masks or drops it.
- Every session is closed when its rollout ends (``@vf.cleanup``), and any left when the
  environment is torn down (``@vf.teardown``).

Checked against verifiers 0.3.1 from PyPI, its own rollout loop and OpenAI client talking to a
scripted model server: docs/INTEGRATIONS.md.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import verifiers as vf
from datasets import Dataset
from rlsandbox.client import AsyncClient, AsyncSession, SandboxRPCError, TaskRef
from rlsandbox.integrations import tools
from rlsandbox.integrations.tools import session_options

SYSTEM_PROMPT = (
    "You work in a sandbox holding the task's repository. Use the tools to inspect and change it. "
    "When you are done, answer without calling a tool."
)
GRADE_KEY = "rlsandbox_grade"  # where a rollout's grade lands in its state (and its outputs)


class RlsandboxRubric(vf.Rubric):
    """The reward: the rollout's clean-room grade, taken when the rollout ended (0.0 ungraded or
    for an infra error, whose ``state["error"]`` says to drop the sample); ``resolved`` and
    ``tampering`` as metrics."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_reward_func(self.clean_room_reward)
        self.add_metric(self.resolved)
        self.add_metric(self.tampering)

    async def clean_room_reward(self, state: vf.State) -> float:
        grade = state.get(GRADE_KEY) or {}
        return float(grade.get("reward") or 0.0)

    async def resolved(self, state: vf.State) -> float:
        return float(bool((state.get(GRADE_KEY) or {}).get("resolved")))

    async def tampering(self, state: vf.State) -> float:
        return float(bool((state.get(GRADE_KEY) or {}).get("tampering")))


class RlsandboxEnv(vf.StatefulToolEnv):
    """Rollouts as rlsandbox sessions; see the module's docstring."""

    def __init__(
        self,
        *,
        target: str = "127.0.0.1:7420",
        tasks: Optional[Sequence[Any]] = None,
        pool: str = "",
        image: str = "",
        labels: Optional[Mapping[str, str]] = None,
        timeout_per_command_seconds: float = 120.0,
        client_timeout: float = 300.0,
        max_turns: int = 20,
        dataset: Any = None,
        system_prompt: Optional[str] = SYSTEM_PROMPT,
        **kwargs: Any,
    ) -> None:
        self.tasks: List[Any] = list(tasks or [])
        if dataset is None and not self.tasks:
            raise ValueError(
                "give tasks (a dataset is made of them), or a dataset whose rows carry info['task'] or use pool/image"
            )
        super().__init__(
            dataset=dataset if dataset is not None else task_dataset(self.tasks),
            system_prompt=system_prompt,
            rubric=RlsandboxRubric(),
            max_turns=max_turns,
            stop_errors=kwargs.pop("stop_errors", [vf.SandboxError]),
            **kwargs,
        )
        self.target = target
        self.pool = pool
        self.image = image
        self.labels = {str(k): str(v) for k, v in dict(labels or {}).items()}
        self.command_timeout = float(timeout_per_command_seconds)
        self.client_timeout = float(client_timeout)
        # One client per event loop (grpc.aio channels are bound to theirs); the loop is kept with
        # it, so its id cannot be reused by a new loop that would then get a dead loop's client.
        self._clients: Dict[int, Tuple[asyncio.AbstractEventLoop, AsyncClient]] = {}
        self._sessions: Dict[str, AsyncSession] = {}
        self._seq: Dict[str, int] = {}
        for tool in (self.bash, self.view, self.edit, self.write):
            self.add_tool(tool, args_to_skip=["session_id"])

    # -- the model's tools (their docstrings and signatures are what the model sees) -----------
    async def bash(self, command: str, session_id: str, timeout: int = 0) -> str:
        """Run a bash command in the sandbox and return its output and exit code.

        Args:
            command: the command line, run with bash in the repository.
            timeout: seconds before the command is killed (0: the environment's default).
        """
        call = {"tool": "bash", "command": command, "timeout": timeout or self.command_timeout}
        return await self._tool(session_id, call)

    async def view(self, path: str, session_id: str, start: int = 1, end: int = 0) -> str:
        """Show a file's lines, numbered.

        Args:
            path: the file (relative to the repository, or absolute).
            start: the first line to show (1-based).
            end: the last line to show (0: to the end, at most 400 lines).
        """
        return await self._tool(session_id, {"tool": "view", "path": path, "start": start, "end": end})

    async def edit(self, path: str, old: str, new: str, session_id: str) -> str:
        """Replace text in a file: `old` must occur exactly once.

        Args:
            path: the file to change.
            old: the exact text to replace (include enough context to make it unique).
            new: the text that replaces it.
        """
        return await self._tool(session_id, {"tool": "edit", "path": path, "old": old, "new": new})

    async def write(self, path: str, content: str, session_id: str) -> str:
        """Write a whole file (its folders are made).

        Args:
            path: the file to write.
            content: its new content.
        """
        return await self._tool(session_id, {"tool": "write", "path": path, "content": content})

    async def _tool(self, session_id: str, call: Dict[str, Any]) -> str:
        session = self._sessions.get(session_id)
        if session is None:
            raise vf.SandboxError(f"no rlsandbox session {session_id!r} in this environment (it has ended)")
        self._seq[session_id] = seq = self._seq.get(session_id, 0) + 1
        try:
            return (await tools.arun(session, call, timeout=self.command_timeout, seq=seq)).text
        except SandboxRPCError as e:  # the sandbox was lost or the node refused: not the policy's doing
            if e.fault:  # ... unless the episode killed its sandbox: graded at cleanup, reward 0
                return f"the sandbox was lost: {e.message}"
            raise vf.SandboxError(f"rlsandbox: {e}") from e

    # -- a rollout's session ------------------------------------------------------------------
    def update_tool_args(
        self, tool_name: str, tool_args: Dict[str, Any], messages: vf.Messages, state: vf.State, **kwargs: Any
    ) -> Dict[str, Any]:
        return {**tool_args, "session_id": state.get("sandbox_id", "")}

    async def setup_state(self, state: vf.State, **kwargs: Any) -> vf.State:
        task = self.example_task(state)
        labels = {**self.labels, "example_id": str(state.get("example_id", ""))}
        try:
            options = session_options(task=task, image=self.image if task is None else "", pool=self.pool, labels=labels)
            session = await self._client().create_session(self.pool if task is None else "", **options)
        except (SandboxRPCError, ValueError, TypeError) as e:
            raise vf.SandboxError(f"rlsandbox: no session for this rollout: {e}") from e
        self._sessions[session.id] = session
        state["sandbox_id"] = session.id
        state["rlsandbox_graded"] = task is not None
        return await super().setup_state(state, **kwargs)

    def example_task(self, state: vf.State) -> Any:
        """The task of a rollout's example: ``info["task_index"]`` into ``tasks``, or ``info["task"]``
        (a spec as JSON or a mapping, ``{"ref": ...}`` for a task by reference); None for an
        ungraded session of ``pool``/``image``."""
        info = state.get("info") or {}
        if isinstance(info, str):
            info = json.loads(info) if info.strip() else {}
        if info.get("task_index") is not None:
            return self.tasks[int(info["task_index"])]
        task = info.get("task")
        if isinstance(task, str):
            task = json.loads(task)
        if isinstance(task, Mapping) and set(task) == {"ref"}:
            return TaskRef(str(task["ref"]))
        return task

    @vf.cleanup
    async def grade_and_close(self, state: vf.State) -> None:
        """Grade the rollout's work in a clean room (unless it already failed), then end its session."""
        session_id = state.get("sandbox_id")
        session = self._sessions.pop(session_id, None) if session_id else None
        self._seq.pop(session_id or "", None)
        if session is None:
            return
        try:
            if state.get("rlsandbox_graded") and state.get("error") is None:
                try:
                    grade = await session.grade()
                except SandboxRPCError as e:
                    state["error"] = vf.SandboxError(f"rlsandbox: the grade failed: {e}")
                else:
                    state[GRADE_KEY] = tools.grade_record(grade)
                    if grade.reward is None:
                        state["error"] = vf.SandboxError(f"rlsandbox: not scored ({grade.status}): {grade.message}")
        finally:
            await self._close(session)

    @vf.teardown
    async def close_sessions(self) -> None:
        """End every session still open (rollouts cancelled mid-way), then the clients."""
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(self._close(s) for s in sessions))
        clients, self._clients = [c for _, c in self._clients.values()], {}
        for client in clients:
            try:
                await client.close()
            except RuntimeError:  # a client of another, closed event loop
                pass

    def _client(self) -> AsyncClient:
        loop = asyncio.get_running_loop()
        if id(loop) not in self._clients:
            self._clients[id(loop)] = (loop, AsyncClient(self.target, timeout=self.client_timeout))
        return self._clients[id(loop)][1]

    async def _close(self, session: AsyncSession) -> None:
        try:
            await session.close()
        except SandboxRPCError as e:  # the node went away: its reconciler removes the sandbox
            self.logger.warning("rlsandbox: could not close session %s: %s", session.id, e)


def task_dataset(tasks: Sequence[Any]) -> Dataset:
    """One row per task: its problem statement as the question, its index in ``info``."""
    rows = [
        {"question": tools.task_statement(t) or "Solve the task.", "answer": "", "info": {"task_index": i}}
        for i, t in enumerate(tasks)
    ]
    return Dataset.from_list(rows)


def load_environment(**kwargs: Any) -> RlsandboxEnv:
    """verifiers' entry point: ``vf.load_environment("rlsandbox.integrations.verifiers", **kwargs)``."""
    return RlsandboxEnv(**kwargs)
