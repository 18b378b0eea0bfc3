"""How the daemon and the aggregator authenticate to NATS: one place for both.

Supported, alone or together: a ``.creds`` file (JWT and NKey seed, NATS decentralised auth), an
NKey seed file, a token file, a user with a password file, and a CA for TLS (``tls://`` URLs or
servers that require TLS). Secrets are read from files, never from the configuration itself; a
user and password in the URL (``nats://user:pass@host``) work too, as nats-py reads them there.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlsandbox.daemon.errors import InvalidArgument


def servers(url: str) -> list[str]:
    """The servers of a NATS URL setting: one URL, or several comma-separated (a NATS cluster; the
    client fails over between them, and learns the others from the cluster too). nats-py takes a
    list, not a comma-separated string."""
    found = [u.strip() for u in url.split(",") if u.strip()]
    if not found:
        raise InvalidArgument(f"no NATS server in {url!r}: give nats://HOST:PORT, several comma-separated for a cluster")
    return found


@dataclass(frozen=True, slots=True)
class NatsAuth:
    credentials: str | None = None  # .creds file
    nkey_seed: str | None = None  # NKey seed file
    token_file: str | None = None
    user: str | None = None
    password_file: str | None = None
    tls_ca: str | None = None

    @classmethod
    def from_args(cls, args: Any) -> NatsAuth:
        """From a command line's ``--nats-creds``, ``--nats-nkey-seed``, ``--nats-token-file``,
        ``--nats-user``, ``--nats-password-file``, ``--nats-tls-ca`` (those it has)."""
        return cls(
            credentials=getattr(args, "nats_creds", None),
            nkey_seed=getattr(args, "nats_nkey_seed", None),
            token_file=getattr(args, "nats_token_file", None),
            user=getattr(args, "nats_user", None),
            password_file=getattr(args, "nats_password_file", None),
            tls_ca=getattr(args, "nats_tls_ca", None),
        )

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect``; files are checked (and small ones read) now,
        so that a wrong path fails at start-up with its name instead of at every reconnect."""
        options: dict[str, Any] = {}
        if self.credentials:
            options["user_credentials"] = _existing(self.credentials, "nats_credentials")
        if self.nkey_seed:
            options["nkeys_seed"] = _existing(self.nkey_seed, "nats_nkey_seed")
        if self.token_file:
            options["token"] = _read_secret(self.token_file, "nats_token_file")
        if bool(self.user) != bool(self.password_file):
            raise InvalidArgument("nats_user and nats_password_file go together")
        if self.user and self.password_file:
            options["user"] = self.user
            options["password"] = _read_secret(self.password_file, "nats_password_file")
        if self.tls_ca:
            try:
                options["tls"] = ssl.create_default_context(cafile=_existing(self.tls_ca, "nats_tls_ca"))
            except ssl.SSLError as e:
                raise InvalidArgument(f"nats_tls_ca {self.tls_ca} is not a CA certificate: {e}") from None
        return options


def _existing(path: str, option: str) -> str:
    if not Path(path).is_file():
        raise InvalidArgument(f"{option}: no file at {path}")
    return path


def _read_secret(path: str, option: str) -> str:
    try:
        secret = Path(path).read_text().strip()
    except OSError as e:
        raise InvalidArgument(f"{option}: cannot read {path}: {e.strerror}") from None
    if not secret:
        raise InvalidArgument(f"{option}: {path} is empty")
    return secret
