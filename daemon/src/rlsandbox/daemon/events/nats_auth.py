"""Who may do what on the bus: one NATS user per role, with per-role permissions (docs/CLUSTER.md,
"Who is trusted on the bus").

- a **node** (``node-<id>``) publishes its own events (``rlsandbox.v1.<id>.>``) and its own node
  table entry (``$KV.RLSANDBOX_NODES.<id>``), answers as a micro service, reads task bundles;
- the **aggregator** consumes the events and publishes its own (``rlsandbox.v1._aggregator.>``);
- a **trainer** pushes task bundles (``$O.RLSANDBOX_TASKS.>``) and reads nothing else;
- the **admin** may do anything (``nats`` tooling, migrations).

Nobody else connects: the server has no anonymous user. A trainer (or any role but the node
itself) that publishes a reward on a node's subject is refused by the server, so the aggregator
never sees it. ``write_keys`` makes the users' secrets (random, one file each, 0600) and the
server's ``authorization`` block; the embedded server of ``rlsandbox up`` runs with it by default.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rlsandbox.daemon.cluster import BUCKET as NODES_BUCKET
from rlsandbox.daemon.errors import InvalidArgument
from rlsandbox.daemon.events.model import SUBJECT_ROOT, token
from rlsandbox.daemon.grading.bundles import BUCKET as TASKS_BUCKET

ROLES = ("node", "aggregator", "trainer", "admin")
# What no role but the admin does to JetStream: delete or empty a stream, delete a message.
_NEVER = ["$JS.API.STREAM.DELETE.*", "$JS.API.STREAM.PURGE.*", "$JS.API.STREAM.MSG.DELETE.*"]


def user_name(role: str, node_id: str = "") -> str:
    """The role's NATS user; a node's is named by its id as its subjects are (events/model.token)."""
    return f"node-{token(node_id)}" if role == "node" else role


def permissions(role: str, node_id: str = "") -> dict[str, dict[str, list[str]]]:
    """The role's ``permissions`` block in nats-server's configuration."""
    replies = ["_INBOX.>"]
    if role == "node":
        if not node_id:
            raise InvalidArgument("a node's permissions need its node id")
        node_id = token(node_id)  # as its subjects and its node table key spell it
        return {
            "publish": {
                "allow": [f"{SUBJECT_ROOT}.{node_id}.>", f"$KV.{NODES_BUCKET}.{node_id}", "$JS.API.>", "$SRV.>", *replies],
                "deny": _NEVER,
            },
            "subscribe": {"allow": [*replies, "$SRV.>", f"rlsandbox.node.{node_id}.>"]},
        }
    if role == "aggregator":
        return {
            "publish": {"allow": [f"{SUBJECT_ROOT}._aggregator.>", "$JS.API.>", "$JS.ACK.>", *replies], "deny": _NEVER},
            "subscribe": {"allow": [*replies, "_RLSANDBOX.deliver.>"]},
        }
    if role == "trainer":
        # JetStream's API for the bundles' object store only: with the whole API a trainer could
        # update the events stream to source a stream of its own under a node's subjects.
        store = f"OBJ_{TASKS_BUCKET}"
        api = [
            "$JS.API.INFO",
            f"$JS.API.STREAM.INFO.{store}",
            f"$JS.API.STREAM.CREATE.{store}",
            f"$JS.API.STREAM.PURGE.{store}",  # an object put again drops its old chunks
            f"$JS.API.STREAM.MSG.GET.{store}",
            f"$JS.API.DIRECT.GET.{store}",
            f"$JS.API.DIRECT.GET.{store}.>",
            f"$JS.API.CONSUMER.*.{store}",
            f"$JS.API.CONSUMER.*.{store}.>",
        ]
        return {"publish": {"allow": [f"$O.{TASKS_BUCKET}.>", *api, "$SRV.>", *replies]}, "subscribe": {"allow": replies}}
    if role == "admin":
        return {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]}}
    raise InvalidArgument(f"role {role!r}: one of {', '.join(ROLES)}")


@dataclass(frozen=True, slots=True)
class BusKeys:
    """Where ``write_keys`` put things: the server's configuration file and each user's secret."""

    folder: Path
    server_config: Path

    def password_file(self, role: str, node_id: str = "") -> Path:
        return self.folder / f"{user_name(role, node_id)}.password"

    def daemon_options(self, node_id: str) -> dict[str, str]:
        """The node daemon's configuration for its user (nats_user, nats_password_file)."""
        return {"nats_user": user_name("node", node_id), "nats_password_file": str(self.password_file("node", node_id))}


def write_keys(folder: str | Path, nodes: Iterable[str]) -> BusKeys:
    """A secret for each node's user and for the aggregator, the trainer and the admin (kept where
    they already exist: a node added later keeps the others' secrets), and the server's
    ``authorization`` block for them (``include`` it, or pass it with ``-c``)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    users = []
    ids = sorted(set(nodes))
    spelled = [token(n) for n in ids]
    clash = sorted({ids[i] for i in range(len(ids)) if spelled.count(spelled[i]) > 1})
    if clash:
        raise InvalidArgument(
            f"node ids {', '.join(clash)} name the same subjects ({token(clash[0])}): give them ids that differ in letters"
        )
    wanted = [("node", n) for n in ids] + [(r, "") for r in ("aggregator", "trainer", "admin")]
    for role, node_id in wanted:
        perms = permissions(role, node_id)  # checks the node id first
        path = out / f"{user_name(role, node_id)}.password"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32) + "\n")
        password = path.read_text().strip()
        users.append({"user": user_name(role, node_id), "password": password, "permissions": perms})
    server = out / "nats-auth.conf"
    fd = os.open(server.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        # nats-server reads JSON as its own configuration syntax.
        f.write("authorization: " + json.dumps({"users": users}, indent=2) + "\n")
    server.with_suffix(".tmp").replace(server)
    return BusKeys(out, server)
