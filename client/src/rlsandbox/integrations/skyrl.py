"""A SkyRL-gym ``BaseTextEnv`` on an rlsandbox session (SkyRL runs its envs from a thread pool:
the blocking client is used).

    import rlsandbox.integrations.skyrl  # registers "rlsandbox"
    env = skyrl_gym.make("rlsandbox", env_config={"target": "127.0.0.1:7420"},
                         extras={"task": spec, "max_turns": 10})
    prompt, info = env.init([{"role": "user", "content": "..."}])   # a session from the task
    out = env.step("<bash>pytest -q</bash>")   # {"observations", "reward", "done", "metadata"}
    out = env.step("<submit/>")                # graded: reward, done
    env.close()

An action is the model's text: a tool call in tags (``<bash>...</bash>``, ``<view path="..."/>``,
``<submit/>``), or a JSON tool call (rlsandbox.integrations.tools). Text without a tool call is
answered with how to make one. The reward is the clean-room grade at ``<submit/>`` or at
``max_turns``; an infra error is ``metadata["infra_error"]`` with reward 0.0: drop that sample. A
sandbox the episode killed itself (out of memory) is graded reward 0 instead, never masked.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

from rlsandbox.client import Client, SandboxRPCError, Session
from rlsandbox.integrations import tools
from skyrl_gym import register
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

ConversationType = List[Dict[str, str]]
_BASH = re.compile(r"<bash>(.*?)</bash>", re.DOTALL)
_VIEW = re.compile(r"""<view\s+path=["']([^"']+)["']\s*/?>""")
_SUBMIT = re.compile(r"<submit\s*/?>")
HOW = 'No tool call found. Use <bash>command</bash>, <view path="file"/>, or <submit/> when done.'


def parse_action(action: str) -> Optional[tools.ToolCall]:
    """The tool call in a model's text, or None."""
    stripped = action.strip()
    if stripped.startswith("{"):
        call = tools.parse(stripped)
        if call.get("tool") != "bash" or call.get("command") != stripped:
            return call
    if _SUBMIT.search(action):
        return {"tool": "submit"}
    m = _BASH.search(action)
    if m:
        return {"tool": "bash", "command": m.group(1).strip()}
    m = _VIEW.search(action)
    if m:
        return {"tool": "view", "path": m.group(1)}
    return None


class RlsandboxTextEnv(BaseTextEnv):  # type: ignore[misc]
    def __init__(self, env_config: Any = None, extras: Optional[Dict[str, Any]] = None) -> None:
        super().__init__()
        config = dict(env_config or {})
        extras = dict(extras or {})
        self.target = str(config.get("target", "127.0.0.1:7420"))
        self.task = extras.get("task")
        self.pool = str(extras.get("pool", config.get("pool", "")))
        if self.task is None and not self.pool:
            raise ValueError("extras needs a task (to grade the episode) or a pool")
        self.max_turns = int(extras.get("max_turns") or config.get("max_turns") or 10)
        self.labels = {str(k): str(v) for k, v in dict(config.get("labels") or {}).items()}
        self.step_timeout = float(config.get("step_timeout", 120.0))
        self.client: Optional[Client] = None
        self.session: Optional[Session] = None
        self.grade: Any = None

    def init(self, prompt: ConversationType) -> Tuple[ConversationType, Dict[str, Any]]:
        self.client = Client(self.target)
        if self.task is not None:
            self.session = self.client.create_session(task=self.task, labels=self.labels)
        else:
            self.session = self.client.create_session(self.pool, labels=self.labels)
        return prompt, {"session_id": self.session.id, "workdir": self.session.info.workdir}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if self.session is None:
            raise RuntimeError("call init() before step()")
        self.turns += 1
        metadata: Dict[str, Any] = {"turn": self.turns}
        call = parse_action(action)
        try:
            obs = tools.run(self.session, call, timeout=self.step_timeout) if call is not None else tools.Observation(HOW)
            if obs.grade is None and self.turns >= self.max_turns and self.task is not None:
                obs = tools.Observation(obs.text + f"\n[turn limit {self.max_turns} reached: graded]", grade=self.session.grade())
        except SandboxRPCError as e:  # the node's (the policy's own are observations): not the policy's score
            lost = tools.lost(self.session, e)  # ... unless the episode killed its sandbox: reward 0
            if lost is None:
                metadata["infra_error"] = e.message
                self._end()
                return BaseTextEnvStepOutput(observations=[], reward=0.0, done=True, metadata=metadata)
            obs = tools.Observation(f"the sandbox was lost: {e.message}", grade=lost)
        done = obs.grade is not None or self.turns >= self.max_turns
        reward = 0.0
        if obs.grade is not None:
            self.grade = obs.grade
            metadata.update(status=obs.grade.status, resolved=obs.grade.resolved, tampering=obs.grade.tampering)
            if obs.grade.reward is None:
                metadata["infra_error"] = f"{obs.grade.status}: {obs.grade.message}"
            reward = float(obs.grade.reward or 0.0)
        if done:
            self._end()
        observations = [] if done else [{"role": "user", "content": obs.text}]
        return BaseTextEnvStepOutput(observations=observations, reward=reward, done=done, metadata=metadata)

    def get_metrics(self) -> Dict[str, Any]:
        g = self.grade
        return {"turns": self.turns, "resolved": float(bool(g and g.resolved)), "graded": float(g is not None)}

    def close(self) -> None:
        self._end()
        if self.client is not None:
            self.client.close()
            self.client = None

    def _end(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            try:
                session.close()
            except SandboxRPCError:  # the node is gone: its reconciler removes the sandbox
                pass


register(id="rlsandbox", entry_point="rlsandbox.integrations.skyrl:RlsandboxTextEnv")
