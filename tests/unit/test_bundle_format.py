"""Task bundles as bytes (grading/bundles.py pack/unpack): a bundle round-trips to the same task
and ref, a bundle whose content is not its ref's is refused, and a bundle may carry a workspace
larger than a call may."""

from __future__ import annotations

import io
import tarfile

import pytest
from rlsandbox.daemon.errors import FailedPrecondition
from rlsandbox.daemon.grading.bundles import pack, unpack
from rlsandbox.daemon.grading.task import MAX_WORKSPACE_BYTES, EvaluationSpec, Task, TaskError, TaskSpec
from rlsandbox.daemon.session.prefetch import task_ref


def task(size: int = 10, task_id: str = "t") -> Task:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("big.bin")
        info.size = size
        tar.addfile(info, io.BytesIO(b"\0" * size))
    spec = TaskSpec(id=task_id, pool="python", evaluation=EvaluationSpec(test_command="true", report_format="exit-code"))
    return Task(spec, buf.getvalue())


def test_a_bundle_round_trips_to_the_same_task_and_ref() -> None:
    t = task()
    ref = task_ref(t)
    back = unpack(pack(t), ref)
    assert back.spec == t.spec and back.workspace_tar == t.workspace_tar and task_ref(back) == ref


def test_a_bundle_that_is_not_its_refs_content_is_refused() -> None:
    with pytest.raises(FailedPrecondition, match="holds other content"):
        unpack(pack(task(task_id="a")), task_ref(task(task_id="b")))
    with pytest.raises(FailedPrecondition, match="not an rlsandbox task bundle"):
        unpack(b"garbage", "t@00")


def test_a_bundle_may_carry_a_workspace_larger_than_a_call_may() -> None:
    big = task(size=MAX_WORKSPACE_BYTES + 1024)
    with pytest.raises(TaskError, match="push the task as a bundle"):
        Task.from_wire(big.spec_json(), big.workspace_tar)
    assert unpack(pack(big), task_ref(big)).workspace_tar == big.workspace_tar
