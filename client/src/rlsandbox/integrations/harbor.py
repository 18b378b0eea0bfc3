"""A harbor environment (``harbor.environments.base.BaseEnvironment``: async start, stop, exec,
upload and download) on an rlsandbox session, loadable by import path.

In a harbor job or trial config::

    environment:
      import_path: "rlsandbox.integrations.harbor:RlsandboxEnvironment"
      kwargs: {target: "127.0.0.1:7420", labels: {run: my-run}}

``start`` opens a session on the task's image: ``[environment] docker_image`` in task.toml, else
the image ``rlsandbox tasks import-harbor --build`` tagged from ``environment/`` (the same name,
computed by :func:`rlsandbox.integrations.harbor_tasks.harbor_image`), else the ``image`` kwarg. With ``task`` (a spec from
``rlsandbox tasks import-harbor``) the session starts from that task instead and
:meth:`RlsandboxEnvironment.grade` scores it in a clean room, out of the agent's reach; harbor's
own verifier runs in the agent's environment, where an agent can tamper with it.

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

harbor needs Python >= 3.12, so it is not installed in this repository's tests (Python 3.11):
the class follows harbor 0.26's ``BaseEnvironment`` source and subclasses it when harbor is
importable; without harbor it runs on a stand-in base with the few helpers it uses, which is how
start, exec, uploads and downloads are tested against a real daemon (docs/INTEGRATIONS.md).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Union

from rlsandbox.client import AsyncClient, AsyncSession, GradeResult
from rlsandbox.client import ExecResult as _RawResult
from rlsandbox.integrations import transfer
from rlsandbox.integrations.harbor_tasks import dockerfile_workdir, harbor_image, harbor_task_id, task_name
from rlsandbox.integrations.tools import outcome, session_options

try:  # harbor's base and result types when harbor is importable (Python >= 3.12)
    from harbor.environments.base import BaseEnvironment as _Base
    from harbor.environments.base import ExecResult
    from harbor.environments.capabilities import EnvironmentCapabilities

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
            self._validate_definition()

        def _validate_definition(self) -> None:
            raise NotImplementedError

        def _resolve_user(self, user: Union[str, int, None]) -> Union[str, int, None]:
            return user if user is not None else self.default_user

        def _merge_env(self, env: Optional[Dict[str, str]]) -> Optional[Dict[str, str]]:
            merged = {**self._persistent_env, **(env or {})}
            return merged or None


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
        labels: Optional[Mapping[str, str]] = None,
        idle_timeout: float = 0.0,
        public_network_as_none: bool = False,
        client: Optional[AsyncClient] = None,
        **kwargs: Any,
    ) -> None:
        # Set before the base's __init__: it validates the definition and reads the capabilities.
        self._target, self._pool, self._image, self._task = target, pool, image, task
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
        return await self.session.exec(argv, seq=self._seq, **options)

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
        """The session's grade by its task (``task=``), in a clean room: reward None is an infra error."""
        return await self.session.grade()


def _write(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
