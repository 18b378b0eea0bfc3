"""Harbor / Terminal-Bench task folders as tasks (grading/importers.py from_harbor), on a real
Harbor-format task kept in tests/fixtures/harbor: what goes where, what the agent never sees, and
clear errors for folders that are not tasks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from rlsandbox.daemon.grading.importers import HARBOR_REWARD, HARBOR_TESTS, from_harbor
from rlsandbox.daemon.grading.task import TaskError, TaskSpec

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "harbor" / "fix-greeting"


def test_a_harbor_task_becomes_a_task_whose_tests_only_the_clean_room_gets() -> None:
    spec, build = from_harbor(FIXTURE)
    assert spec.id == "fix-greeting" and spec.problem_statement.startswith("# Fix the greeting")
    assert build is not None and build.context == FIXTURE / "environment"
    assert spec.image == build.tag and spec.image.startswith("rlsandbox-harbor/fix-greeting:")
    assert spec.workspace.path == "/app" and spec.workspace.source == "image"  # the Dockerfile's WORKDIR
    ev = spec.evaluation
    assert set(ev.hidden_tests) == {f"{HARBOR_TESTS}/test.sh", f"{HARBOR_TESTS}/test_outputs.py"}
    assert "bash /tests/test.sh" in ev.test_command and ev.timeout == 120.0 and ev.env == {"GREETING_LANG": "en"}
    assert ev.reward.policy == "command" and ev.reward.command == HARBOR_REWARD
    assert f"{HARBOR_TESTS}/**" in ev.protected  # what the agent plants where the tests arrive is discarded
    assert spec.metadata["solution_script"].startswith("#!/bin/bash") and spec.metadata["environment"]["cpus"] == 1
    # The image tag follows the environment's content, and the spec round-trips through JSON.
    assert from_harbor(FIXTURE)[0].image == spec.image
    assert TaskSpec.model_validate_json(spec.model_dump_json()) == spec


def test_the_image_tag_changes_with_the_environment_and_a_named_image_is_used_as_is(tmp_path: Path) -> None:
    task = shutil.copytree(FIXTURE, tmp_path / "t")
    before = from_harbor(task)[0].image
    (task / "environment" / "greet.py").write_text("def greet(name):\n    return 'x'\n")
    assert from_harbor(task)[0].image != before
    toml = (task / "task.toml").read_text().replace("[environment]", '[environment]\ndocker_image = "ghcr.io/org/img:1"')
    (task / "task.toml").write_text(toml)
    spec, build = from_harbor(task)
    assert spec.image == "ghcr.io/org/img:1" and build is None


def test_folders_that_are_not_harbor_tasks_are_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="not a Harbor task folder"):
        from_harbor(tmp_path)
    task = shutil.copytree(FIXTURE, tmp_path / "t")
    (task / "tests" / "data.bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TaskError, match="binary test files are not supported"):
        from_harbor(task)
    (task / "tests" / "data.bin").unlink()
    (task / "tests" / "test.sh").unlink()
    with pytest.raises(TaskError, match=r"tests/test.sh is missing"):
        from_harbor(task)
    (task / "task.toml").write_text("version = [")
    with pytest.raises(TaskError, match=r"task\.toml"):
        from_harbor(task)
