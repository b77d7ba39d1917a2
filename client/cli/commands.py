"""`rknn-client`: talk to a board daemon from a shell.

rknn-client info [--device ID] [--json]
rknn-client run MODEL --input a.npy|b.npz|img.jpg [--input ...] [--output-dir DIR]
rknn-client perf MODEL [--runs N] [--warmup N] [--input FILE] [--no-perf-debug] [--json]
rknn-client perf MODEL --concurrency N | --concurrency-range A:B[:S] | --request-rate-range A:B[:S] [--json|--csv]
rknn-client mem MODEL [--json]
rknn-client devices [--json] | doctor [--device ID] [--json] | deploy --device ID   (rknn_client.cli.boards)
rknn-client accuracy MODEL --input IMG [IMG...] --dataset dataset.txt --output-dir DIR [--mean M,M,M] [--json]
rknn-client farm devices|run ...   (see rknn_client.farm.cli)
rknn-client exec script.py [args]   (an unmodified toolkit script; see rknn_client.exec)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

import numpy as np

from rknn_client import __version__
from rknn_client.cli.boards import add_board_commands, add_token_option
from rknn_client.cli.parser import Parser, add_json_option, parse
from rknn_client.compat.inputs import PreparedInputs, prepare
from rknn_client.device import Device, connect
from rknn_client.errors import RknnError, advice
from rknn_client.farm.cli import add_farm_commands
from rknn_client.frame_spec import FrameSpec
from rknn_client.input_files import InputFileError, check_input_files, image_size, read_input_files
from rknn_client.load.command import add_load_options, load_values, run_sweep
from rknn_client.load.output import csv_text, sweep_json, sweep_text
from rknn_client.progress import byte_bar
from rknn_client.report import memory_text, perf_text, readable_size
from rknn_client.session import Session
from rknn_client.timing import measure, sample_inputs
from rknn_client.toolkit.cli import add_toolkit_commands
from rknn_client.transport.base import TransportError
from rknn_proto.messages import EvalPerfResponse, TensorAttr

# A transfer shorter than this shows no bar (only a few MB and up take that long).
TRANSFER_BAR_DELAY_S = 0.5
DEFAULT_PERF_RUNS = 20
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
# `run` prints each output's values as numpy summarises them: this many at each edge of each axis.
PRINT_EDGE_ITEMS = 3
# `run --json` carries at most this many values of each output (the first ones, in C order).
JSON_VALUES = 1000
HOST_RUNTIME_HERE = "host runtime on this PC (a private daemon, not a board)"
PRIVATE_WARNING = (
    "rknn-client: warning: no --device given (nor RKNN_SERVER, ANDROID_SERIAL or --target), so this runs "
    "on a private host-runtime daemon on this PC (ONNX Runtime on its CPU), not on a board: its figures "
    "are this PC's. Pick a board with --device SERIAL|IP:PORT|tcp://HOST:PORT (`rknn-client devices` "
    "lists them)"
)
INPUT_HELP = ".npy, .npz or image (jpg/png/bmp: RGB, NHWC, resized to the model input), one per input"


def _note(text: str) -> None:
    print(f"note: {text}", file=sys.stderr)


def _emit_json(value: object) -> None:
    print(json.dumps(value, indent=2, default=str))


def _wants_json(args: argparse.Namespace) -> bool:
    """`--json` as a print-to-stdout switch (farm run's --json is a file name instead)."""
    return getattr(args, "json", None) is True


def _report_error(args: argparse.Namespace, error: BaseException, fix: str = "") -> None:
    """An error on stderr, and with --json also as the one JSON document on stdout."""
    text = str(error) or "interrupted (Ctrl-C)"
    if _wants_json(args):
        reason = getattr(error, "reason", None)
        code = reason.value if reason is not None else type(error).__name__
        code = "INTERRUPTED" if isinstance(error, KeyboardInterrupt) else code
        _emit_json({"error": {"code": code, "message": text, **({"fix": fix} if fix else {})}})
    print(f"rknn-client: {text}" + (f"\n  fix: {fix}" if fix else ""), file=sys.stderr)


def _measured_on(device: Device) -> str:
    """Where the figures come from when that is not a board ('' for a board)."""
    return HOST_RUNTIME_HERE if device.endpoint.kind == "private" else ""


def _check_format(device: Device, model: str) -> None:
    """Refuse a model the daemon's runtime cannot load before any byte of it is sent."""
    formats = device.info().model_formats
    suffix = Path(model).suffix.lower()
    if formats and suffix not in formats:
        raise ValueError(
            f"{model}: {device.endpoint.description} loads {' or '.join(formats)} models, not "
            f"{suffix or 'a file without a suffix'}; give a {' or '.join(formats)} file"
        )


def _upload(device: Device, args: argparse.Namespace) -> str:
    """The model's digest on the daemon, uploaded unless cached; a bar shows hashing, then sending."""
    _check_format(device, args.model)
    with byte_bar(not args.no_progress, "hashing") as bar:
        uploaded = device.upload(
            args.model,
            bar.phase("upload") if bar else None,
            hashing=bar.phase("hashing") if bar else None,
        )
    note = "already cached on the daemon" if uploaded.cached else f"uploaded {uploaded.sent_bytes} bytes"
    print(f"model {uploaded.digest[:16]}: {note}", file=sys.stderr)
    return uploaded.digest


def _open(
    device: Device, args: argparse.Namespace, digest: str, *, perf_debug: bool = False, eval_mem: bool = False
) -> Session:
    return device.open_session(digest, target=args.target or "", perf_debug=perf_debug, eval_mem=eval_mem)


def _inputs(session: Session, paths: list[str]) -> PreparedInputs:
    """The files as the model's inputs, under the toolkit's rules (images NHWC, cast to the model's dtype)."""
    sizes = [image_size(spec.shape, spec.layout) for spec in session.inputs]
    prepared = prepare(read_input_files(paths, sizes, _note), session.inputs, None, None)
    for text in prepared.notes:
        _note(text)
    return prepared


def cmd_info(device: Device, args: argparse.Namespace) -> int:
    info = device.info()
    if args.json:
        _emit_json({"device": device.endpoint.description, **dataclasses.asdict(info)})
        return 0
    print(f"device:          {device.endpoint.description}")
    print(f"daemon:          rknn_server {info.daemon_version} (protocol {info.protocol_version})")
    print(f"runtime:         {info.runtime} {info.runtime_version}")
    print(f"why this runtime: {info.runtime_reason}")
    print(f"soc:             {info.soc or 'any (host runtime stands in for every target)'}")
    print(f"driver:          {info.driver_version or 'unknown'}")
    print(f"model formats:   {', '.join(info.model_formats)}")
    print("capabilities:    " + ", ".join(k for k, v in info.capabilities.items() if v))
    print("limits:          " + ", ".join(f"{k}={_limit_text(k, v)}" for k, v in info.limits.items()))
    return 0


def _limit_text(name: str, value: float) -> str:
    if name.endswith("_bytes"):
        return readable_size(int(value))
    if name.endswith("_s"):
        return f"{value:g} s"
    return str(int(value))


def cmd_run(device: Device, args: argparse.Namespace) -> int:
    check_input_files(args.input)
    with _open(device, args, _upload(device, args)) as session:
        prepared = _inputs(session, args.input)
        with byte_bar(not args.no_progress, "tensors", delay_s=TRANSFER_BAR_DELAY_S) as bar:
            outputs = session.run_frame(prepared.frame, progress=bar.phase("tensors") if bar else None)
    out_dir = Path(args.output_dir) if args.output_dir else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
        for spec, array in zip(session.outputs, outputs, strict=True):
            np.save(out_dir / f"output_{spec.index}.npy", array)
    pairs = list(zip(session.outputs, outputs, strict=True))
    if args.json:
        _emit_json({"device": device.endpoint.description, "outputs": [_output_json(s, a) for s, a in pairs]})
        return 0
    for spec, array in pairs:
        print(
            f"output {spec.index} {spec.name}: shape={list(array.shape)} dtype={array.dtype}{_stats(array)}"
        )
        print(np.array2string(array, threshold=2 * PRINT_EDGE_ITEMS, edgeitems=PRINT_EDGE_ITEMS))
    if not out_dir and any(array.size > 2 * PRINT_EDGE_ITEMS for array in outputs):
        print("(values summarised; --output-dir DIR saves each output whole as DIR/output_N.npy)")
    return 0


def _stats(array: np.ndarray) -> str:
    """` min=.. max=.. mean=..` of a numeric array that has values; '' otherwise."""
    if array.size == 0 or not np.issubdtype(array.dtype, np.number):
        return ""
    return f" min={array.min():.6g} max={array.max():.6g} mean={array.mean():.6g}"


def _output_json(spec: TensorAttr, array: np.ndarray) -> dict[str, object]:
    flat = array.reshape(-1)
    return {
        "index": spec.index,
        "name": spec.name,
        "shape": list(array.shape),
        "dtype": str(array.dtype),
        "values": flat[:JSON_VALUES].tolist(),  # C order; the whole array is --output-dir's
        "values_truncated": bool(flat.size > JSON_VALUES),
    }


def _perf_frame(session: Session, args: argparse.Namespace) -> FrameSpec:
    """What perf sends: the --input files, else zeros of each input's shape."""
    if args.input:
        return _inputs(session, args.input).frame
    return FrameSpec(sample_inputs(session), strict=False)


def cmd_perf(device: Device, args: argparse.Namespace) -> int:
    """Time many runs on a session without per-layer profiling (a runtime collecting per-layer times
    runs slower), then take the per-layer table (and frequencies) from a profiling session's EvalPerf;
    with --no-perf-debug, the timing session's EvalPerf gives the frequencies. With a load-test
    option, a sweep instead (rknn_client.load)."""
    check_input_files(args.input or [])
    digest = _upload(device, args)
    if load_values(args) is not None:
        return _perf_load(device, args, digest)
    with _open(device, args, digest) as session:
        frame = _perf_frame(session, args)
        runs = DEFAULT_PERF_RUNS if args.runs is None else args.runs
        latency = measure(session, frame, warmup=args.warmup, runs=runs)
        if latency.interrupted:  # Ctrl-C: what was timed, and no profiling on top
            report = EvalPerfResponse(layers=(), total_time_us=latency.p50_us)
        elif args.no_perf_debug:
            report = session.perf(fix_freq=not args.no_fix_freq)
    if not (args.no_perf_debug or latency.interrupted):
        with _open(device, args, digest, perf_debug=True) as profiling:
            report = profiling.perf(fix_freq=not args.no_fix_freq)
    if args.json:
        _emit_json(
            {
                "device": device.endpoint.description,
                "measured_on": _measured_on(device) or "board",
                "latency": {**dataclasses.asdict(latency), "fps": latency.fps},
                **dataclasses.asdict(report),
            }
        )
    else:
        print(perf_text(report, latency, _measured_on(device)), end="")
    if latency.interrupted:
        print(f"rknn-client: interrupted (Ctrl-C) after {latency.runs} timed runs", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def _perf_load(device: Device, args: argparse.Namespace, digest: str) -> int:
    sweep = run_sweep(
        args, device.info(), lambda: _open(device, args, digest), lambda s: _perf_frame(s, args)
    )
    if args.json:
        _emit_json(sweep_json(sweep))
    elif args.csv:
        print(csv_text(sweep.steps), end="")
    elif sweep.steps:
        print(sweep_text(sweep), end="")
    if sweep.error:
        print(f"rknn-client: {sweep.error}", file=sys.stderr)
        return 1
    return 130 if sweep.interrupted else 0


def cmd_mem(device: Device, args: argparse.Namespace) -> int:
    with _open(device, args, _upload(device, args), eval_mem=True) as session:
        report = session.memory()
    if args.json:
        _emit_json(
            {
                "device": device.endpoint.description,
                "measured_on": _measured_on(device) or "board",
                **dataclasses.asdict(report),
            }
        )
    else:
        print(memory_text(report, _measured_on(device)), end="")
    return 0


def _channels(text: str) -> list[float]:
    """`--mean 123.675,116.28,103.53`: one value per channel."""
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None


def cmd_accuracy(args: argparse.Namespace) -> int:
    """config + load_onnx + build + accuracy_analysis, the toolkit's flow; the runtime side is the daemon
    that --device/--target select (neither: golden vs simulator only). The full table goes to
    error_analysis.txt; the terminal gets the worst layers first. The analysis (onnx, the toolkit layer)
    is imported here, not by every command."""
    from rknn_client.accuracy.analysis import REPORT_FILE
    from rknn_client.accuracy.summary import accuracy_json, worst_layers_text
    from rknn_client.compat.rknn import RKNN

    if not args.no_quantization and not args.dataset:
        _report_error(args, ValueError("accuracy needs --dataset (or --no-quantization)"))
        return 2
    check_input_files(args.input)
    if args.device is None and args.target is None:
        print(
            "rknn-client: note: no --device or --target, so this compares golden (float) with the "
            "simulator on this PC only, no board's runtime; pick a board with --device or --target",
            file=sys.stderr,
        )
    rknn = RKNN(toolkit="host")  # the host analysis: its result object feeds the worst-layers view
    table = io.StringIO()
    try:
        with contextlib.redirect_stdout(table):
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
    result = rknn.last_accuracy
    if not ok or result is None:
        sys.stderr.write(table.getvalue())
        last = [line for line in table.getvalue().splitlines() if line.strip()]
        _report_error(args, RuntimeError(last[-1] if last else "the accuracy analysis failed"))
        return 1
    if args.json:
        _emit_json(accuracy_json(result))
    else:
        print(worst_layers_text(result, args.worst), end="")
    written = result.written.text(Path(args.output_dir))
    print(f"{written}: the layer dumps and the full table ({REPORT_FILE})", file=sys.stderr)
    return 0


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="rknn-client", description="Run, profile and inspect models on RKNN boards.")
    p.add_argument("--version", action="version", version=f"rknn-client {__version__}")
    # Subcommand parsers are Parsers too (argparse makes them of the parent's class).
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        p.add_subparsers(dest="command", required=True, metavar="COMMAND"),
    )

    def add(
        name: str, fn: Callable[[Device, argparse.Namespace], int], help_text: str, model: bool
    ) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_text, description=help_text)
        c.add_argument(
            "--device",
            help="tcp://HOST:PORT, an attached adb board's serial or IP:PORT, or a daemon's HOST:PORT "
            "(default: RKNN_SERVER, else the single adb board, else a private host-runtime daemon)",
        )
        c.add_argument("--target", help="SoC the model is for (e.g. rk3588); checked against the board")
        add_token_option(c)
        if model:
            c.add_argument("model", help="model file (.onnx on the host runtime, .rknn on a board)")
            c.add_argument("--no-progress", action="store_true", help="no upload progress bar")
        c.set_defaults(func=fn)
        return c

    info = add(
        "info", cmd_info, "describe the daemon: versions, runtime, SoC, capabilities, limits", model=False
    )
    add_json_option(info)
    run = add("run", cmd_run, "run a model once on .npy, .npz or image inputs", model=True)
    run.add_argument("--input", action="append", required=True, help=INPUT_HELP)
    run.add_argument("--output-dir", help="save each output whole as output_N.npy here")
    add_json_option(run)
    perf = add(
        "perf",
        cmd_perf,
        "latency over many runs and the per-layer table, in the toolkit's format",
        model=True,
    )
    perf.add_argument("--runs", type=int, help=f"timed runs (default: {DEFAULT_PERF_RUNS})")
    perf.add_argument("--warmup", type=int, default=3, help="untimed runs first (default: %(default)s)")
    perf.add_argument("--input", action="append", help=INPUT_HELP + " (default: zeros)")
    perf.add_argument("--no-perf-debug", action="store_true", help="total time only (no per-layer table)")
    perf.add_argument("--no-fix-freq", action="store_true", help="do not pin CPU/NPU/DDR frequencies")
    add_json_option(perf)
    add_load_options(perf)
    mem = add("mem", cmd_mem, "memory used by a model, in the toolkit's format", model=True)
    add_json_option(mem)
    add_board_commands(sub)
    acc = sub.add_parser(
        "accuracy",
        help="per-layer int8 error: float vs quantized model vs the board's runtime",
        description="Quantize an ONNX model as build() does and compare every layer: golden (float) vs "
        "simulator (int8), and vs the runtime of --device/--target when given.",
    )
    acc.add_argument("model", help="the original ONNX model")
    acc.add_argument("--input", nargs="+", action="extend", required=True, help=INPUT_HELP)
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
    acc.add_argument(
        "--worst", type=int, default=10, help="layers in the summary, worst first (default: %(default)s)"
    )
    add_json_option(acc)
    acc.set_defaults(func=None)
    add_farm_commands(sub)
    ex = sub.add_parser("exec", help="run an unmodified RKNN-Toolkit2/RKNNLite script on rknn_client")
    ex.add_argument("script", help="the script; `rknn.api` and `rknnlite.api` resolve to rknn_client")
    ex.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    add_toolkit_commands(sub)
    return p


