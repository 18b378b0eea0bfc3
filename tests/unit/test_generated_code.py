"""The committed protobuf/gRPC code is exactly what proto/ generates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_regenerating_the_proto_code_changes_nothing(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT / 'proto'}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(ROOT / "proto/rlsandbox/v1/sandbox.proto"),
        ],
        check=True,
    )
    committed = ROOT / "client/src/rlsandbox/v1"
    for name in ("sandbox_pb2.py", "sandbox_pb2.pyi", "sandbox_pb2_grpc.py"):
        fresh = (tmp_path / "rlsandbox/v1" / name).read_text()
        assert (committed / name).read_text() == fresh, f"{name} is stale: run scripts/gen_proto.sh and commit"


def test_every_test_module_has_a_name_of_its_own() -> None:
    """pytest imports test modules by their base name (no packages here): a unit and an
    integration module of one name stop the whole suite at collection, which the fast tier never
    collects (twice this stop: test_datasets.py, test_audit.py)."""
    import collections
    from pathlib import Path

    tests = Path(__file__).resolve().parent.parent
    names = collections.Counter(p.name for tier in ("unit", "integration") for p in (tests / tier).glob("test_*.py"))
    assert names["test_audit.py"] == 1  # the tiers were read
    assert [n for n, c in names.items() if c > 1] == []
