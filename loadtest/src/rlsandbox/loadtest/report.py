"""The harness's report: JSON (everything), Markdown (the summary) and PNG plots."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from rlsandbox.loadtest.stats import latency_table


def markdown(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [f"# rlsandbox load test\n\nMachine: {m['cpus']} CPUs, Python {m['python']}, kernel {m['kernel']}.", ""]
    lines += ["## Operations", ""]
    lines += latency_table([(op, s) for op, s in r["operations"].items() if s.get("n")], digits=2)
    sc = r["scenarios"]
    if "sweep" in sc:
        lines += ["", "## Exec latency vs concurrency (closed loop, `true`)", ""]
        lines += ["| concurrency | commands/s | p50 ms | p99 ms | max ms |", "|---|---|---|---|---|"]
        for row in sc["sweep"]["result"]:
            cells = f"{row['p50']:.2f} | {row['p99']:.2f} | {row['max']:.2f}"
            lines.append(f"| {row['concurrency']} | {row['throughput']:,.0f} | {cells} |")
    if "batch" in sc:
        b = sc["batch"]["result"]
        lines += [
            "",
            "## ExecBatch (`true` in every session per call)",
            "",
            f"- {b['sessions']} sessions per call, {b['in_flight']} calls in flight: **{b['commands_per_second']:,.0f} "
            f"commands/s**; per call p50 {b.get('p50', 0):.1f} ms, p99 {b.get('p99', 0):.1f} ms; "
            f"failed commands {b['failed_commands']}",
        ]
    if "episodes" in sc:
        e = sc["episodes"]["result"]
        p50 = e["episode_seconds"].get("p50", 0) / 1000
        lines += [
            "",
            "## Episodes",
            "",
            f"- {e['episodes']} episodes ({e['workers']} at once, {e['steps_per_episode']} steps, tests and a clean-room "
            f"grade each): {e['episodes_per_minute']:.1f} episodes/min; episode p50 {p50:.2f} s; graded "
            f"{e['rewards']['graded']}, without reward (infra/invalid) {e['rewards']['infra_or_invalid']}",
        ]
    if "burst" in sc:
        lines += ["", "## CreateSession bursts", ""]
        lines += ["| pool | sessions | per second | p50 ms | p99 ms | pool hit rate |", "|---|---|---|---|---|---|"]
        for kind, b in sc["burst"]["result"].items():
            hit = "-" if b["pool_hit_rate"] is None else f"{b['pool_hit_rate'] * 100:.0f}%"
            cells = f"{b['per_second']:.1f} | {b.get('p50', 0):.1f} | {b.get('p99', 0):.1f} | {hit}"
            lines.append(f"| {kind} ({b['pool']}) | {b['sessions']} | {cells} |")
    if "soak" in sc:
        s = sc["soak"]["result"]
        lines += [
            "",
            "## Soak (open loop)",
            "",
            f"- {s['rate']:.0f} commands/s offered for {s['seconds']:.0f} s over {s['sessions']} sessions: "
            f"{s['achieved_rate']:.0f}/s completed; latency from the due time p50 {s.get('p50', 0):.2f} ms, "
            f"p99 {s.get('p99', 0):.2f} ms, max {s.get('max', 0):.2f} ms",
        ]
    if "live" in sc:
        lv = sc["live"]["result"]
        lines += [
            "",
            "## Live sessions",
            "",
            f"- {lv['held']} of {lv['asked']} {lv['pool']} sessions held at once, {lv['answered']} answered a command; "
            f"created in {lv['created_s']:.0f} s, closed in {lv['closed_s']:.0f} s; host memory in use "
            f"{lv['host_memory_used_mb']:,.0f} MB (+{lv['host_memory_added_mb']:,.0f} MB); {lv['containers']} containers "
            f"charged {lv['containers_memory_mb'] or 0:,.0f} MB "
            f"({lv['memory_mb_per_container'] or 0:.1f} MB each, page cache included)",
        ]
    if "baseline" in sc:
        b = sc["baseline"]["result"]
        rows = [
            ("in-sandbox agent `true`", b["agent_exec_true"]),
            ("Engine API exec `true`", b["engine_exec_true"]),
            ("cold create + start", b["cold_create_to_ready"]),
            ("warm acquire", b["warm_acquire"]),
        ]
        lines += ["", "## Baselines (same run)", "", *latency_table(rows, digits=2)]
        ratio = b["engine_exec_true"]["p50"] / b["agent_exec_true"]["p50"]
        lines.append(f"\n- Engine exec / agent p50: {ratio:.1f}x")
    lines += ["", "## Errors", ""]
    if r["errors"]:
        lines += ["| operation | status | count |", "|---|---|---|"]
        lines += [f"| {e['operation']} | {e['code']} | {e['count']} |" for e in r["errors"]]
    else:
        lines.append("none")
    lines += _node_lines(r)
    return "\n".join(lines) + "\n"


def _node_lines(r: dict[str, Any]) -> list[str]:
    tl = r["timeline"]
    lines = ["", "## Node", ""]
    cpu = [p["cpu_percent"] for p in tl if "cpu_percent" in p]
    rss = [p["rss_mb"] for p in tl if "rss_mb" in p]
    containers = [p["containers"] for p in tl if "containers" in p]
    lag = [p["events_lag"] for p in tl if "events_lag" in p]
    pub = [p["events_published"] for p in tl if "events_published" in p]
    if cpu:
        lines.append(f"- daemon CPU: mean {sum(cpu) / len(cpu):.0f}%, max {max(cpu):.0f}% (100% = one core)")
    if rss:
        lines.append(f"- daemon RSS: max {max(rss):.0f} MB")
    if containers:
        lines.append(f"- live containers: max {max(containers)}")
    if pub:
        lines.append(f"- events published: {pub[-1]:,}; lag (queued + outbox): max {max(lag) if lag else 0}")
    if "leaked_containers" in r:
        lines.append(f"- containers left after the daemon stopped: {r['leaked_containers']}")
        lines.append(f"- daemon exit code after SIGTERM: {r.get('daemon_exit_code')}")
    return lines


def plots(r: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    samples: dict[str, list[tuple[float, float]]] = r["samples"]

    fig, ax = plt.subplots(figsize=(10, 5))
    for op, pts in sorted(samples.items()):
        if pts:
            ax.scatter([t for t, _ in pts], [lat * 1e3 for _, lat in pts], s=2, label=op)
    ax.set_yscale("log")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title("Latency over time")
    ax.legend(markerscale=4, fontsize=7, ncol=3)
    written.append(out / "latency_over_time.png")
    fig.savefig(written[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 5))
    for op, pts in sorted(samples.items()):
        if len(pts) >= 5:
            lat = sorted(x * 1e3 for _, x in pts)
            ax.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))], label=op)
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("fraction of operations")
    ax.set_title("Latency CDF")
    ax.legend(fontsize=7)
    written.append(out / "latency_cdf.png")
    fig.savefig(written[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    if "sweep" in r["scenarios"]:
        rows = r["scenarios"]["sweep"]["result"]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.plot([x["concurrency"] for x in rows], [x["throughput"] for x in rows], marker="o", label="commands/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("commands in flight")
        ax.set_ylabel("commands per second")
        ax2 = ax.twinx()
        ax2.plot([x["concurrency"] for x in rows], [x["p99"] for x in rows], marker="s", color="tab:red", label="p99 ms")
        ax2.set_ylabel("p99 latency (ms)")
        ax.set_title("Throughput and p99 vs concurrency")
        written.append(out / "throughput_vs_concurrency.png")
        fig.savefig(written[-1], dpi=110, bbox_inches="tight")
        plt.close(fig)
    return written


def write(r: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "report.json", out / "report.md", *plots(r, out)]
    # Raw samples go to the plots and to a compressed file of their own, not into report.json.
    with gzip.open(out / "samples.json.gz", "wt") as f:
        json.dump(r["samples"], f)
    (out / "report.json").write_text(json.dumps({k: v for k, v in r.items() if k != "samples"}, indent=1, default=str))
    (out / "report.md").write_text(markdown(r))
    return [*files, out / "samples.json.gz"]
