"""`make demo`: a real image classifier through the daemon, the way a toolkit user drives a board.

Starts rknn_server (host runtime) on a free loopback port, uploads MobileNetV2 twice (the second
time is a cache hit), then runs the RKNN-Toolkit2 flow against it: init_runtime, inference on a
real photo with a top-5 printout, eval_perf with the per-layer table, eval_memory and release.
It ends with an accuracy analysis of the int8 build (calibrated on crops of the same photo) against
the daemon, whose table shows layer by layer where int8 loses accuracy.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from demo.calibration import photo_crops, write_dataset
from demo.models import save_mobilenet_v2
from rknn_client import RKNN, connect
from rknn_server.testing import start_daemon

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "demo-work"
IMAGE = ROOT / "demo" / "assets" / "grace_hopper.jpg"
# ImageNet mean/std in pixel units, as RKNN-Toolkit2 users pass them to config().
MEAN = [[123.675, 116.28, 103.53]]
STD = [[58.395, 57.12, 57.375]]
CALIBRATION_IMAGES = 4


def banner(text: str) -> None:
    print(f"\n=== {text} " + "=" * max(0, 70 - len(text)), flush=True)


def load_image(path: Path, size: int = 224) -> np.ndarray:
    """HWC uint8 RGB, centre-cropped and resized, as the toolkit's examples feed images."""
    image = Image.open(path).convert("RGB")
    side = min(image.size)
    left, top = (image.width - side) // 2, (image.height - side) // 2
    image = image.crop((left, top, left + side, top + side)).resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(image, dtype=np.uint8)


def accuracy_analysis(model: Path, device_url: str) -> int:
    """int8 build calibrated on crops of the photo, then golden vs simulator vs the daemon, per layer."""
    banner("accuracy_analysis(): where does int8 lose accuracy?")
    calibration = WORK / "calibration"
    dataset = write_dataset(calibration, photo_crops(IMAGE, calibration, CALIBRATION_IMAGES, 224))
    probe = WORK / "grace_hopper_224.png"
    Image.fromarray(load_image(IMAGE)).save(probe)
    # The host path, whatever is installed: our int8 emulation against the daemon's runtime (a real
    # RKNN-Toolkit2, found in auto mode, would compile for a board the virtual one cannot stand in for).
    rknn = RKNN(verbose=False, toolkit="host")
    rknn.config(mean_values=MEAN, std_values=STD, target_platform="rk3588")
    try:
        if rknn.load_onnx(str(model)) != 0 or rknn.build(do_quantization=True, dataset=str(dataset)) != 0:
            return 1
        snapshot = WORK / "snapshot"
        if rknn.accuracy_analysis(inputs=[str(probe)], output_dir=str(snapshot), device_id=device_url) != 0:
            return 1
    finally:
        rknn.release()  # accuracy_analysis said what it wrote under snapshot/ and how much
    return 0


def main() -> int:
    model = save_mobilenet_v2(WORK / "mobilenet_v2.onnx")
    banner("starting rknn_server (host runtime) on a free loopback port")
    # A fresh cache each run, so the demo always shows the first upload and then the cache hit.
    shutil.rmtree(WORK / "cache", ignore_errors=True)
    daemon = start_daemon(WORK / "cache", WORK / "rknn_server.log", ["--runtime", "host"])
    print(f"rknn_server pid {daemon.pid} listening on {daemon.url}; log: {daemon.log_path}")
    try:
        with connect(daemon.url) as device:
            info = device.info()
            print(
                f"daemon {info.daemon_version}, protocol {info.protocol_version}, runtime {info.runtime_version}"
            )
            banner("model upload (content-addressed cache)")
            for attempt in ("first", "second"):
                result = device.upload(model)
                status = (
                    "cache hit, nothing sent"
                    if result.cached
                    else f"sent {result.sent_bytes / 2**20:.1f} MiB"
                )
                print(f"{attempt} upload of {model.name} ({model.stat().st_size / 2**20:.1f} MiB): {status}")

        banner("RKNN-Toolkit2 flow: from rknn_client import RKNN")
        # The demo shows the embedded host runtime, so it takes the host path even where a real
        # RKNN-Toolkit2 is installed (docs/toolkit-compat.md: RKNN(toolkit=...)).
        rknn = RKNN(verbose=False, toolkit="host")
        rknn.config(mean_values=MEAN, std_values=STD, target_platform="rk3588")
        if rknn.load_onnx(str(model)) != 0 or rknn.build(do_quantization=False) != 0:
            return 1
        if rknn.init_runtime(target=None, device_id=daemon.url, perf_debug=True, eval_mem=True) != 0:
            return 1
        image = load_image(IMAGE)
        outputs = rknn.inference(inputs=[image])
        if outputs is None:
            return 1
        probs = outputs[0].reshape(-1)
        banner(f"top-5 for {IMAGE.name} (seeded, untrained weights: classes are indices only)")
        for rank, index in enumerate(np.argsort(probs)[::-1][:5], start=1):
            print(f"{rank}. class {index:4d}  p={probs[index]:.5f}")
        banner("eval_perf(): per-layer times from ONNX Runtime's profiler")
        if rknn.eval_perf() is None:
            return 1
        banner("eval_memory()")
        if rknn.eval_memory() is None:
            return 1
        rknn.get_sdk_version()
        rknn.release()
        banner("release() freed the session")
        if accuracy_analysis(model, daemon.url) != 0:
            return 1
        banner("done")
    finally:
        daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
