"""A harbor environment (``harbor.environments.base.BaseEnvironment``: async start, stop, exec,
upload and download) on an rlsandbox session, loadable by import path.

In a harbor job or trial config::

    environment:
      import_path: "rlsandbox.integrations.harbor:RlsandboxEnvironment"
      kwargs: {target: "127.0.0.1:7420", tasks: /data/tasks.jsonl, labels: {run: my-run}}
    verifier:
      import_path: "rlsandbox.integrations.harbor:RlsandboxVerifier"

``start`` opens a session on the task's image: ``[environment] docker_image`` in task.toml, else
the image ``rlsandbox tasks import-harbor --build`` tagged from ``environment/`` (the same name,
computed by :func:`rlsandbox.integrations.harbor_tasks.harbor_image`), else the ``image`` kwarg. With ``task`` (a spec from
``rlsandbox tasks import-harbor``) or ``tasks`` (the path of its JSONL output: each trial finds its
own task by folder) the session starts from that task instead and
:meth:`RlsandboxEnvironment.grade` scores it in a clean room, out of the agent's reach; harbor's
own verifier runs in the agent's environment, where an agent can tamper with it. ``start`` makes
harbor's output folders (``/logs/agent``, ``/logs/verifier``, ``/logs/artifacts``) as harbor's
remote environments do.

- ``exec`` runs ``bash -c`` in the session (``cwd`` default: the task's workdir) and returns
  harbor's ``ExecResult``; a timed-out command returns 124, a killed one ``128 + signal``. A
  ``user`` (or the environment's ``default_user``) other than root goes through ``runuser -u``,
  which only a root session can do. Without ``timeout_sec`` the node's default applies (300 s
  unless configured). Each call carries a step number, so a call the client retries after a lost
  connection never runs twice.
- Sandboxes have no network: the environment declares ``disable_internet`` and refuses a task
  whose network policy is public or an allowlist, unless ``public_network_as_none=True`` (its
  commands then find no network). Docker Compose environments and GPUs are not supported.
- Uploads are a tar through a command's stdin (modes and symlinks kept, up to 64 MiB a call);
  ``download_dir`` writes only the regular files of the sandbox's tar inside the target folder
  (the sandbox is untrusted).
- ``stop(delete=True)`` ends the session; ``stop(delete=False)`` leaves it to its idle timeout.

harbor needs Python >= 3.12: this repository's tests run harbor 0.26 itself on Python 3.13 in a
container (``harbor trials start`` with this environment and :class:`RlsandboxVerifier` by import
path). Without harbor (Python 3.11) the class runs on a stand-in base with the few helpers it uses.

:class:`RlsandboxVerifier` (``verifier: import_path``) makes harbor's verifier step the session's
clean-room grade; harbor's own verifier runs the tests in the agent's environment, where the
agent's changes (an interpreter first on ``PATH``, say) can decide the reward.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Union

from rlsandbox.client import AsyncClient, AsyncSession, GradeResult, SandboxRPCError
from rlsandbox.client import ExecResult as _RawResult
from rlsandbox.integrations import tools, transfer
from rlsandbox.integrations.harbor_tasks import dockerfile_workdir, harbor_image, harbor_task_id, task_name
from rlsandbox.integrations.tools import grade_record, outcome, session_options, task_from_file

try:  # harbor's base and result types when harbor is importable (Python >= 3.12)
    from harbor.environments.base import BaseEnvironment as _Base
    from harbor.environments.base import ExecResult
    from harbor.environments.capabilities import EnvironmentCapabilities
    from harbor.models.task.config import VerifierEnvironmentMode
    from harbor.models.task.verifier_mode import resolve_step_verifier_mode, resolve_task_verifier_mode
    from harbor.models.verifier.result import VerifierResult
    from harbor.verifier.base import BaseVerifier as _BaseVerifier

    HARBOR = True
except (ImportError, SyntaxError):  # pragma: no cover - depends on the environment
    HARBOR = False

    @dataclass
    class ExecResult:  # type: ignore[no-redef]
        """harbor's ``ExecResult`` fields."""

        stdout: Optional[str] = None
        stderr: Optional[str] = None
        return_code: int = 0

    class _Base:  # type: ignore[no-redef]
        """The part of harbor's ``BaseEnvironment`` this adapter relies on."""

        def __init__(
            self,
            environment_dir: Path,
            environment_name: str,
            session_id: str,
            trial_paths: Any,
            task_env_config: Any,
            logger: Optional[logging.Logger] = None,
            persistent_env: Optional[Dict[str, str]] = None,
            network_policy: Any = None,
            auto_mounts: Optional[List[Dict[str, Any]]] = None,
            **kwargs: Any,
        ) -> None:
            self.environment_dir = Path(environment_dir)
            self.environment_name = environment_name
            self.session_id = session_id
            self.trial_paths = trial_paths
            self.task_env_config = task_env_config
            self.default_user: Union[str, int, None] = None
            self.logger = (logger or logging.getLogger("harbor")).getChild(__name__)
            self._persistent_env = dict(persistent_env or {})
            self.network_policy = network_policy
            self._mounts = list(auto_mounts or [])  # harbor's trial passes /logs/{agent,verifier,artifacts}
            self._validate_definition()

        def _validate_definition(self) -> None:
            raise NotImplementedError

        def _resolve_user(self, user: Union[str, int, None]) -> Union[str, int, None]:
            return user if user is not None else self.default_user

        def _merge_env(self, env: Optional[Dict[str, str]]) -> Optional[Dict[str, str]]:
            merged = {**self._persistent_env, **(env or {})}
            return merged or None

        def _mount_targets(self, *, writable_only: bool = False) -> List[str]:
            return [m["target"] for m in self._mounts if not (writable_only and m.get("read_only"))]

        async def ensure_dirs(self, dirs: List[str], *, chmod: bool = True) -> Optional[ExecResult]:
            if not dirs:
                return None
            quoted = " ".join(shlex.quote(str(d)) for d in dirs)
            command = f"mkdir -p {quoted}" + (f" && chmod 777 {quoted}" if chmod else "")
            return await self.exec(command, user="root" if chmod else None)  # type: ignore[attr-defined,no-any-return]


