"""The peers' venvs in the user's cache folder, made once (as tritonclient's is) and reused.

Each peer pins its own grpcio, protobuf and web stack, so none shares the project's interpreter.
ONNX Runtime is pinned to the project venv's version, so every server runs the same kernels; where a
peer's own pins refuse that version, the venv takes whatever the peer allows and says so."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import onnxruntime

from rknn_client.user_cache import cache_root
from tests.kserve.tritonclient_venv import make_venv, python_of


@dataclass(frozen=True)
class Peer:
    name: str  # the row's name in the results
    package: str  # the pip requirement, exactly pinned
    server: str  # its server script, in this folder
    extra: tuple[str, ...] = ()  # pins the peer's own requirements miss, each with its reason
    rest: str = "v2_rest"  # its REST door: binary tensors (Triton's extension), or v2_rest_json

    def folder(self, onnxruntime_pin: str) -> Path:
        version = self.package.split("==")[1]
        return cache_root() / f"peer-{self.name}-{version}-ort-{onnxruntime_pin}-venv"


PEERS = (
    Peer("kserve", "kserve==0.21.0", "kserve_server.py"),
    # uvloop 0.22 stopped making a loop in asyncio.get_event_loop(), which MLServer 1.7.1's inference
    # worker calls at start: with today's uvloop its worker dies and no model loads.
    # Its REST has no binary tensor extension: JSON tensors there (and ours measured with JSON too).
    Peer("mlserver", "mlserver==1.7.1", "mlserver_server.py", ("uvloop==0.21.0",), "v2_rest_json"),
    Peer("pytriton", "nvidia-pytriton==0.7.0", "pytriton_server.py"),
)


@dataclass(frozen=True)
class PeerVenv:
    python: Path
    onnxruntime: str  # the version in it
    note: str  # "" when it is the project's version, else why not


def ensure(peer: Peer) -> tuple[PeerVenv | None, str]:
    """The peer's venv interpreter, made if missing; else None and why it could not be made."""
    ours = onnxruntime.__version__
    reason = make_venv(peer.folder(ours), [peer.package, *peer.extra, f"onnxruntime=={ours}"])
    if not reason:
        return PeerVenv(python_of(peer.folder(ours)), ours, ""), ""
    # The peer's pins may refuse our ONNX Runtime: take the one it allows, and say so.
    fallback = peer.folder("any")
    if make_venv(fallback, [peer.package, *peer.extra, "onnxruntime"]):
        return None, reason
    found = _version_in(python_of(fallback))
    return PeerVenv(python_of(fallback), found, f"onnxruntime {ours} refused by its pins ({reason})"), ""


def _version_in(python: Path) -> str:
    done = subprocess.run(
        [str(python), "-c", "import onnxruntime; print(onnxruntime.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stdout.strip() or "unknown"


def main() -> int:
    """`python -m bench.peers.venvs`: make every peer's venv, saying which could not be made."""
    for peer in PEERS:
        venv, reason = ensure(peer)
        print(f"{peer.name}: {venv}" if venv else f"{peer.name}: {reason}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
