"""`rlsandbox aggregator`, `rlsandbox stats` and `rlsandbox trajectories export` (docs/events.md)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

DEFAULT_DB = "/var/lib/rlsandbox/aggregator.sqlite3"
# The database from the environment (a postgresql:// URL with a password stays out of `ps`).
DB_ENV = "RLSANDBOX_AGGREGATOR_DB"
DB_HELP = f"a SQLite file, or a postgresql:// URL that several aggregators share (default: ${DB_ENV}, else {DEFAULT_DB})"


async def _aggregator(args: argparse.Namespace) -> int:
    from rlsandbox.daemon.errors import InvalidArgument
    from rlsandbox.daemon.events import access
    from rlsandbox.daemon.events.aggregator import Aggregator
    from rlsandbox.daemon.events.anomalies import AnomalyRules
    from rlsandbox.daemon.events.connection import NatsAuth

    auth = NatsAuth.from_args(args)
    rules = AnomalyRules(window=args.anomaly_window, min_gradings=args.anomaly_min_gradings)
    try:
        token = access.read_token(args.http_token_file) if args.http_token_file else None
        agg = Aggregator(
            args.nats, args.db, durable=args.durable, http=args.http or None, http_token=token,
            http_hosts=tuple(args.http_host or ()), auth=auth, anomaly_rules=rules,
        )  # fmt: skip
    except access.AccessError as e:
        raise InvalidArgument(str(e)) from None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agg.stop)
    await agg.run()
    return 0


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3f}"
        if isinstance(v, dict):
            return " ".join(f"{k}:{n}" for k, n in v.items())
        return "-" if v is None else str(v)

    body = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(b[i]) for b in body]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(b, widths, strict=True)).rstrip() for b in body]
    return "\n".join(lines)


def _open_store(db: str) -> Any:
    """The aggregator's database, which must exist (opening a missing file would create one)."""
    from rlsandbox.daemon.events.store import Store

    return Store(db, create=False)


async def _stats(args: argparse.Namespace) -> int:

    store = _open_store(args.db)
    try:
        what = args.what
        result: Any
        if what == "runs":
            result = store.runs()
            cols = [
                "name",
                "sessions_seen",
                "open",
                "steps",
                "gradings",
                "ok",
                "infra_errors",
                "mean_reward",
                "pass_rate",
                "distribution",
            ]
        elif what == "tasks":
            result = store.tasks(args.run)
            cols = ["name", "gradings", "sessions", "ok", "infra_errors", "timeouts", "mean_reward", "pass_rate", "distribution"]
        elif what == "nodes":
            result = store.nodes()
            for r in result:
                r["age_s"] = round(time.time() - r["last_heartbeat"], 1)
                r.update({k: r["data"].get(k) for k in ("sessions", "free", "load1", "version")})
            cols = ["node", "age_s", "sessions", "free", "load1", "version"]
        elif what == "alerts":
            result = store.alerts()
            cols = ["ts", "node", "session", "kind", "data"]
        else:
            result = store.integrity()
            cols = list(result)
            result = [result]
        if args.json:
            print(json.dumps(result, indent=2, default=str))
        else:
            print(_table(result, cols) if result else f"no {what} yet")
    finally:
        store.close()
    return 0


async def _export(args: argparse.Namespace) -> int:
    import orjson

    store = _open_store(args.db)
    out = sys.stdout.buffer if args.out in (None, "-") else open(args.out, "wb")  # noqa: SIM115 - stdout is not ours to close
    n = 0
    try:
        for trajectory in store.trajectories(args.run):
            out.write(orjson.dumps(trajectory) + b"\n")
            n += 1
    except BrokenPipeError:  # the reader (head, less) went away: not an error of ours
        return 0
    finally:
        if out is not sys.stdout.buffer:
            out.close()
        store.close()
    print(f"{n} episode(s) of run {args.run!r} exported", file=sys.stderr)
    return 0 if n else 1


