"""TLS and bearer tokens on the TCP listener; the unix socket open by configuration."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2_grpc
from helpers import daemon_config, running_daemon
from rlsandbox.client import AsyncClient, Client, TransportSecurityError, UnauthenticatedError, UnavailableError
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.errors import InvalidArgument
from rlsandbox.daemon.server import NodeDaemon

pytestmark = pytest.mark.docker

TOKEN = "s3cret-token-0123456789abcdef"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    (d / "tokens").write_text(f"# one token per line\n{TOKEN}\nother-token-abcdefghijklmnop\n")
    return d


@pytest.fixture(scope="module")
async def secure_daemon(images: dict[str, str], pki: Path) -> AsyncIterator[NodeDaemon]:
    config = daemon_config(
        tls_cert=str(pki / "cert.pem"),
        tls_key=str(pki / "key.pem"),
        auth_token_file=str(pki / "tokens"),
        listen_unix=str(pki / "daemon.sock"),
        pools=[PoolConfig(name="busybox", image="rlsandbox/busybox:latest", min_ready=1, max_total=8, memory_mb=64)],
    )
    async with running_daemon(config) as node:
        yield node


async def test_token_over_tls_works(secure_daemon: NodeDaemon, pki: Path) -> None:
    async with (
        AsyncClient(secure_daemon.address, token=TOKEN, tls_ca=str(pki / "cert.pem")) as client,
        client.session("busybox") as s,
    ):
        assert (await s.exec(["echo", "hi"])).stdout == b"hi\n"


@pytest.mark.parametrize("token", [None, "wrong-token-wrong-token-wrong", TOKEN + "x"])
async def test_missing_or_wrong_token_is_unauthenticated(secure_daemon: NodeDaemon, pki: Path, token: str | None) -> None:
    if token is None:  # TLS without any token
        client = AsyncClient(secure_daemon.address, tls_ca=str(pki / "cert.pem"))
    else:
        client = AsyncClient(secure_daemon.address, token=token, tls_ca=str(pki / "cert.pem"))
    async with client:
        with pytest.raises(UnauthenticatedError, match="bearer token"):
            await client.node_status()
        with pytest.raises(UnauthenticatedError):
            async for _ in client.exec_stream("nope", "true"):
                pass


async def test_the_health_service_answers_probes_without_a_token(secure_daemon: NodeDaemon, pki: Path) -> None:
    """Kubelet's gRPC probe and load balancers send no metadata: health is open, nothing else is
    (reflection included)."""
    creds = grpc.ssl_channel_credentials((pki / "cert.pem").read_bytes())
    async with grpc.aio.secure_channel(secure_daemon.address, creds) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "rlsandbox.v1.SandboxService"):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        # The refusal comes from the call's metadata alone: no request is written, so the test does
        # not race the client's request stream against the server's refusal (INTERNAL, once in CI).
        call = reflection.ServerReflectionInfo(timeout=10)
        assert await call.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_plaintext_to_the_tls_listener_fails(secure_daemon: NodeDaemon) -> None:
    """Not retryable, and the message says what to change."""
    async with AsyncClient(secure_daemon.address, timeout=3) as client:
        with pytest.raises(TransportSecurityError, match="listens with TLS: pass tls_ca") as err:
            await client.node_status()
    assert not err.value.retryable and not isinstance(err.value, UnavailableError)
    with Client(secure_daemon.address, timeout=3) as sync, pytest.raises(TransportSecurityError):
        sync.node_status()


async def test_wrong_ca_and_tls_to_a_plaintext_listener_fail_with_what_to_do(
    secure_daemon: NodeDaemon, pki: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=other",
         "-keyout", str(tmp_path / "k.pem"), "-out", str(other)],
        check=True, capture_output=True,
    )  # fmt: skip
    async with AsyncClient(secure_daemon.address, token=TOKEN, tls_ca=str(other), timeout=3) as client:
        with pytest.raises(TransportSecurityError, match="not signed by the CA given as tls_ca"):
            await client.node_status()
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with AsyncClient(f"127.0.0.1:{port}", token=TOKEN, tls_ca=str(pki / "cert.pem"), timeout=3) as client:
            with pytest.raises(TransportSecurityError, match="does not speak TLS"):
                await client.node_status()
    finally:
        await server.stop(None)


async def test_unix_socket_is_open_by_configuration(secure_daemon: NodeDaemon, pki: Path) -> None:
    async with AsyncClient(f"unix:{pki / 'daemon.sock'}") as client:
        assert (await client.node_status()).node_id == secure_daemon.config.node_id


async def test_sync_client_with_token(secure_daemon: NodeDaemon, pki: Path) -> None:
    import asyncio

    def call() -> str:
        with Client(secure_daemon.address, token=TOKEN, tls_ca=(pki / "cert.pem").read_bytes()) as c:
            return c.node_status().node_id

    assert await asyncio.to_thread(call) == secure_daemon.config.node_id


def test_remote_listener_without_tls_and_tokens_is_refused() -> None:
    with pytest.raises(Exception, match="not loopback: it needs tls_cert, tls_key and auth_token_file"):
        daemon_config(listen_tcp="0.0.0.0:7420")


def test_token_needs_tls_in_the_client() -> None:
    with pytest.raises(ValueError, match="only sent over TLS"):
        AsyncClient("127.0.0.1:1", token=TOKEN)


def test_short_tokens_are_refused(tmp_path: Path) -> None:
    from rlsandbox.daemon.api.auth import load_tokens

    (tmp_path / "t").write_text("short\n")
    with pytest.raises(InvalidArgument, match="at least 16"):
        load_tokens(tmp_path / "t")
