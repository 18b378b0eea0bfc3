"""`rlsandbox loadtest run`: the harness from the command line (see harness.py)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

SCENARIOS = ["sweep", "batch", "episodes", "burst", "soak", "baseline"]
EXTRA = ["live"]  # long: run by name only


async def _run(args: argparse.Namespace) -> int:
    from rlsandbox.loadtest import harness, report

    scenarios = SCENARIOS if args.scenarios == "all" else [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = sorted(set(scenarios) - set(SCENARIOS) - set(EXTRA))
    if unknown:
        choices = ", ".join(SCENARIOS + EXTRA)
        print(f"rlsandbox loadtest: unknown scenario(s) {', '.join(unknown)}; choose from {choices}", file=sys.stderr)
        return 2
    opts = harness.Options(scenarios=scenarios, quick=args.quick, target=args.target)
    if args.levels:
        opts.levels = [int(x) for x in args.levels.split(",")]
    for name in (
        "sweep_seconds",
        "soak_rate",
        "soak_seconds",
        "soak_sessions",
        "burst",
        "batch_sessions",
        "batch_in_flight",
        "episode_workers",
        "episodes_per_worker",
        "live_sessions",
        "live_pool",
    ):
        value = getattr(args, name)
        if value is not None:
            setattr(opts, name, value)
    # Ctrl-C or SIGTERM: cancel the run so that its daemon stops gracefully and removes its sandboxes.
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    assert me is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, me.cancel)
    try:
        results = await harness.run(opts)
    except asyncio.CancelledError:
        print("\nrlsandbox loadtest: interrupted; the daemon it started was stopped", file=sys.stderr)
        return 130
    files = report.write(results, Path(args.out))
    sys.stdout.write(report.markdown(results))
    print("\nwritten: " + ", ".join(str(f) for f in files))
    failed = bool(results["errors"]) or results.get("leaked_containers", 0) > 0
    return 1 if failed else 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lt = sub.add_parser("loadtest", help="drive a daemon with load scenarios; JSON, Markdown and PNG report")
    lt_sub = lt.add_subparsers(dest="loadtest_command", required=True)
    run = lt_sub.add_parser("run", help="run scenarios (default: all) against a daemon it starts, or --target")
    run.add_argument(
        "--scenarios", default="all", help=f"comma-separated, of: {','.join(SCENARIOS + EXTRA)} (default all but live)"
    )
    run.add_argument("--quick", action="store_true", help="a smoke run: every scenario for a few seconds")
    run.add_argument("--target", default=None, help="an existing daemon (default: start one, with NATS and an aggregator)")
    run.add_argument("--out", default="loadtest-report", help="report folder (default ./loadtest-report)")
    run.add_argument("--levels", default=None, help="sweep concurrency levels, e.g. 1,8,64,256")
    run.add_argument("--sweep-seconds", dest="sweep_seconds", type=float, default=None)
    run.add_argument("--soak-rate", dest="soak_rate", type=float, default=None, help="commands per second offered")
    run.add_argument("--soak-seconds", dest="soak_seconds", type=float, default=None)
    run.add_argument("--soak-sessions", dest="soak_sessions", type=int, default=None)
    run.add_argument("--batch-sessions", dest="batch_sessions", type=int, default=None, help="batch: sessions per ExecBatch call")
    run.add_argument("--batch-in-flight", dest="batch_in_flight", type=int, default=None, help="batch: calls at a time")
    run.add_argument("--burst", type=int, default=None, help="CreateSession calls per burst")
    run.add_argument("--episode-workers", dest="episode_workers", type=int, default=None)
    run.add_argument("--episodes-per-worker", dest="episodes_per_worker", type=int, default=None)
    run.add_argument("--live-sessions", dest="live_sessions", type=int, default=None, help="live: sessions to hold")
    run.add_argument("--live-pool", dest="live_pool", default=None, help="live: busybox or python")
    run.set_defaults(handler=_run)
