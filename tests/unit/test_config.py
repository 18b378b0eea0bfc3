"""Configuration: the example file is valid and documents every option."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlsandbox.daemon.config import DaemonConfig, PoolConfig, load_config
from rlsandbox.daemon.errors import InvalidArgument

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy/rlsandbox.example.toml"


def test_example_config_loads_and_documents_every_option() -> None:
    config = load_config(EXAMPLE)
    assert [p.name for p in config.pools] == ["python", "busybox"]
    text = EXAMPLE.read_text()
    for name in DaemonConfig.model_fields:
        assert f"{name} " in text or f"{name}=" in text or f"[[{name}]]" in text, f"{name} undocumented"
    for name in PoolConfig.model_fields:
        assert f"\n{name} " in text, f"pool option {name} undocumented"


def test_environment_and_overrides_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLSANDBOX_MAX_SESSIONS", "7")
    config = load_config(EXAMPLE, {"listen_tcp": "127.0.0.1:0"})
    assert config.max_sessions == 7 and config.listen_tcp == "127.0.0.1:0"


def test_bad_config_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('max_sessions = -1\nunknown_option = 1\n[[pools]]\nname = "Bad Name"\nimage = "x"\n')
    with pytest.raises(InvalidArgument) as info:
        load_config(bad)
    assert "max_sessions" in str(info.value) and "unknown_option" in str(info.value) and "name" in str(info.value)


def test_a_pool_recycles_by_default_exactly_when_it_qualifies() -> None:
    qualified = PoolConfig(name="ro", image="x", read_only_root=True)
    assert qualified.recycles and qualified.spec().recycle and qualified.spec().container.run_as == "1000:1000"
    for reason, pool in (
        ("read_only_root", PoolConfig(name="rw", image="x")),
        ("network", PoolConfig(name="net", image="x", read_only_root=True, network=True)),
        ("agent", PoolConfig(name="exec", image="x", read_only_root=True, agent="exec")),
        ("runc", PoolConfig(name="gvisor", image="x", read_only_root=True, runtime="runsc")),
    ):
        assert not pool.spec().recycle and pool.spec().container.run_as == "", reason
        assert any(reason in why for why in pool.recycling_blockers()), reason
        with pytest.raises(ValueError, match=reason):
            PoolConfig(name="insist", image="x", **{**pool.model_dump(exclude={"name", "image", "recycle"}), "recycle": True})
    opted_out = PoolConfig(name="ro", image="x", read_only_root=True, recycle=False)
    assert not opted_out.spec().recycle and opted_out.spec().container.run_as == ""
    assert [p.recycles for p in load_config(EXAMPLE).pools] == [False, False]  # the writable defaults