def _network_mode(policy: Any) -> str:
    mode = getattr(policy, "network_mode", None)
    return str(getattr(mode, "value", mode) or "public") if policy is not None else "public"


class RlsandboxEnvironment(_Base):  # type: ignore[misc,valid-type]
    def __init__(
        self,
        *args: Any,
        target: str = "127.0.0.1:7420",
        pool: str = "",
        image: str = "",
        task: Any = None,
        tasks: str = "",
        labels: Optional[Mapping[str, str]] = None,
        idle_timeout: float = 0.0,
        public_network_as_none: bool = False,
        client: Optional[AsyncClient] = None,
        **kwargs: Any,
    ) -> None:
        # Set before the base's __init__: it validates the definition and reads the capabilities.
        self._target, self._pool, self._image, self._task, self._tasks = target, pool, image, task, tasks
        self._labels = {str(k): str(v) for k, v in dict(labels or {}).items()}
        self._idle_timeout = idle_timeout
        self._public_as_none = public_network_as_none
        self._client = client
        self._own_client = client is None
        self._session: Optional[AsyncSession] = None
        self._seq = 0
        super().__init__(*args, **kwargs)
        mode = _network_mode(self.network_policy)
        if mode != "no-network" and not self._public_as_none:
            raise ValueError(
                f"rlsandbox sandboxes have no network, and this task's network mode is {mode!r}: set "
                "[environment] network_mode = 'no-network' in its task.toml, or pass the environment kwarg "
                "public_network_as_none=true to run it without network anyway"
            )

    @staticmethod
    def type() -> str:
        return "rlsandbox"

    if HARBOR:  # pragma: no cover - harbor needs Python >= 3.12

        @property
        def capabilities(self) -> EnvironmentCapabilities:
            return EnvironmentCapabilities(disable_internet=True)

    def _validate_definition(self) -> None:
        if self._task is None and self._tasks:  # this trial's task in import-harbor's JSONL
            folder = Path(self.environment_dir).parent
            self._task = task_from_file(self._tasks, harbor_task_id(folder, task_name(folder)))
        if (self.environment_dir / "docker-compose.yaml").is_file() and self._task is None and not self._image:
            raise ValueError("rlsandbox runs one container per environment: Docker Compose environments are not supported")
        if self._task is None and not self._image and not self._pool and not self._task_image():
            raise FileNotFoundError(
                f"{self.environment_dir}: no image for rlsandbox: set [environment] docker_image in task.toml, "
                "add environment/Dockerfile (built by 'rlsandbox tasks import-harbor --build'), or pass image="
            )

    def _task_image(self) -> str:
        docker_image = getattr(self.task_env_config, "docker_image", None)
        if docker_image:
            return str(docker_image)
        if (self.environment_dir / "Dockerfile").is_file():
            folder = self.environment_dir.parent
            return harbor_image(folder, harbor_task_id(folder, task_name(folder)))
        return ""

    def _workdir(self) -> str:
        """The task's workdir, else the one its Dockerfile leaves (harbor runs commands there)."""
        workdir = getattr(self.task_env_config, "workdir", None)
        if workdir:
            return str(workdir)
        dockerfile = self.environment_dir / "Dockerfile"
        return dockerfile_workdir(dockerfile.read_text()) if dockerfile.is_file() else ""

    @property
    def session(self) -> AsyncSession:
        if self._session is None:
            raise RuntimeError("the rlsandbox environment is not started: call start() first")
        return self._session

    async def start(self, force_build: bool) -> None:
        if self._client is None:
            self._client = AsyncClient(self._target)
        image = "" if self._task is not None or self._pool else (self._image or self._task_image())
        options = session_options(
            image=image,
            pool=self._pool,
            task=self._task,
            labels={"harbor_session": self.session_id, **self._labels},
            workdir="" if self._task is not None else self._workdir(),
        )
        if self._idle_timeout:
            options["idle_timeout"] = self._idle_timeout
        self._session = await self._client.create_session(self._pool, **options)
        self.logger.debug("rlsandbox session %s for %s", self._session.id, self.session_id)
        # What harbor's trial collects from (/logs/agent, /logs/verifier, /logs/artifacts): a
        # mounted environment has them as mounts; here they are folders, as in harbor's e2b one.
        made = await self.ensure_dirs(self._mount_targets(writable_only=True))
        if made is not None and made.return_code != 0:
            raise RuntimeError(f"rlsandbox session {self._session.id}: could not create harbor's log folders: {made.stderr}")
        upload = getattr(self, "_upload_environment_dir_after_start", None)
        if upload is not None:  # harbor's: environment/ into the workdir, for prebuilt-image tasks
            await upload()

    async def stop(self, delete: bool) -> None:
        session, self._session = self._session, None
        try:
            if session is not None and delete:
                await session.close()
        finally:
            if self._own_client and self._client is not None:
                await self._client.close()
                self._client = None

    async def exec(
        self,
        command: str,
        cwd: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        timeout_sec: Optional[int] = None,
        user: Union[str, int, None] = None,
    ) -> ExecResult:
        user = self._resolve_user(user)
        argv = ["bash", "-c", command]
        if user is not None and str(user) not in ("root", "0"):
            argv = ["runuser", "-u", str(user), "--", *argv]
        code, out, err = outcome(
            await self._step(argv, cwd=cwd or "", env=self._merge_env(env) or {}, timeout=float(timeout_sec or 0))
        )
        return ExecResult(stdout=out, stderr=err, return_code=code)

    async def _step(self, argv: List[str], **options: Any) -> _RawResult:
        self._seq += 1
        try:
            return await self.session.exec(argv, seq=self._seq, **options)
        except SandboxRPCError as e:
            died = tools.died(e)  # the episode killed its sandbox: a failed command, graded 0 later
            if died is None:
                raise
            return died

    async def _checked(self, argv: List[str], what: str, **options: Any) -> _RawResult:
        result = await self._step(argv, **options)
        if not result.ok:
            raise RuntimeError(f"{what} failed in rlsandbox session {self.session.id}: {result.stderr_text[-600:]}")
        return result

    async def upload_file(self, source_path: Union[Path, str], target_path: str) -> None:
        argv, data = await asyncio.to_thread(transfer.upload, source_path, target_path)
        await self._checked(argv, f"upload of {source_path} to {target_path}", stdin=data)

    async def upload_dir(self, source_dir: Union[Path, str], target_dir: str) -> None:
        await self.upload_file(source_dir, target_dir)

    async def download_file(self, source_path: str, target_path: Union[Path, str]) -> None:
        found = (await self.session.read_files([source_path], max_bytes=transfer.MAX_TRANSFER)).get(source_path)
        if found is None or found.error:
            raise FileNotFoundError(
                f"{source_path} in rlsandbox session {self.session.id}: {found.error if found else 'not found'}"
            )
        if found.truncated:
            raise ValueError(f"{source_path} is over {transfer.MAX_TRANSFER} bytes: too large for one download")
        await asyncio.to_thread(_write, Path(target_path), found.data)

    async def download_dir(self, source_dir: str, target_dir: Union[Path, str]) -> None:
        result = await self._checked(transfer.download(source_dir), f"download of {source_dir}", stdout_cap=transfer.MAX_TRANSFER)
        await asyncio.to_thread(transfer.downloaded, result, source_dir, target_dir)

    async def grade(self) -> GradeResult:
        """The session's grade by its task (``task=`` or ``tasks=``), in a clean room: reward None
        is an infra error."""
        if self._task is None:
            raise ValueError(
                "this rlsandbox environment has no task to grade by: pass the environment kwarg tasks= "
                "(the JSONL of 'rlsandbox tasks import-harbor') or task="
            )
        return await self.session.grade()


