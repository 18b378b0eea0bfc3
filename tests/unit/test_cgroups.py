"""The node-wide caps' pure parts (runtime/cgroups.py): where the parent cgroup's limits are under
each cgroup version and driver, and what is written there (a folder standing in for
/sys/fs/cgroup; the real one is tests/integration/test_node_caps.py's); and the daemon's own OOM
score (process.py)."""

from __future__ import annotations

from pathlib import Path

from rlsandbox.daemon.process import NO_FILE_TABLE_LIMIT, lift_host_file_table, shield_from_oom_killer
from rlsandbox.daemon.runtime import cgroups


def test_the_parent_is_a_slice_under_systemds_driver() -> None:
    assert cgroups.parent_name("rlsandbox", "cgroupfs") == "/rlsandbox"
    assert cgroups.parent_name("rlsandbox", "systemd") == "rlsandbox.slice"
    assert cgroups.parent_name("mine.slice", "systemd") == "mine.slice"


def test_the_knobs_are_in_each_controllers_hierarchy_or_the_unified_one(tmp_path: Path) -> None:
    assert cgroups.knob("/rlsandbox", "1", "pids", tmp_path) == tmp_path / "pids" / "rlsandbox" / "pids.max"
    assert cgroups.knob("/rlsandbox", "1", "memory", tmp_path) == tmp_path / "memory" / "rlsandbox" / "memory.limit_in_bytes"
    assert cgroups.knob("rlsandbox.slice", "2", "pids", tmp_path) == tmp_path / "rlsandbox.slice" / "pids.max"
    assert cgroups.knob("rlsandbox.slice", "2", "memory", tmp_path) == tmp_path / "rlsandbox.slice" / "memory.max"


def test_the_caps_are_written_and_v2_turns_the_controllers_on(tmp_path: Path) -> None:
    pids = cgroups.cap("/rlsandbox", "1", "pids", 300, tmp_path)
    memory = cgroups.cap("/rlsandbox", "1", "memory", 0, tmp_path)
    assert cgroups.read(pids) == "300" and cgroups.read(memory) == "-1"
    assert not list(tmp_path.rglob("cgroup.subtree_control"))
    unified = tmp_path / "unified"
    assert cgroups.read(cgroups.cap("/rlsandbox", "2", "pids", 0, unified)) == "max"
    assert (unified / "cgroup.subtree_control").read_text() == "+pids"
    assert cgroups.read(cgroups.cap("/rlsandbox", "2", "memory", 1 << 30, unified)) == str(1 << 30)
    assert (unified / "cgroup.subtree_control").read_text() == "+memory"  # (the kernel keeps both)


def test_by_default_the_host_keeps_a_quarter_of_its_pids_and_a_tenth_of_its_memory() -> None:
    host, memory = cgroups.host_pids(), cgroups.host_memory()
    assert host >= 1024 and memory >= 1 << 30
    caps = cgroups.default_caps()
    assert caps["pids"] == int(host * 0.75)
    assert caps["memory"] == memory - max(memory // 10, 2 << 30)


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


def test_the_hosts_open_file_table_is_made_unlimited_never_lowered(tmp_path: Path) -> None:
    knob = tmp_path / "file-max"
    knob.write_text("2466246\n")
    assert lift_host_file_table(str(knob)) == NO_FILE_TABLE_LIMIT == int(knob.read_text())
    assert lift_host_file_table(str(knob)) == NO_FILE_TABLE_LIMIT
    assert lift_host_file_table(str(tmp_path / "missing")) is None
