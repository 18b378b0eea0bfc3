"""What the clean room gets (pure, run in a worker thread): the agent's allowed changes over the
task's base workspace, the hidden tests and the test patch, and what was discarded and why."""

from __future__ import annotations

import tarfile
from dataclasses import dataclass

from rlsandbox.daemon.errors import FailedPrecondition
from rlsandbox.daemon.grading.patches import PatchError, apply_patch, patch_paths
from rlsandbox.daemon.grading.scan import scan
from rlsandbox.daemon.grading.shadowing import ImportFacts, Shadowing, command_files, command_paths
from rlsandbox.daemon.grading.task import Task
from rlsandbox.daemon.grading.workspace import Changes, Entry, Snapshot, changes_tar, plan, snapshot_from_archive


class TaskSetupFailed(FailedPrecondition):
    """The task's workspace or setup commands failed in a fresh sandbox: the task is broken."""


class AgentsMess(Exception):
    """The agent's workspace broke a limit of grading: reward the policy's minimum, never no reward."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.discarded: list[str] = []


@dataclass(frozen=True, slots=True)
class Planned:
    changes: Changes
    mine: Snapshot
    patch_targets: list[str]
    findings: list[str]
    tar: bytes


def plan_room(task: Task, facts: ImportFacts | None, base_archive: bytes, agent_archive: bytes) -> Planned:
    """What the clean room gets (pure; runs in a worker thread). Raises AgentsMess for what the
    agent's workspace makes impossible, TaskSetupFailed for a broken task."""
    ev = task.spec.evaluation
    ws = task.spec.workspace.path
    excluded = excluded_paths(task, facts)
    base = snapshot_from_archive(base_archive, excluded)  # the engine's archive of a fresh sandbox: a failure is infra
    try:
        mine = snapshot_from_archive(agent_archive, excluded)
    except (tarfile.TarError, OSError, ValueError) as e:
        raise AgentsMess(f"the grader cannot read the agent's workspace ({e}), though it reads the task's") from None
    # PATH as the command starts with it (the probe's: an image's ENV PATH too), else the task's.
    env = {**ev.env, "PATH": facts.path} if facts and facts.path else ev.env
    imports, execs = command_paths(ev.test_command, env, ws)
    shadow = Shadowing(facts.reserved if facts else frozenset(), frozenset(imports), frozenset(execs))
    patch_targets = patch_paths(ev.test_patch.encode()) if ev.test_patch else []
    hidden_paths = [*ev.hidden_tests, *patch_targets]
    # What the command runs as its program or runner script is the task's; of the folders on the
    # way, only those that are not folders in the task's workspace (a symlink in a folder's place).
    named = command_files(ev.test_command, ws)
    commanded = frozenset(p for p in named if not any(q.startswith(p + "/") for q in named) or _not_a_folder(base, p))
    changes = plan(
        base,
        mine,
        protected=ev.protected,
        test_files=ev.test_files,
        hidden=hidden_paths,
        shadow=shadow,
        kept=excluded,
        commanded=commanded,
    )
    findings = [f for p, e in changes.writes.items() if e.type == "file" for f in scan(p, file_data(base, p), e.data)]
    if ev.test_patch:
        try:
            apply_test_patch(ev.test_patch.encode(), base, changes)
        except AgentsMess as e:
            e.discarded = changes.discarded
            raise
    hidden = {p: c.encode() for p, c in ev.hidden_tests.items()}
    tar = changes_tar(changes.writes, hidden) if changes.writes or hidden else b""
    return Planned(changes, mine, patch_targets, findings, tar)


def excluded_paths(task: Task, facts: ImportFacts | None) -> list[str]:
    """What grading reads from no one: the task's excluded paths and the Python environments the
    probe found inside the workspace."""
    return facts.excluded(task.spec.workspace.exclude) if facts else task.spec.workspace.exclude


def _not_a_folder(base: Snapshot, path: str) -> bool:
    entry = base.entries.get(path)
    return entry is not None and entry.type != "dir"


def apply_test_patch(patch: bytes, base: Snapshot, changes: Changes) -> None:
    """Apply the task's test patch, with the grader's own code, over the planned changes.

    Raises:
        TaskSetupFailed: it does not apply to the task's base workspace (the task is broken).
        AgentsMess: it applies to the base but not over the agent's changes.
    """
    try:
        paths = patch_paths(patch)
        apply_patch(patch, {p: file_data(base, p) for p in paths})
    except PatchError as e:
        raise TaskSetupFailed(f"the test patch does not apply to the task's base workspace: {e}") from None
    current: dict[str, bytes | None] = {}
    for p in paths:
        entry = changes.writes.get(p)
        current[p] = entry.data if entry is not None and entry.type == "file" else file_data(base, p)
        if p in changes.deletes and entry is None:
            current[p] = None
    try:
        patched = apply_patch(patch, current)
    except PatchError as e:
        raise AgentsMess(f"the test patch no longer applies over the agent's changes: {e}") from None
    for p, (data, mode) in patched.items():
        if data is None:
            changes.writes.pop(p, None)
            if p not in changes.deletes and p in base.entries:
                changes.deletes.append(p)
            continue
        old = changes.writes.get(p) or base.entries.get(p)
        changes.writes[p] = Entry("file", mode if mode is not None else (old.mode if old else 0o644), data)


def file_data(snapshot: Snapshot, path: str) -> bytes | None:
    entry = snapshot.entries.get(path)
    return entry.data if entry is not None and entry.type == "file" else None
