"""A Gymnasium ``Env`` whose episodes are rlsandbox sessions.

    from rlsandbox.integrations.gymnasium import SandboxEnv

    env = SandboxEnv("127.0.0.1:7420", tasks=[task_dict, ...], max_steps=30)
    obs, info = env.reset(seed=0)            # a session from a task; obs: the problem statement
    obs, reward, terminated, truncated, info = env.step("pytest -q")
    obs, reward, terminated, truncated, info = env.step('{"tool": "submit"}')  # graded: reward
    env.close()

Observations and actions are text. An action is a bash command, or a tool call as JSON
(``{"tool": "view" | "edit" | "write" | "bash" | "submit", ...}``: rlsandbox.integrations.tools).
The reward is 0.0 until ``submit`` grades the session in a clean room (``terminated``); at
``max_steps`` the episode is ``truncated`` and graded too, so a trainer has the reward either way.
An infrastructure failure (the grade's ``infra_error``, or the sandbox lost) is not a reward: the
step returns 0.0 with ``info["infra_error"]`` set, which a trainer must mask (drop the sample).
A sandbox the episode killed itself (out of memory at its limit) is the episode's doing: the step
ends the episode graded, reward 0, the cause in ``info["grade"].limits``.
Registered as ``rlsandbox/Sandbox-v0``: ``gymnasium.make("rlsandbox/Sandbox-v0", target=..., tasks=...)``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import gymnasium
from gymnasium import spaces
from rlsandbox.client import Client, SandboxRPCError, Session
from rlsandbox.integrations import tools

MAX_TEXT = 1 << 20


class AnyText(spaces.Text):
    """Text of any characters (command output is not a fixed alphabet), at most ``max_length``."""

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


class SandboxEnv(gymnasium.Env):  # type: ignore[type-arg]
    """One rlsandbox session per episode. ``tasks``: task specs (dicts as in docs/task.schema.json,
    with their workspace) or ``PrefetchInfo`` refs, picked by the episode's RNG unless ``reset``
    gets ``options={"task": index}``; without tasks, a session of ``pool`` (no reward)."""

    metadata = {"render_modes": []}  # noqa: RUF012 - Gymnasium's own class attribute

    def __init__(
        self,
        target: str = "127.0.0.1:7420",
        *,
        tasks: Optional[Sequence[Any]] = None,
        pool: str = "",
        max_steps: int = 50,
        step_timeout: float = 120.0,
        labels: Optional[Dict[str, str]] = None,
        client: Optional[Client] = None,
    ) -> None:
        if not tasks and not pool:
            raise ValueError("give tasks (to grade episodes) or a pool")
        self.tasks: List[Any] = list(tasks or [])
        self.pool = pool
        self.max_steps = max_steps
        self.step_timeout = step_timeout
        self.labels = dict(labels or {})
        self._own_client = client is None
        self.client = client or Client(target)
        self.observation_space = AnyText(MAX_TEXT, min_length=0)
        self.action_space = AnyText(MAX_TEXT, min_length=1)
        self.session: Optional[Session] = None
        self.steps = 0
        self.task_index: Optional[int] = None

    def reset(self, *, seed: Optional[int] = None, options: Optional[Dict[str, Any]] = None) -> Tuple[str, Dict[str, Any]]:
        super().reset(seed=seed)
        self._end()
        self.steps = 0
        options = options or {}
        if self.tasks:
            index = options.get("task")
            self.task_index = int(index) if index is not None else int(self.np_random.integers(len(self.tasks)))
            task = self.tasks[self.task_index]
            self.session = self.client.create_session(task=task, labels=self.labels)
            statement = tools.task_statement(task)
        else:
            self.task_index = None
            self.session = self.client.create_session(self.pool, labels=self.labels)
            statement = ""
        info = {"session_id": self.session.id, "task_id": self.session.info.task_id, "workdir": self.session.info.workdir}
        return statement, info

    def step(self, action: Any) -> Tuple[str, float, bool, bool, Dict[str, Any]]:
        if self.session is None:
            raise RuntimeError("call reset() before step()")
        self.steps += 1
        # The session's id is in reset()'s info: a step's info is a function of the episode's actions.
        info: Dict[str, Any] = {"step": self.steps}
        truncated = False
        try:
            obs = tools.run(self.session, action, timeout=self.step_timeout)
            if obs.grade is None and self.steps >= self.max_steps and self.tasks:
                truncated = True
                obs = tools.Observation(obs.text + f"\n[step limit {self.max_steps} reached: graded]", grade=self.session.grade())
        except SandboxRPCError as e:  # the node's (the policy's own are observations): not the policy's score
            lost = tools.lost(self.session, e)  # ... unless the episode killed its sandbox: reward 0
            if lost is None:
                info["infra_error"] = e.message
                self._end()
                return f"the sandbox was lost: {e.message}", 0.0, True, False, info
            obs = tools.Observation(f"the sandbox was lost: {e.message}", grade=lost)
        if obs.grade is None:
            info["exit_code"] = obs.exit_code
            return obs.text, 0.0, False, truncated, info
        grade = obs.grade
        info.update(grade=grade, status=grade.status, resolved=grade.resolved, tampering=grade.tampering)
        if grade.reward is None:  # infra_error / invalid_task: mask it
            info["infra_error"] = f"{grade.status}: {grade.message}"
        self._end()
        return obs.text, float(grade.reward or 0.0), not truncated, truncated, info

    def close(self) -> None:
        self._end()
        if self._own_client:
            self.client.close()

    def _end(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            try:
                session.close()
            except SandboxRPCError:  # the node is gone: its reconciler removes the sandbox
                pass


gymnasium.register(id="rlsandbox/Sandbox-v0", entry_point="rlsandbox.integrations.gymnasium:SandboxEnv", disable_env_checker=True)
