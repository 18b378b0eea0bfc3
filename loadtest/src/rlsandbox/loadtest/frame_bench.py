"""What keying the attach stream costs per frame: encode and decode, plain against keyed, in one run.

    python -m rlsandbox.loadtest.frame_bench [--frames 20000] [--rounds 5] [--json out.json]

A keyed frame (gVisor's attach stream, docs/RELIABILITY.md) carries two BLAKE2b tags, made by
the sender and checked by the receiver. Measured here is the CPU of exactly that, in this
process: a command's request frame (the daemon's meta of an ``exec``) and its result frame (the
agent's meta, with bodies of 0 B, 4 KiB and 64 KiB of output), each encoded and then decoded
the way the two ends do it. Rounds alternate plain and keyed so that drift on a shared machine
hits both. Per command it is one request and one result: compare the sum with a command's
round trip (~1.5-2.5 ms, "End to end through gRPC").
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time
from typing import Any

from rlsandbox.daemon.agent import protocol as p
from rlsandbox.loadtest.stats import bench_cli, machine

REQUEST_META = p.dumps(
    {
        "argv": None,
        "shell": "cd /workspace && python -m pytest -q tests/test_core.py",
        "env": {"PYTHONPATH": "/workspace/src", "LANG": "C.UTF-8"},
        "cwd": "/workspace",
        "timeout": 60.0,
        "stdout_cap": 1048576,
        "stderr_cap": 1048576,
        "user": "",
    }
)
RESULT_META = p.dumps(
    {"exit_code": 0, "signal": None, "timed_out": False, "stdout_total": 0, "stderr_total": 0, "duration": 0.0123}
)
BODIES = {"0 B": b"", "4 KiB": b"x" * 4096, "64 KiB": b"y" * 65536}


def _per_frame_us(frames: int, meta: bytes, body: bytes, keyed: bool) -> float:
    """Microseconds per frame to encode it and decode it (sender and receiver of one direction)."""
    key = secrets.token_bytes(32)
    sealer = p.FrameSealer(key, p.TO_AGENT) if keyed else None
    decoder = p.FrameDecoder()
    if keyed:
        decoder.authenticate(key, p.TO_AGENT)
    t0 = time.perf_counter()
    for i in range(frames):
        got = decoder.feed(p.encode_frame(p.K_RESULT, i + 1, meta, body, sealer))
        assert len(got) == 1
    return (time.perf_counter() - t0) / frames * 1e6


def run(frames: int, rounds: int) -> dict[str, Any]:
    cases = {"request": (REQUEST_META, b"")} | {f"result, {n} of output": (RESULT_META, b) for n, b in BODIES.items()}
    samples: dict[str, dict[str, list[float]]] = {c: {"plain": [], "keyed": []} for c in cases}
    for r in range(rounds):
        for case, (meta, body) in cases.items():
            order = ("plain", "keyed") if r % 2 == 0 else ("keyed", "plain")
            for mode in order:
                samples[case][mode].append(_per_frame_us(frames, meta, body, mode == "keyed"))
    out: dict[str, Any] = {"frames": frames, "rounds": rounds, "cases": {}}
    for case, by_mode in samples.items():
        plain, keyed = statistics.median(by_mode["plain"]), statistics.median(by_mode["keyed"])
        out["cases"][case] = {"plain_us": plain, "keyed_us": keyed, "added_us": keyed - plain, "ratio": keyed / plain}
    command = out["cases"]["request"]["added_us"] + out["cases"]["result, 0 B of output"]["added_us"]
    out["added_per_command_us"] = command
    out["machine"] = machine()
    return out


def report(r: dict[str, Any]) -> str:
    lines = [
        f"{r['frames']} frames per sample, median of {r['rounds']} alternating rounds",
        "",
        "| frame | plain us | keyed us | added us | keyed / plain |",
        "|---|---|---|---|---|",
    ]
    for case, c in r["cases"].items():
        lines.append(f"| {case} | {c['plain_us']:.2f} | {c['keyed_us']:.2f} | {c['added_us']:.2f} | {c['ratio']:.2f} |")
    lines.append("")
    lines.append(f"- added per command (its request and a result without output, both ends): {r['added_per_command_us']:.1f} us")
    return "\n".join(lines)


def main() -> None:
    def arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--frames", type=int, default=20000)
        parser.add_argument("--rounds", type=int, default=5)

    async def measured(a: argparse.Namespace) -> dict[str, Any]:
        return run(a.frames, a.rounds)

    bench_cli(__doc__, arguments, measured, report)


if __name__ == "__main__":
    main()
