"""The benchmarks' daemon processes: they never outlive the benchmark that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from rlsandbox.loadtest.node import stop_with_parent

PARENT = """
import subprocess, sys, time
child = subprocess.Popen([*sys.argv[1:], sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def command_of(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def test_a_child_started_through_the_prefix_ends_with_its_killed_parent() -> None:
    prefix = stop_with_parent()
    assert prefix, "setpriv (util-linux, essential in Debian) is missing"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, *prefix], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        deadline = time.monotonic() + 10
        while not command_of(child).startswith(sys.executable.encode()) and time.monotonic() < deadline:
            time.sleep(0.01)  # setpriv sets it before its exec: once the child runs, it is set
        assert alive(child) and b"time.sleep(60)" in command_of(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the child outlived its killed parent"
    finally:
        parent.stdout.close()
        if alive(child):
            os.kill(child, signal.SIGKILL)