async def clean_room_rewards(environment: Any, verifier_dir: Optional[Path]) -> Dict[str, float]:
    """harbor's rewards for a trial from the rlsandbox clean room's grade of its environment, with
    the grade (``grade.json``) and the tests' output (``test-output.log``) in ``verifier_dir``.
    An infra error or invalid task (no reward: not the agent's doing) raises."""
    if not isinstance(environment, RlsandboxEnvironment):
        raise TypeError(
            f"the rlsandbox verifier grades rlsandbox environments, not {type(environment).__name__}: "
            "set environment import_path to rlsandbox.integrations.harbor:RlsandboxEnvironment"
        )
    grade = await environment.grade()
    if verifier_dir is not None:
        await asyncio.to_thread(_write, Path(verifier_dir) / "grade.json", json.dumps(grade_record(grade), indent=1).encode())
        await asyncio.to_thread(_write, Path(verifier_dir) / "test-output.log", grade.log)
    if grade.reward is None:
        raise RuntimeError(f"rlsandbox could not grade session {grade.session_id} ({grade.status}): {grade.message}")
    return {"reward": grade.reward}


if HARBOR:  # pragma: no cover - harbor needs Python >= 3.12

    class RlsandboxVerifier(_BaseVerifier):  # type: ignore[misc,valid-type]
        """harbor's verifier step run as an rlsandbox clean-room grade (``verifier: import_path:
        rlsandbox.integrations.harbor:RlsandboxVerifier``): the task's tests run in a fresh
        sandbox on the agent's changes, where nothing the agent left can touch them or the reward.
        The environment must be an ``RlsandboxEnvironment`` with its task (``tasks=``)."""

        async def verify(self) -> VerifierResult:
            if self.step_name is not None:
                # The clean room runs the task's tests (what import-harbor took from tests/); a
                # step's own tests are not among them.
                raise ValueError(
                    f"task {self.task.name}: step {self.step_name!r} has tests of its own, and the rlsandbox "
                    "verifier grades by the task's top-level tests only: use harbor's verifier for multi-step tasks"
                )
            if self._separate():
                # harbor hands a separate verifier environment of its own, not the agent's: a
                # grade there would score the untouched task.
                raise ValueError(
                    f"task {self.task.name}: its verifier runs in a separate environment, where the "
                    "rlsandbox verifier would grade a sandbox the agent never touched; it grades the agent's "
                    "own session in a clean room already: set [verifier] environment_mode = 'shared'"
                )
            return VerifierResult(rewards=await clean_room_rewards(self.environment, self.trial_paths.verifier_dir))

        def _separate(self) -> bool:
            config = self.task.config
            step = next((s for s in config.steps or [] if s.name == self.step_name), None)
            mode = resolve_step_verifier_mode(config, step) if step is not None else resolve_task_verifier_mode(config)
            return bool(mode == VerifierEnvironmentMode.SEPARATE)


def _write(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
