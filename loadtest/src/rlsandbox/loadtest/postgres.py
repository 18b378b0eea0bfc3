"""A private PostgreSQL server (Debian's ``postgresql`` package) for the tests and benchmarks: a
fresh cluster in a temporary folder, a child process on loopback, ended by its PID.

PostgreSQL refuses to run as root, so as root the cluster belongs to the ``postgres`` user the
package creates (the folder is made outside pytest's private temporary root, which that user
cannot enter). ``durable=False`` turns off fsync and synchronous commit for tests that do not
crash it (a crash then loses commits already reported); benchmarks keep the defaults.

The user changes with ``setpriv`` in the child, not ``Popen(user=...)``: in a test process
running gRPC, a child changing user that way now and then died of SIGSEGV before its exec.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from rlsandbox.daemon.errors import FailedPrecondition, Unavailable
from rlsandbox.daemon.events.nats_server import free_port


def postgres_bin() -> Path:
    """The newest ``/usr/lib/postgresql/<version>/bin`` (Debian's layout), or the one on PATH."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parent.parent.name))
    if versions:
        return versions[-1].parent
    found = shutil.which("postgres")
    if found:
        return Path(found).parent
    raise FailedPrecondition("PostgreSQL not found: `apt-get install -y postgresql` (scripts/bootstrap.sh does)")


class PostgresServer:
    """``start()``, ``url(database)``, ``create_database(name)``, ``crash()`` and ``start()`` again
    (same port and data), ``stop()``."""

    USER = "rlsandbox"

    def __init__(self, *, durable: bool = True, port: int | None = None) -> None:
        self.durable = durable
        self.port = port or free_port()
        self.bin = postgres_bin()
        self.root = Path(tempfile.mkdtemp(prefix="rlsandbox-pg-"))
        self.process: subprocess.Popen[bytes] | None = None
        self._owner = pwd.getpwnam("postgres") if os.geteuid() == 0 else None

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.USER}@127.0.0.1:{self.port}/{database}"

    def _run(self, *argv: str) -> subprocess.Popen[bytes]:
        if self._owner:  # setpriv changes user and execs: the PID is PostgreSQL's own
            owner = self._owner
            argv = ("setpriv", f"--reuid={owner.pw_uid}", f"--regid={owner.pw_gid}", "--clear-groups", "--", *argv)
        with open(self.root / "server.log", "ab") as log:  # the child keeps its own copy
            return subprocess.Popen(argv, cwd=self.root, stdout=subprocess.DEVNULL, stderr=log)

    def start(self, timeout: float = 60.0) -> None:
        if self._owner:
            os.chown(self.root, self._owner.pw_uid, self._owner.pw_gid)
        data = self.root / "data"
        if not data.exists():
            initdb = self._run(
                str(self.bin / "initdb"), "-D", str(data), "-U", self.USER, "-A", "trust", "-E", "UTF8", "--no-sync", "-N"
            )
            if initdb.wait(timeout) != 0:
                raise Unavailable(f"initdb failed: {self._log_tail()}")
        settings = ["-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.root}", "-c", "max_connections=200"]
        if not self.durable:
            settings += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        self.process = self._run(str(self.bin / "postgres"), "-D", str(data), "-p", str(self.port), *settings)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise Unavailable(f"postgres exited with {self.process.returncode}: {self._log_tail()}")
            if self._ready():
                return
            time.sleep(0.05)
        self.stop()
        raise Unavailable(f"postgres did not accept connections on port {self.port} within {timeout:.0f} s")

    def _log_tail(self) -> str:
        try:
            return (self.root / "server.log").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no server log)"

    def _ready(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
            import psycopg

            try:
                psycopg.connect(self.url(), connect_timeout=2).close()
                return True
            except psycopg.OperationalError:  # listening, still starting up
                return False
        return False

    def create_database(self, name: str) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as db:
            db.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]  # a name we made, not input
        return self.url(name)

    def crash(self) -> None:
        """Immediate shutdown (SIGQUIT): every connection cut, no checkpoint; the next start
        recovers from the write-ahead log, as after a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)
            self.process.wait(30)

    def stop(self) -> None:
        """Fast shutdown (SIGINT: active transactions are rolled back), then the folder goes."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def postgres_server(*, durable: bool = True) -> Iterator[PostgresServer]:
    server = PostgresServer(durable=durable)
    try:
        server.start()
        yield server
    finally:
        server.stop()
