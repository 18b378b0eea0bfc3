"""Harbor / Terminal-Bench task folders as tasks (grading/importers.py from_harbor), on a real
Harbor-format task kept in tests/fixtures/harbor: what goes where, what the agent never sees, and
clear errors for folders that are not tasks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rlsandbox.daemon.grading.importers import HARBOR_REWARD_FILES, HARBOR_TESTS, from_harbor
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
    # Harbor's reward files, read by the daemon: no command in the room the tests' code ran in.
    assert ev.reward.policy == "file" and ev.reward.files == HARBOR_REWARD_FILES == [
        "/logs/verifier/reward.txt",
        "/logs/verifier/reward.json",
    ]
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


def test_a_harbor_trial_finds_its_task_in_the_importers_jsonl(tmp_path: Path) -> None:
    """The adapter's ``tasks=``: one import-harbor JSONL for a whole job, each trial's task found
    by the id the importer gave its folder; a missing task or a broken line says what to do."""
    from rlsandbox.integrations.harbor_tasks import harbor_task_id, task_name
    from rlsandbox.integrations.tools import task_from_file

    spec, _ = from_harbor(FIXTURE)
    tasks = tmp_path / "tasks.jsonl"
    other = {"id": "other", "image": "x"}
    tasks.write_text(json.dumps(other) + "\n\n" + spec.model_dump_json() + "\n")
    found = task_from_file(tasks, harbor_task_id(FIXTURE, task_name(FIXTURE)))
    assert found["id"] == spec.id and found["image"] == spec.image
    assert task_from_file(tasks, "other") == other
    with pytest.raises(LookupError, match=r"'nope' is not in .*2 tasks.*import-harbor"):
        task_from_file(tasks, "nope")
    tasks.write_text(json.dumps(other) + "\n{broken\n")  # a new version of the file is read again
    with pytest.raises(ValueError, match=r"tasks\.jsonl:2: not a JSON task spec"):
        task_from_file(tasks, "other")
    with pytest.raises(FileNotFoundError, match=r"import-harbor TASKS_DIR --build --out FILE"):
        task_from_file(tmp_path / "missing.jsonl", "other")
