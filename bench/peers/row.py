"""The `peers` row of `make bench` (issues 32 and 30): ours against KServe, MLServer and PyTriton on
the same models, the same ONNX Runtime and the same client; our daemon's start and per-session
costs; and our dynamic batcher under perf_analyzer. A peer that cannot be installed or started,
or a part that fails, is reported with the reason, and the rest goes on."""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnxruntime

from bench.peers import summary
from bench.peers.batching import measure_batching
from bench.peers.daemon_costs import restart_to_ready, rss_per_session, start_to_ready
from bench.peers.models import bench_models, model_named
from bench.peers.rounds import CONCURRENCY, ROUNDS, SECONDS, Contender, Pythons, run_rounds
from bench.peers.servers import DAEMON_ARGS, start_ours, start_peer
from bench.peers.table import render
from bench.peers.venvs import PEERS, ensure
from rknn_server import __version__
from tests.kserve import tritonclient_venv

OUR_DOORS = ("rknn_v1", "v2_grpc", "v2_rest", "v2_rest_json")


def _guarded(part: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The part's figures, or {"error": why} when it raised."""
    try:
        return part()
    except Exception as exc:
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {exc}"[:1500]}


def contenders(servers: dict[str, Any]) -> list[Contender]:
    """Ours and every peer whose venv could be made (the others noted in `servers` with why not)."""
    found = [Contender("ours", start_ours, OUR_DOORS)]
    servers["ours"] = {
        "what": f"rknn_server {__version__}: {' '.join(DAEMON_ARGS)}, onnxruntime {onnxruntime.__version__}"
    }
    for peer in PEERS:
        venv, reason = ensure(peer)
        if venv is None:
            servers[peer.name] = {"skipped": reason}
            continue
        servers[peer.name] = {"what": f"{peer.package}, onnxruntime {venv.onnxruntime}", "note": venv.note}
        found.append(Contender(peer.name, functools.partial(start_peer, peer, venv), ("v2_grpc", peer.rest)))
    return found


def measure_peers(work: Path) -> dict[str, Any]:
    models = bench_models(work / "models")
    servers: dict[str, Any] = {}
    result: dict[str, Any] = {
        "rounds": ROUNDS,
        "seconds_per_window": SECONDS,
        "concurrency": list(CONCURRENCY),
        "models": {m.name: m.label for m in models},
        "servers": servers,
        "settings": "every server: one ONNX Runtime InferenceSession a model with our session options "
        "(intra-op 1, inter-op 1, no spinning, a memory arena), at most 2 runs at once (our --threads 1 on "
        "2 cores; the peers' handlers run it in a 2-thread pool, PyTriton 2 instances); ours writes its "
        "rpc log line for every call (info level, JSON), the peers' per-request log lines are off; "
        f"clients: tritonclient {tritonclient_venv.VERSION} (v2) and rknn_client (rknn.v1, RKNN_SHM=off), one connection per thread",
    }
    python, reason = tritonclient_venv.ensure()
    if python is None:
        return {**result, "skipped": f"tritonclient: {reason}"}
    found = contenders(servers)
    rounds = run_rounds(found, work, models, Pythons(Path(sys.executable), python))
    doors = {c.name: c.doors for c in found}
    names = [m.name for m in models]
    result.update(
        figures=summary.medians(rounds, doors, names),
        ratios_peer_over_ours=summary.ratios(rounds, doors, names),
        start_to_ready_s=summary.start_times(rounds),
        errors=summary.errors(rounds),
        per_round=rounds,
    )
    mobilenet = model_named(models, "mobilenet_v2")
    result["daemon"] = {
        "start_to_ready": _guarded(lambda: start_to_ready(work / "daemon")),
        "restart_to_ready": _guarded(
            lambda: restart_to_ready(work / "daemon", [model_named(models, "tiny"), mobilenet])
        ),
        "rss_per_session": _guarded(lambda: rss_per_session(work / "daemon", mobilenet)),
    }
    result["dynamic_batching"] = _guarded(lambda: measure_batching(work / "batching"))
    print(render(result), flush=True)
    return result
