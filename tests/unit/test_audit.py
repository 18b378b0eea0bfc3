"""The wrong patches of task auditing (grading/audit.py), from a gold patch and the files it
touches: pure, no Docker. The grades are tests/integration/test_task_audit.py's."""

from __future__ import annotations

import ast
import difflib

import pytest
from rlsandbox.daemon.grading.audit import changed_functions, stubbed, wrong_patches
from rlsandbox.daemon.grading.patches import PatchError, apply_patch

BASE = b'''"""A module."""


def area(w, h):
    """The area."""
    return w + h


class Shape:
    def scale(self, k):
        return self.size + k

    def name(self): return "shape"


def untouched():
    return 1
'''
FIXED = BASE.replace(b"return w + h", b"return w * h").replace(b"return self.size + k", b"return self.size * k")


def diff(path: str, before: bytes, after: bytes) -> bytes:
    lines = difflib.unified_diff(
        before.decode().splitlines(keepends=True), after.decode().splitlines(keepends=True), f"a/{path}", f"b/{path}", n=1
    )
    return "".join(lines).encode()


def test_a_gold_patch_gives_one_wrong_patch_per_hunk_left_out_and_two_per_function_it_changes() -> None:
    gold = diff("geo.py", BASE, FIXED)
    wrong = wrong_patches(gold, {"geo.py": BASE})
    names = [w.name for w in wrong]
    assert names == [
        "the gold patch without its hunk 1 of geo.py (line 5)",
        "the gold patch without its hunk 2 of geo.py (line 10)",
        "the gold patch with geo.py:area() that raises NotImplementedError",
        "the gold patch with geo.py:area() that returns None",
        "the gold patch with geo.py:scale() that raises NotImplementedError",
        "the gold patch with geo.py:scale() that returns None",
    ], names
    by_name = {w.name: w.files["geo.py"] for w in wrong}
    # Without one hunk: the other fix is in, this one is not.
    one = by_name[names[0]]
    assert one is not None and b"return w + h" in one and b"return self.size * k" in one
    stub = by_name["the gold patch with geo.py:area() that returns None"]
    assert stub is not None
    ast.parse(stub)  # still Python
    assert b'    """The area."""\n    return None\n' in stub and b"return self.size * k" in stub
    # None is the gold patch: each differs from the fixed file.
    assert all(w.files["geo.py"] != FIXED for w in wrong)


def test_one_hunk_gives_no_hunk_variant_and_one_liners_are_not_stubbed() -> None:
    fixed = BASE.replace(b'return "shape"', b'return "Shape"')
    wrong = wrong_patches(diff("geo.py", BASE, fixed), {"geo.py": BASE})
    assert wrong == []  # one hunk, in a function whose body shares its def's line


def test_new_and_deleted_files_and_a_patch_that_does_not_apply() -> None:
    new = b"def helper():\n    return 42\n"
    gold = diff("geo.py", BASE, FIXED) + diff("helper.py", b"", new).replace(b"--- a/helper.py", b"--- /dev/null")
    wrong = wrong_patches(gold, {"geo.py": BASE, "helper.py": None})
    assert any(w.name.endswith("helper.py:helper() that returns None") for w in wrong)
    assert all(w.files["helper.py"] is not None for w in wrong)  # every variant keeps the new file
    with pytest.raises(PatchError):
        wrong_patches(gold, {"geo.py": b"something else\n", "helper.py": None})


def test_changed_functions_are_the_innermost_and_stubs_keep_docstrings_and_indentation() -> None:
    src = b"class A:\n    def f(self):\n        def g():\n            return 1\n        return g()\n"
    after = src.replace(b"return 1", b"return 2")
    [fn] = changed_functions(src, after)
    assert fn.name == "g"
    out = stubbed(after, fn, "raise NotImplementedError")
    assert out == b"class A:\n    def f(self):\n        def g():\n            raise NotImplementedError\n        return g()\n"
    assert changed_functions(src, b"not python (") == []
    # The stubs apply to the gold patch's result as a whole: every other change kept.
    gold = diff("m.py", src, after)
    assert apply_patch(gold, {"m.py": src})["m.py"][0] == after


def test_hunks_of_what_no_test_can_check_are_not_left_out() -> None:
    """A release's diff holds a changelog, docs and packaging hunks: leaving one out is no wrong
    fix, so it is no wrong patch (the mining benchmark's audit called every release task weak
    for its CHANGELOG.rst before)."""
    changelog = b"Changelog\n=========\n\n3.0.0\n-----\n"
    gold = diff("geo.py", BASE, FIXED) + diff("CHANGELOG.rst", changelog, changelog.replace(b"3.0.0", b"3.0.1\n-----\n\n3.0.0"))
    names = [w.name for w in wrong_patches(gold, {"geo.py": BASE, "CHANGELOG.rst": changelog})]
    assert not any("CHANGELOG" in n for n in names) and any("hunk 2 of geo.py" in n for n in names), names


def test_mining_takes_the_commits_bytes_whatever_the_clone_configures(tmp_path: object) -> None:
    """A clone's configuration may name a diff driver for its files (textconv, an external diff):
    a mined gold patch is the commit's own change, never a driver's output (which would not
    apply, or would apply something else)."""
    from pathlib import Path

    from helpers import commit_all
    from rlsandbox.daemon.grading.mine import _task, candidates

    repo = Path(str(tmp_path)) / "clone"
    (repo / "tests").mkdir(parents=True)
    (repo / "m.py").write_text("X = 1\n")
    (repo / "tests" / "test_m.py").write_text("def test_x():\n    pass\n")
    commit_all(repo)
    (repo / ".gitattributes").write_text("*.py diff=upper\n")
    with open(repo / ".git" / "config", "a") as f:
        f.write('[diff "upper"]\n\ttextconv = tr a-z A-Z <\n[diff]\n\texternal = false\n')
    (repo / "m.py").write_text("X = 2\n")
    (repo / "tests" / "test_m.py").write_text("def test_x():\n    assert True\n")
    commit_all(repo, "fix x")
    [found] = candidates(repo)
    task = _task(repo, found, pool="p", image="", workspace_path="/workspace", test_command="pytest {test_files}", env={})
    assert task.spec.gold_patch is not None and "+X = 2" in task.spec.gold_patch and ".gitattributes" in task.spec.gold_patch
    assert "+    assert True" in (task.spec.evaluation.test_patch or "")
