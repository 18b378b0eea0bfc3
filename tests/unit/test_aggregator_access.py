"""Who may ask the aggregator's HTTP side (events/access.py, issue 46): its real HTTP server on a
real loopback port over a store, asked with real requests (no NATS: the HTTP side alone)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from rlsandbox.daemon.events.access import COOKIE, AccessError, allowed_hosts, host_name, read_token
from rlsandbox.daemon.events.aggregator import Aggregator

TOKEN = "t0k3n-0123456789abcdef"


@pytest.fixture
async def served(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    agg = Aggregator("nats://127.0.0.1:1", tmp_path / "a.sqlite3", http="127.0.0.1:0", http_token=request.param,
                     http_hosts=("dash.example",))  # fmt: skip
    await agg._start_http("127.0.0.1:0")
    try:
        yield f"http://127.0.0.1:{agg.http_port}"
    finally:
        assert agg._runner is not None
        await agg._runner.cleanup()
        agg.store.close()


async def get(url: str, **headers: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers, allow_redirects=False) as r:
        return r.status, await r.text()


@pytest.mark.parametrize("served", [None], indirect=True)
async def test_a_host_it_does_not_answer_to_is_misdirected(served: str) -> None:
    """DNS rebinding: a page of another origin whose name now points at 127.0.0.1 sends its own
    name as Host; before, /v1/trajectories answered it with every command and output."""
    assert (await get(f"{served}/v1/runs"))[0] == 200  # 127.0.0.1, as the client sends it
    assert (await get(f"{served}/v1/runs", Host="localhost:7421"))[0] == 200
    assert (await get(f"{served}/v1/runs", Host="dash.example"))[0] == 200  # a name it was given
    status, text = await get(f"{served}/v1/trajectories?run=r", Host="evil.example:7421")
    assert status == 421 and "--http-host" in text


@pytest.mark.parametrize("served", [TOKEN], indirect=True)
async def test_with_a_token_every_request_needs_it_and_a_browser_gets_a_cookie(served: str) -> None:
    status, text = await get(f"{served}/v1/runs")
    assert status == 401 and "?token=" in text
    assert (await get(f"{served}/v1/runs", Authorization="Bearer wrong-token-0123456789"))[0] == 401
    assert (await get(f"{served}/v1/runs", Authorization=f"Bearer {TOKEN}"))[0] == 200
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:  # as a browser keeps an IP's cookies
        async with http.get(f"{served}/?token={TOKEN}&x=1", allow_redirects=False) as r:
            assert r.status == 302 and r.headers["Location"] == "/?x=1"  # the token leaves the address
            assert r.cookies[COOKIE].value == TOKEN and r.cookies[COOKIE]["httponly"]
        async with http.get(f"{served}/v1/runs") as r:  # the cookie, from now on
            assert r.status == 200
    assert (await get(f"{served}/?token=wrong-token-0123456789"))[0] == 401  # a browser without the cookie


def test_beyond_loopback_it_does_not_start_without_a_token(tmp_path: Path) -> None:
    with pytest.raises(AccessError, match="beyond loopback: give it a token"):
        Aggregator("nats://127.0.0.1:1", tmp_path / "a.sqlite3", http="0.0.0.0:7421")
    (tmp_path / "short").write_text("abc\n")
    with pytest.raises(AccessError, match="at least 16 characters"):
        read_token(tmp_path / "short")
    assert host_name("[::1]:7421") == "::1" and host_name("Dash.Example:80") == "dash.example" and host_name("::1") == "::1"
    assert allowed_hosts("10.0.0.5:7421", ["dash"]) == {"10.0.0.5", "dash"}
