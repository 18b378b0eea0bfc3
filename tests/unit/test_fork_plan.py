"""Which paths a fork copies and deletes, from the engine's diff (session/fork.py plan_changes):
the fewest tarballs that cover every change, never a system folder whole, nothing of what the
engine or the daemon owns."""

from __future__ import annotations

from rlsandbox.daemon.session.fork import ADDED, CHANGED, COLLAPSE, DELETED, plan_changes


def test_added_folders_are_copied_whole_changed_files_alone_and_deletions_kept() -> None:
    diff = [
        ("/w", ADDED), ("/w/a", ADDED), ("/w/a/f", ADDED),
        ("/etc", CHANGED), ("/etc/motd2", ADDED), ("/etc/passwd", CHANGED),
        ("/bin", CHANGED), ("/bin/ash", DELETED),
        ("/etc/hostname", CHANGED), ("/dev", CHANGED), ("/dev/null", CHANGED),
        ("/.rlsandbox", ADDED), ("/.rlsandbox/sock", ADDED),
    ]  # fmt: skip
    copies, deletes = plan_changes(diff, excluded=[])
    assert sorted(copies) == ["/etc/motd2", "/etc/passwd", "/w"]
    assert deletes == ["/bin/ash"]


def test_a_workspace_with_many_changes_is_one_tarball_but_system_folders_never_are() -> None:
    files = [(f"/workspace/src/m{i}.py", ADDED) for i in range(COLLAPSE + 5)]
    site = [(f"/usr/lib/python3/dist-packages/p{i}.py", ADDED) for i in range(COLLAPSE + 5)]
    diff = [("/workspace", CHANGED), ("/workspace/src", CHANGED), *files, ("/workspace/old.py", DELETED)]
    diff += [("/usr", CHANGED), ("/usr/lib", CHANGED), ("/usr/lib/python3", CHANGED), ("/usr/lib/python3/dist-packages", CHANGED)]
    copies, deletes = plan_changes([*diff, *site], excluded=[], collapsible=["/workspace"])
    # /workspace whole (one tarball), and the fork deletes what the source deleted below it;
    # below /usr each new file alone: never the unchanged content of a system folder.
    assert sorted(copies) == sorted(["/workspace", *(p for p, _ in site)])
    assert deletes == ["/workspace/old.py"]


def test_a_chain_of_changed_folders_is_followed_down_to_where_the_changes_are() -> None:
    files = [(f"/workspace/pkg/sub/m{i}.py", ADDED) for i in range(COLLAPSE + 1)]
    diff = [("/workspace", CHANGED), ("/workspace/pkg", CHANGED), ("/workspace/pkg/sub", CHANGED), *files]
    copies, _ = plan_changes(diff, excluded=[], collapsible=["/workspace"])
    assert copies == ["/workspace/pkg/sub"]


def test_a_few_changes_below_a_folder_are_copied_one_by_one() -> None:
    diff = [("/workspace", CHANGED), ("/workspace/a.py", CHANGED), ("/workspace/b", ADDED), ("/workspace/c.py", DELETED)]
    copies, deletes = plan_changes(diff, excluded=[])
    assert sorted(copies) == ["/workspace/a.py", "/workspace/b"] and deletes == ["/workspace/c.py"]


def test_mounts_are_left_out_of_the_diff() -> None:
    diff = [("/workspace", ADDED), ("/workspace/x", ADDED), ("/tmp", CHANGED), ("/tmp/y", ADDED), ("/data", CHANGED)]
    copies, _ = plan_changes(diff, excluded=["/workspace", "/tmp"])
    assert copies == ["/data"]