def run_standalone(args: argparse.Namespace) -> int:
    """Commands that reach their devices themselves (board and farm commands)."""
    try:
        return int(args.standalone(args))
    except BrokenPipeError:
        raise
    except (RknnError, TransportError, OSError, ValueError) as exc:
        _report_error(args, exc)
        return 1


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "exec":
        from rknn_client.exec import run_script

        return run_script(args.script, args.args)
    if args.command == "accuracy":
        try:
            return cmd_accuracy(args)
        except InputFileError as exc:
            _report_error(args, exc)
            return 1
    if getattr(args, "standalone", None) is not None:
        return run_standalone(args)
    try:
        with connect(args.device, args.target, token=args.token) as device:
            if device.endpoint.kind == "private" and args.command != "info":
                print(PRIVATE_WARNING, file=sys.stderr)
            return int(args.func(device, args))
    except BrokenPipeError:
        raise
    except (RknnError, TransportError, OSError, ValueError) as exc:
        _report_error(args, exc, advice(exc, "cli"))
        return 1


def main(argv: list[str] | None = None) -> int:
    """Ctrl-C anywhere ends with what was measured so far (each command prints its own), a line saying
    so and exit 130, never a traceback."""
    args = parse(parser(), argv)
    try:
        code = _dispatch(args)
        sys.stdout.flush()
    except KeyboardInterrupt as exc:
        _report_error(args, exc)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return code
