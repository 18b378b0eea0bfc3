"""The roles' NATS users and permissions (events/nats_auth.py) and `rlsandbox keys init`; what
the server does with them is tests/integration/test_bus_roles.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlsandbox.daemon import cli
from rlsandbox.daemon.errors import InvalidArgument
from rlsandbox.daemon.events.nats_auth import permissions, write_keys


def test_keys_are_kept_and_node_ids_checked(tmp_path: Path) -> None:
    first = write_keys(tmp_path, ["n1"])
    secret = first.password_file("admin").read_text()
    again = write_keys(tmp_path, ["n1", "n2"])
    assert again.password_file("admin").read_text() == secret and again.password_file("node", "n2").exists()
    text = again.server_config.read_text()
    assert '"user": "node-n2"' in text and '"rlsandbox.v1.n2.>"' in text and '"rlsandbox.v1.n1.>"' in text
    assert oct(again.password_file("trainer").stat().st_mode)[-3:] == "600" and oct(tmp_path.stat().st_mode)[-3:] == "700"
    dotted = write_keys(tmp_path, ["host.example"])  # a host name: its subjects spell it host_example
    assert dotted.password_file("node", "host.example").name == "node-host_example.password"
    assert '"rlsandbox.v1.host_example.>"' in dotted.server_config.read_text()
    with pytest.raises(InvalidArgument, match="same subjects"):
        write_keys(tmp_path, ["a.b", "a_b"])


def test_only_a_node_may_publish_its_own_subjects() -> None:
    node = permissions("node", "n1")["publish"]
    assert "rlsandbox.v1.n1.>" in node["allow"] and "$KV.RLSANDBOX_NODES.n1" in node["allow"]
    assert not [
        s for s in node["allow"] if s.startswith(("rlsandbox.v1.n2", "rlsandbox.v1.*", "rlsandbox.>", "$KV.RLSANDBOX_NODES.*"))
    ]
    for role in ("aggregator", "trainer"):
        allowed = permissions(role)["publish"]["allow"]
        assert not [s for s in allowed if s.startswith(("rlsandbox.v1.n", "$KV", ">"))], (role, allowed)
    assert "$JS.API.STREAM.DELETE.*" in permissions("aggregator")["publish"]["deny"]
    # A trainer reaches JetStream's API for the bundles' store only (not the events stream).
    trainer = permissions("trainer")["publish"]["allow"]
    api = [s for s in trainer if s.startswith("$JS.API.") and s != "$JS.API.INFO"]
    assert api and all("OBJ_RLSANDBOX_TASKS" in s for s in api), api
    with pytest.raises(InvalidArgument):
        permissions("node")
    with pytest.raises(InvalidArgument):
        permissions("anyone")


def test_keys_init_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["keys", "init", "--dir", str(tmp_path / "k"), "--node", "n1", "--node", "n2"]) == 0
    out = capsys.readouterr().out
    assert f"nats-server -js -c {tmp_path / 'k' / 'nats-auth.conf'}" in out and 'nats_user = "node-n2"' in out
    doc = json.loads((tmp_path / "k" / "nats-auth.conf").read_text().removeprefix("authorization: "))
    assert sorted(u["user"] for u in doc["users"]) == ["admin", "aggregator", "node-n1", "node-n2", "trainer"]
