"""The client package installs alone (grpcio + protobuf only) and works against a real daemon."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from rlsandbox.daemon.server import NodeDaemon

pytestmark = [pytest.mark.docker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = r"""
import sys
from rlsandbox.client import Client
import importlib.util
for heavy in ("aiodocker", "uvloop", "nats", "orjson", "rlsandbox.daemon"):
    assert importlib.util.find_spec(heavy) is None, heavy + " leaked into the client environment"
with Client(sys.argv[1]) as c, c.session(pool="busybox") as s:
    print(s.exec(["echo", "from-clean-venv"]).stdout.decode().strip())

# Grading with nothing but the client: a task as a plain dict and a workspace tarball.
import io, tarfile
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w") as t:
    data = b"def f():\n    return 2\n"
    info = tarfile.TarInfo("m.py")
    info.size = len(data)
    t.addfile(info, io.BytesIO(data))
spec = {
    "id": "venv-task",
    "pool": "python",
    "evaluation": {
        "test_command": "python3 -m pytest -rA -p no:cacheprovider",
        "hidden_tests": {"test_m.py": "from m import f\n\ndef test_f():\n    assert f() == 3\n"},
        "fail_to_pass": ["test_m.py::test_f"],
    },
}
with Client(sys.argv[1]) as c, c.session(task=(spec, buf.getvalue())) as s:
    before = s.grade()
    s.write_files({"m.py": "def f():\n    return 3\n"})
    after = s.grade()
    print(before.status, before.reward, after.status, after.reward)
"""


@pytest.mark.docker
async def test_client_in_a_clean_virtualenv(tmp_path: Path, daemon: NodeDaemon) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, str(ROOT / "client")], check=True, timeout=600)
    freeze = subprocess.run([str(venv / "bin/python"), "-m", "pip", "freeze"], capture_output=True, text=True).stdout
    names = {line.split("==")[0].split(" @ ")[0].lower() for line in freeze.splitlines() if line}
    assert names <= {"rlsandbox-client", "grpcio", "protobuf", "typing-extensions", "typing_extensions"}, names
    proc = await asyncio.create_subprocess_exec(
        str(venv / "bin/python"),
        "-c",
        SCRIPT,
        daemon.address,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    assert out.decode().split("\n")[:2] == ["from-clean-venv", "ok 0.0 ok 1.0"]
