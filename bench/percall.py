"""Issue 16's per-call figures alone, for comparing two versions of the code on a busy machine:
the daemon's overhead per MobileNetV2 call over a no-op gRPC unary call of the same bytes, and its
CPU per frame, also pinned to one core (the rows of `make bench` that measure them, nothing else).

    .venv/bin/python -m bench.percall [--rounds 3] [--json FILE]

Each round measures every figure once, from a fresh daemon; the medians and the spread (min-max)
over the rounds are printed. To compare with another checkout, run the same command with
PYTHONPATH at that checkout's `src` (the daemon subprocess inherits it), alternating the two.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import rknn_server
from bench.grpc_ceiling import measure_ceiling
from bench.run import RESULTS, bench_cpu_one_core, bench_cpu_per_frame, bench_latency
from rknn_server.testing import start_daemon


def one_round(work: Path) -> dict[str, float]:
    daemon = start_daemon(work / "cache", RESULTS / "bench-daemon-percall.log", ["--runtime", "host"])
    try:
        latency = bench_latency(daemon, work)
        cpu = bench_cpu_per_frame(daemon, work)
    finally:
        daemon.stop()
    pinned = bench_cpu_one_core(work)
    call_ms = measure_ceiling(streams=False)["no_op_unary_call_with_602112_bytes_p50_ms"]
    return {
        "in_process_p50_ms": latency["in_process_p50_ms"],
        "remote_p50_ms": latency["remote_p50_ms"],
        "no_op_unary_call_p50_ms": call_ms,
        "overhead_over_no_op_unary_call": (latency["remote_p50_ms"] - latency["in_process_p50_ms"]) / call_ms,
        "daemon_cpu_ms_per_mobilenet_v2_frame": cpu["daemon_cpu_ms_per_mobilenet_v2_frame"],
        "daemon_cpu_ms_per_identity_call": cpu["daemon_cpu_ms_per_identity_call_602112_bytes_each_way"],
        "one_core_daemon_cpu_ms_per_mobilenet_v2_frame": pinned["daemon_cpu_ms_per_mobilenet_v2_frame"],
        "one_core_daemon_cpu_ms_per_identity_call": pinned[
            "daemon_cpu_ms_per_identity_call_602112_bytes_each_way"
        ],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write every round's figures here")
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    os.environ["RKNN_SHM"] = "off"  # the wire's figures, as in bench.run (its shared-memory row turns it on)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="rknn-bench-percall-") as tmp:
        for i in range(args.rounds):
            rounds.append(one_round(Path(tmp) / str(i)))
            print(json.dumps(rounds[-1]), flush=True)
    print(f"code: {Path(rknn_server.__file__).resolve().parent}")
    for name in rounds[0]:
        values = [r[name] for r in rounds]
        print(f"  {name:48s} {statistics.median(values):8.3f}  ({min(values):.3f}-{max(values):.3f})")
    if args.json:
        args.json.write_text(
            json.dumps({"code": str(Path(rknn_server.__file__).parent), "rounds": rounds}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
