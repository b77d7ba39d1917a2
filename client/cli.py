"""`rknn-client`: talk to a board daemon from a shell.

rknn-client info [--device ID]
rknn-client run MODEL --input a.npy [--input b.npy] [--output-dir DIR]
rknn-client perf MODEL [--no-perf-debug]
rknn-client mem MODEL
rknn-client devices | doctor [--device ID] | deploy --device ID   (board commands: rknn_client.board_commands)
rknn-client accuracy MODEL --input IMG [IMG...] --dataset dataset.txt --output-dir DIR [--mean M,M,M] [--std S,S,S]
rknn-client farm devices|run ...   (see rknn_client.farm.cli)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rknn_client import __version__
from rknn_client.api import Device, Session, connect
from rknn_client.board_commands import add_board_commands
from rknn_client.compat.rknn import RKNN
from rknn_client.errors import RknnError
from rknn_client.farm.cli import add_farm_commands
from rknn_client.report import memory_text, perf_text
from rknn_client.toolkit.cli import add_toolkit_commands
from rknn_client.transport.base import TransportError


def _progress_bar(enabled: bool) -> tuple[Callable[[int, int], None] | None, Callable[[], None]]:
    """A tqdm bar for uploads when stderr is a terminal; nothing otherwise."""
    if not enabled or not sys.stderr.isatty():
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(unit="B", unit_scale=True, unit_divisor=1024, desc="upload", leave=False)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    return update, bar.close


def _open(
    device: Device, args: argparse.Namespace, perf_debug: bool = False, eval_mem: bool = False
) -> Session:
    progress, done = _progress_bar(not args.no_progress)
    try:
        uploaded = device.upload(args.model, progress)
    finally:
        done()
    note = "already cached on the daemon" if uploaded.cached else f"uploaded {uploaded.sent_bytes} bytes"
    print(f"model {uploaded.digest[:16]}: {note}", file=sys.stderr)
    return device.open_session(
        uploaded.digest, target=args.target or "", perf_debug=perf_debug, eval_mem=eval_mem
    )


def cmd_info(device: Device, args: argparse.Namespace) -> int:
    info = device.info()
    print(f"device:          {device.endpoint.description}")
    print(f"daemon:          rknn_server {info.daemon_version} (protocol {info.protocol_version})")
    print(f"runtime:         {info.runtime} {info.runtime_version}")
    print(f"why this runtime: {info.runtime_reason}")
    print(f"soc:             {info.soc or 'any (host runtime stands in for every target)'}")
    print(f"driver:          {info.driver_version or 'unknown'}")
    print(f"model formats:   {', '.join(info.model_formats)}")
    print("capabilities:    " + ", ".join(k for k, v in info.capabilities.items() if v))
    print("limits:          " + ", ".join(f"{k}={v:g}" for k, v in info.limits.items()))
    return 0


def cmd_run(device: Device, args: argparse.Namespace) -> int:
    arrays = [np.load(p) for p in args.input]
    with _open(device, args) as session:
        outputs = session.run(arrays)
    out_dir = Path(args.output_dir) if args.output_dir else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    for spec, array in zip(session.outputs, outputs, strict=True):
        print(f"output {spec.index} {spec.name}: shape={list(array.shape)} dtype={array.dtype}")
        if out_dir:
            np.save(out_dir / f"output_{spec.index}.npy", array)
    return 0


def cmd_perf(device: Device, args: argparse.Namespace) -> int:
    with _open(device, args, perf_debug=not args.no_perf_debug) as session:
        print(perf_text(session.perf(fix_freq=not args.no_fix_freq)), end="")
    return 0


def cmd_mem(device: Device, args: argparse.Namespace) -> int:
    with _open(device, args, eval_mem=True) as session:
        print(memory_text(session.memory()), end="")
    return 0


def _channels(text: str) -> list[float]:
    """`--mean 123.675,116.28,103.53`: one value per channel."""
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None


def cmd_accuracy(args: argparse.Namespace) -> int:
    """config + load_onnx + build + accuracy_analysis, the toolkit's flow; the runtime side is the daemon
    that --device/--target select (neither: golden vs simulator only)."""
    if not args.no_quantization and not args.dataset:
        print("rknn-client: accuracy needs --dataset (or --no-quantization)", file=sys.stderr)
        return 2
    rknn = RKNN()
    try:
        ok = (
            rknn.config(
                mean_values=args.mean,
                std_values=args.std,
                quantized_algorithm=args.algorithm,
                quantized_method=args.method,
            )
            == 0
            and rknn.load_onnx(args.model) == 0
            and rknn.build(do_quantization=not args.no_quantization, dataset=args.dataset) == 0
            and rknn.accuracy_analysis(args.input, args.output_dir, args.target, args.device) == 0
        )
    finally:
        rknn.release()
    if ok:
        print(f"layer dumps and error_analysis.txt are in {args.output_dir}", file=sys.stderr)
    return 0 if ok else 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rknn-client", description="Run, profile and inspect models on RKNN boards."
    )
    p.add_argument("--version", action="version", version=f"rknn-client {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    def add(
        name: str, fn: Callable[[Device, argparse.Namespace], int], help_text: str, model: bool
    ) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_text, description=help_text)
        c.add_argument(
            "--device",
            help="tcp://HOST:PORT, an adb serial or IP:PORT (default: RKNN_SERVER, "
            "else the single adb board, else a private host-runtime daemon)",
        )
        c.add_argument("--target", help="SoC the model is for (e.g. rk3588); checked against the board")
        if model:
            c.add_argument("model", help="model file (.onnx on the host runtime, .rknn on a board)")
            c.add_argument("--no-progress", action="store_true", help="no upload progress bar")
        c.set_defaults(func=fn)
        return c

    add("info", cmd_info, "describe the daemon: versions, runtime, SoC, capabilities, limits", model=False)
    run = add("run", cmd_run, "run a model once on .npy inputs", model=True)
    run.add_argument(
        "--input", action="append", required=True, help=".npy file, one per model input, in order"
    )
    run.add_argument("--output-dir", help="save each output as output_N.npy here")
    perf = add("perf", cmd_perf, "per-layer and total timing, in the toolkit's format", model=True)
    perf.add_argument("--no-perf-debug", action="store_true", help="total time only (no per-layer table)")
    perf.add_argument("--no-fix-freq", action="store_true", help="do not pin CPU/NPU/DDR frequencies")
    add("mem", cmd_mem, "memory used by a model, in the toolkit's format", model=True)
    add_board_commands(sub)
    acc = sub.add_parser(
        "accuracy",
        help="per-layer int8 error: float vs quantized model vs the board's runtime",
        description="Quantize an ONNX model as build() does and compare every layer: golden (float) vs "
        "simulator (int8), and vs the runtime of --device/--target when given.",
    )
    acc.add_argument("model", help="the original ONNX model")
    acc.add_argument(
        "--input", nargs="+", action="extend", required=True, help="image or .npy, one per model input"
    )
    acc.add_argument("--dataset", help="dataset.txt of calibration inputs, as build() takes it")
    acc.add_argument("--output-dir", default="./snapshot", help="where dumps and error_analysis.txt go")
    acc.add_argument(
        "--mean", type=_channels, action="append", help="mean per channel, e.g. 123.7,116.3,103.5"
    )
    acc.add_argument("--std", type=_channels, action="append", help="std per channel, e.g. 58.4,57.1,57.4")
    acc.add_argument("--algorithm", default="normal", choices=["normal", "mmse", "kl_divergence"])
    acc.add_argument("--method", default="channel", choices=["channel", "layer"])
    acc.add_argument("--no-quantization", action="store_true", help="compare against the float build")
    acc.add_argument("--device", help="the runtime side: tcp://HOST:PORT, an adb serial or IP:PORT")
    acc.add_argument(
        "--target", help="the runtime side's SoC (e.g. rk3588): the single adb board of that SoC"
    )
    acc.set_defaults(func=None)
    add_farm_commands(sub)
    add_toolkit_commands(sub)
    return p


def run_standalone(args: argparse.Namespace) -> int:
    """Commands that reach their devices themselves (board and farm commands)."""
    try:
        return int(args.standalone(args))
    except (RknnError, TransportError, OSError, ValueError) as exc:
        print(f"rknn-client: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "accuracy":
        return cmd_accuracy(args)
    if getattr(args, "standalone", None) is not None:
        return run_standalone(args)
    try:
        with connect(args.device, args.target) as device:
            return int(args.func(device, args))
    except (RknnError, TransportError, OSError, ValueError) as exc:
        print(f"rknn-client: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
