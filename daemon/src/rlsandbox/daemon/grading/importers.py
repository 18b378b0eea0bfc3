"""Importers: tasks from datasets as they are published (SWE-bench-style JSONL today)."""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Mapping
from typing import Any

from rlsandbox.daemon.grading.task import TEST_FOLDER, EvaluationSpec, TaskError, TaskSpec, WorkspaceSpec


# -- SWE-bench ------------------------------------------------------------------------------------
def _id_list(value: Any, field: str, instance_id: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise TaskError(f"{instance_id}: {field} is a string but not a JSON list") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TaskError(f"{instance_id}: {field} must be a list of test ids")
    return list(value)


def patch_files(patch: str) -> list[str]:
    """The files a unified diff touches (its ``+++ b/...`` lines; deleted files by their ``---``)."""
    files: list[str] = []
    old = ""
    for line in patch.splitlines():
        if line.startswith("--- "):
            old = line[4:].split("\t")[0]
        elif line.startswith("+++ "):
            new = line[4:].split("\t")[0]
            name = new if new != "/dev/null" else old
            name = name[2:] if name.startswith(("a/", "b/")) else name
            if name not in files:
                files.append(name)
    return files


def folder_globs_of_tests(test_files: list[str]) -> list[str]:
    """``folder/**`` for each folder of ``test_files`` named like a test folder: its __init__.py,
    conftest files, helpers and data belong to the tests (the grader also finds these itself)."""
    folders = {posixpath.dirname(f) for f in test_files if posixpath.dirname(f)}
    named = sorted(f for f in folders if TEST_FOLDER.search(posixpath.basename(f)))
    return [f"{f}/**" for f in named if not any(f.startswith(g + "/") for g in named)]


def from_swebench(
    instance: Mapping[str, Any],
    *,
    pool: str = "",
    image: str = "",
    workspace_path: str = "/testbed",
    test_command: str = "python -m pytest -rA -p no:cacheprovider {test_files}",
    env: Mapping[str, str] | None = None,
    workspace_tar: str | None = None,
) -> TaskSpec:
    """A task from a SWE-bench-style instance (instance_id, repo, base_commit, patch, test_patch,
    FAIL_TO_PASS / PASS_TO_PASS as lists or JSON strings). The repository is expected in the pool's
    image at ``workspace_path``, checked out at ``base_commit``; or, with ``workspace_tar`` (a
    tarball path relative to the task file), it is copied in. ``env`` is the test command's
    environment (``PYTHONPATH=...``). The protected test set is the patch's test files and the
    test folders that hold them.

    ``image`` instead of ``pool``: each instance runs in its own image (a pool made on demand, see
    :func:`instance_image` for the template)."""
    iid = str(instance.get("instance_id") or "")
    if not iid:
        raise TaskError("SWE-bench instance without instance_id")
    for key in ("test_patch", "FAIL_TO_PASS"):
        if not instance.get(key):
            raise TaskError(f"{iid}: missing {key}")
    test_patch = str(instance["test_patch"])
    test_files = patch_files(test_patch)
    workspace = (
        WorkspaceSpec(path=workspace_path, source="bundle", tar=workspace_tar, git="reset")
        if workspace_tar
        else WorkspaceSpec(path=workspace_path, source="image", git="reset")
    )
    return TaskSpec(
        id=iid,
        pool=pool,
        image=instance_image(instance, image) if image else "",
        problem_statement=str(instance.get("problem_statement", "")),
        workspace=workspace,
        evaluation=EvaluationSpec(
            test_command=test_command.replace("{test_files}", " ".join(shlex.quote(f) for f in test_files)),
            report_format="pytest",
            env=dict(env or {}),
            test_patch=test_patch,
            test_files=[*test_files, *folder_globs_of_tests(test_files)],
            fail_to_pass=_id_list(instance.get("FAIL_TO_PASS"), "FAIL_TO_PASS", iid),
            pass_to_pass=_id_list(instance.get("PASS_TO_PASS"), "PASS_TO_PASS", iid),
        ),
        gold_patch=str(instance["patch"]) if instance.get("patch") else None,
        metadata={k: instance[k] for k in ("repo", "base_commit", "version", "created_at") if k in instance},
    )


# Fields that name an instance's own image in the published variants (R2E-Gym, SWE-smith, SWE-Gym).
IMAGE_FIELDS = ("image_name", "docker_image", "image")


def instance_image(instance: Mapping[str, Any], template: str) -> str:
    """The image of one instance: ``template`` with ``{instance_id}`` and ``{docker_id}`` (SWE-bench's
    image naming: ``__`` becomes ``_1776_``, lower case) filled in; or, with the template
    ``field``, the instance's own image field (``image_name``, ``docker_image`` or ``image``)."""
    iid = str(instance.get("instance_id") or "")
    if template == "field":
        for name in IMAGE_FIELDS:
            if instance.get(name):
                return str(instance[name])
        raise TaskError(f"{iid}: no image field ({', '.join(IMAGE_FIELDS)}) in the instance")
    try:
        return template.format(instance_id=iid, docker_id=iid.replace("__", "_1776_").lower())
    except (KeyError, IndexError, ValueError) as e:
        raise TaskError(f"image template {template!r}: {e} (use {{instance_id}} or {{docker_id}}, or 'field')") from None
