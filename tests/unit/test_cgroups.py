"""The node-wide PID cap's pure parts (runtime/cgroups.py): where the parent cgroup's pids.max is
under each cgroup version and driver, and what is written there (a folder standing in for
/sys/fs/cgroup; the real one is tests/integration/test_node_pids.py's); and the daemon's own OOM
score (process.py)."""

from __future__ import annotations

from pathlib import Path

from rlsandbox.daemon.process import shield_from_oom_killer
from rlsandbox.daemon.runtime import cgroups


def test_the_parent_is_a_slice_under_systemds_driver() -> None:
    assert cgroups.parent_name("rlsandbox", "cgroupfs") == "/rlsandbox"
    assert cgroups.parent_name("rlsandbox", "systemd") == "rlsandbox.slice"
    assert cgroups.parent_name("mine.slice", "systemd") == "mine.slice"


def test_the_pids_knob_is_in_the_pids_hierarchy_or_the_unified_one(tmp_path: Path) -> None:
    assert cgroups.pids_folder("rlsandbox", "1", tmp_path) == tmp_path / "pids" / "rlsandbox"
    assert cgroups.pids_folder("rlsandbox.slice", "2", tmp_path) == tmp_path / "rlsandbox.slice"


def test_the_cap_is_written_and_v2_turns_the_pids_controller_on(tmp_path: Path) -> None:
    v1 = cgroups.pids_folder("rlsandbox", "1", tmp_path)
    cgroups.cap_pids(v1, 300, "1")
    assert cgroups.read_cap(v1) == "300" and not (v1.parent / "cgroup.subtree_control").exists()
    v2 = cgroups.pids_folder("rlsandbox", "2", tmp_path / "unified")
    cgroups.cap_pids(v2, 0, "2")
    assert cgroups.read_cap(v2) == "max" and (v2.parent / "cgroup.subtree_control").read_text() == "+pids"


def test_by_default_the_host_keeps_a_quarter_of_its_pids() -> None:
    host = cgroups.host_pids()
    assert host >= 1024 and cgroups.default_cap() == int(host * 0.75)


def test_an_empty_parent_is_removed_from_every_hierarchy(tmp_path: Path) -> None:
    made = [tmp_path / "pids" / "mine", tmp_path / "memory" / "mine", tmp_path / "mine"]
    for folder in made:
        folder.mkdir(parents=True)
    (tmp_path / "cpu" / "mine" / "busy").mkdir(parents=True)  # not empty: left alone
    cgroups.remove_parent("mine", tmp_path)
    assert not any(f.exists() for f in made) and (tmp_path / "cpu" / "mine").exists()


def test_the_daemon_lowers_its_oom_score_but_never_raises_it(tmp_path: Path) -> None:
    knob = tmp_path / "oom_score_adj"
    knob.write_text("0\n")
    assert shield_from_oom_killer(str(knob)) == -500 and knob.read_text() == "-500"
    knob.write_text("-900\n")
    assert shield_from_oom_killer(str(knob)) == -900 and knob.read_text() == "-900\n"
    assert shield_from_oom_killer(str(tmp_path / "missing")) is None