async def _keys_init(args: argparse.Namespace) -> int:
    from rlsandbox.daemon.events.nats_auth import write_keys

    keys = write_keys(args.dir, args.node)
    folder = keys.folder.resolve()
    print(f"NATS users written to {folder} (secrets 0600; existing ones kept):")
    print(f"  nats-server:  nats-server -js -c {folder / 'nats-auth.conf'}   (or include it in your configuration)")
    for node in sorted(set(args.node)):
        options = keys.daemon_options(node)
        print(f'  node {node}:  nats_user = "{options["nats_user"]}"  nats_password_file = "{options["nats_password_file"]}"')
    print(f"  aggregator:   --nats-user aggregator --nats-password-file {keys.password_file('aggregator')}")
    print(f"  trainer:      rlsandbox tasks push ... --nats-user trainer --nats-password-file {keys.password_file('trainer')}")
    print(f'  admin:        nats --user admin --password "$(cat {keys.password_file("admin")})" ...')
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser("keys", help="NATS users for each role (node, aggregator, trainer, admin) and their permissions")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    ki = keys_sub.add_parser(
        "init", help="write a secret per role and nats-server's authorization for them (run again to add a node)"
    )
    ki.add_argument("--dir", required=True, help="the folder for the secrets and nats-auth.conf (created 0700)")
    ki.add_argument("--node", action="append", required=True, metavar="NODE_ID", help="a node's id; repeat for each node")
    ki.set_defaults(handler=_keys_init)

    agg = sub.add_parser("aggregator", help="consume the events stream into a database (SQLite or PostgreSQL), serve queries")
    agg.add_argument("--nats", default="nats://127.0.0.1:4222", help="NATS server URL(s)")
    agg.add_argument("--db", default=os.environ.get(DB_ENV, DEFAULT_DB), help=DB_HELP)
    agg.add_argument(
        "--http", default="127.0.0.1:7421", help="HTTP query API, dashboard (/) and metrics (/metrics) address ('' to disable)"
    )
    agg.add_argument(
        "--http-token-file",
        default=None,
        help="a file holding the token the HTTP side asks for (required beyond loopback): Authorization: Bearer, or "
        "the dashboard opened once with ?token=",
    )
    agg.add_argument(
        "--http-host",
        action="append",
        metavar="NAME",
        help="a name the HTTP side answers to (Host header), besides its own; repeat",
    )
    agg.add_argument("--anomaly-window", type=float, default=60.0, help="seconds per window of the reward anomaly checks")
    agg.add_argument(
        "--anomaly-min-gradings", type=int, default=20, help="gradings a window needs before its anomalies are judged"
    )
    agg.add_argument(
        "--durable", default="rlsandbox-aggregators", help="durable consumer and queue group (shared by aggregators)"
    )
    agg.add_argument("--nats-creds", default=None, help="NATS .creds file (JWT and NKey seed)")
    agg.add_argument("--nats-nkey-seed", default=None, help="NATS NKey seed file")
    agg.add_argument("--nats-token-file", default=None, help="file holding the NATS token")
    agg.add_argument("--nats-user", default=None, help="NATS user (with --nats-password-file)")
    agg.add_argument("--nats-password-file", default=None, help="file holding the NATS user's password")
    agg.add_argument("--nats-tls-ca", default=None, help="CA certificate for NATS over TLS")
    agg.set_defaults(handler=_aggregator)

    st = sub.add_parser("stats", help="rewards by run and task, node health, alerts, integrity")
    st.add_argument("what", choices=["runs", "tasks", "nodes", "alerts", "integrity"], nargs="?", default="runs")
    st.add_argument("--db", default=os.environ.get(DB_ENV, DEFAULT_DB), help=DB_HELP)
    st.add_argument("--run", default=None, help="tasks: only this run")
    st.add_argument("--json", action="store_true")
    st.set_defaults(handler=_stats)

    tr = sub.add_parser("trajectories", help="export episodes for training-data pipelines")
    tr_sub = tr.add_subparsers(dest="trajectories_command", required=True)
    ex = tr_sub.add_parser("export", help="JSONL: one line per episode of a run, with its steps and rewards")
    ex.add_argument("--run", required=True, help="the run label of the sessions")
    ex.add_argument("--db", default=os.environ.get(DB_ENV, DEFAULT_DB), help=DB_HELP)
    ex.add_argument("--out", default=None, help="output file (default: standard output)")
    ex.set_defaults(handler=_export)
