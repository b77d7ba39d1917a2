"""Fake /proc, /sys and /dev trees of boards, for the platform probe and frequency pinning."""

from __future__ import annotations

from pathlib import Path


def put(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def rk3588_board(root: Path) -> Path:
    """An RK3588 with three CPU clusters, the NPU on renderD129 and devfreq for NPU and DDR."""
    put(root, "proc/device-tree/compatible", "rockchip,rk3588s-orangepi-5\0rockchip,rk3588\0")
    put(root, "proc/device-tree/model", "Orange Pi 5\0")
    put(root, "sys/kernel/debug/rknpu/version", "RKNPU driver: v0.9.8\n")
    put(root, "dev/dri/renderD128", "")
    put(root, "dev/dri/renderD129", "")
    put(root, "sys/class/drm/renderD128/device/uevent", "DRIVER=panfrost\nOF_NAME=gpu\n")
    put(root, "sys/class/drm/renderD129/device/uevent", "DRIVER=RKNPU\nOF_NAME=npu\n")
    for policy, top in ((0, 1800000), (4, 2256000), (6, 2304000)):
        folder = f"sys/devices/system/cpu/cpufreq/policy{policy}"
        put(root, f"{folder}/scaling_governor", "schedutil")
        put(
            root,
            f"{folder}/scaling_available_governors",
            "ondemand userspace powersave performance schedutil",
        )
        put(root, f"{folder}/scaling_available_frequencies", f"408000 1200000 {top}")
        put(root, f"{folder}/cpuinfo_max_freq", str(top))
        put(root, f"{folder}/scaling_min_freq", "408000")
        put(root, f"{folder}/scaling_max_freq", str(top))
        put(root, f"{folder}/scaling_cur_freq", "1200000")
    for name, freqs in (
        ("fdab0000.npu", [300000000, 600000000, 1000000000]),
        ("dmc", [528000000, 2112000000]),
    ):
        folder = f"sys/class/devfreq/{name}"
        for key, value in (
            ("governor", "simple_ondemand"),
            ("min_freq", str(freqs[0])),
            ("max_freq", str(freqs[-1])),
            ("cur_freq", str(freqs[0])),
            ("available_frequencies", " ".join(map(str, freqs))),
            ("available_governors", "userspace powersave performance simple_ondemand"),
        ):
            put(root, f"{folder}/{key}", value)
    return root


def rv1106_board(root: Path) -> Path:
    put(root, "proc/device-tree/compatible", "rockchip,rv1106g-38x38-ipc-v10\0rockchip,rv1106\0")
    put(root, "proc/rknpu/version", "RKNPU driver: v0.9.2\n")
    put(root, "dev/rknpu", "")
    return root


def npu_board(root: Path, soc: str = "") -> Path:
    """A board with an NPU render node whose device tree names `soc` ("": the probe cannot see the SoC)."""
    if soc:
        put(root, "proc/device-tree/compatible", f"rockchip,{soc}-evb\0rockchip,{soc}\0")
    put(root, "dev/dri/renderD129", "")
    put(root, "sys/class/drm/renderD129/device/uevent", "DRIVER=RKNPU\nOF_NAME=npu\n")
    return root
