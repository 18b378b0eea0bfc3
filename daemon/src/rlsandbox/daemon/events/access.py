"""Who may ask the aggregator's HTTP side: the names it answers to, and a token.

- ``Host``: a request is answered only when its Host header names this aggregator (its listen
  address, loopback names when it listens on loopback, and the names it is given): a web page on
  another origin that rebinds its DNS name to 127.0.0.1 (DNS rebinding) reads nothing through a
  browser on the same machine. Anything else is 421 Misdirected Request, saying what to add.
- A token, required when the aggregator listens beyond loopback (it refuses to start without
  one) and honoured on loopback when given: ``Authorization: Bearer <token>``, or a browser's
  cookie, set by opening the dashboard once with ``?token=<token>`` (then taken out of the
  address). Compared in constant time; missing or wrong is 401.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from aiohttp import web
from rlsandbox.daemon.api.auth import is_loopback

COOKIE = "rlsandbox_token"
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]


class AccessError(ValueError):
    """The HTTP side cannot start as configured (the message says what to give)."""


def read_token(path: str | Path) -> str:
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise AccessError(f"cannot read the HTTP token file {path}: {e}") from None
    if len(token) < 16 or any(c.isspace() for c in token):
        raise AccessError(f"the HTTP token in {path} must be at least 16 characters, without spaces")
    return token


def host_name(header: str) -> str:
    """The name of a Host header, without its port (``[::1]:80`` -> ``::1``), lower case."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def allowed_hosts(listen: str, names: Iterable[str]) -> frozenset[str]:
    """The names the aggregator answers to: its listen host, loopback names on loopback, ``names``."""
    host = host_name(listen.rpartition(":")[0] or "127.0.0.1")
    own = {host} | (set(LOOPBACK_NAMES) if is_loopback(listen) else set())
    return frozenset(own | {host_name(n) for n in names if n.strip()})


def middleware(
    listen: str, *, token: str | None, hosts: Iterable[str] = ()
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """The access check of every request. Raises AccessError for a listener beyond loopback
    without a token."""
    if not is_loopback(listen) and not token:
        raise AccessError(
            f"the aggregator's HTTP side on {listen} is beyond loopback: give it a token (--http-token-file FILE), "
            "or listen on 127.0.0.1"
        )
    names = allowed_hosts(listen, hosts)
    expected = token.encode() if token else None

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        name = host_name(request.headers.get("Host", ""))
        if name not in names:
            raise web.HTTPMisdirectedRequest(
                text=f"this aggregator does not answer to the host {name[:100]!r}: add it with --http-host"
            )
        if expected is None:
            return await handler(request)
        given = request.query.get("token")
        if given is not None and request.method == "GET" and hmac.compare_digest(given.encode(), expected):
            # A browser's first visit: the token becomes a cookie, and leaves the address bar.
            rest = {k: v for k, v in request.query.items() if k != "token"}
            response = web.HTTPFound(request.rel_url.with_query(rest))
            response.set_cookie(COOKIE, token or "", httponly=True, samesite="Strict")
            raise response
        auth = request.headers.get("Authorization", "")
        presented = auth[7:] if auth.startswith("Bearer ") else request.cookies.get(COOKIE, "")
        if not hmac.compare_digest(presented.encode(), expected):
            raise web.HTTPUnauthorized(
                text="a token is required: Authorization: Bearer <token>, or open the dashboard once with ?token=<token>"
            )
        return await handler(request)

    return check
