"""What board this is: SoC, board model, NPU driver version and device node, current frequencies.

Everything is read below a configurable root (normally "/") so that tests can point it at a fake
sysfs/procfs tree. Missing files are not errors: a field stays empty when the board does not say.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from rknn_proto.messages import FrequencyList

# SoCs whose runtime is librknnmrt (zero-copy API only, NPU node /dev/rknpu).
MRT_SOCS = frozenset({"rv1103", "rv1103b", "rv1106", "rv1106b"})
# NPU cores per SoC where there is more than one (only these accept a core mask).
NPU_CORES = {"rk3588": 3, "rk3576": 2}

_SOC_RE = re.compile(r"rockchip,(rk\d{4}|rv\d{4}b?)(s?)")
_DRIVER_RE = re.compile(r"v?(\d+\.\d+\.\d+)")
# Driver version files: debugfs for the RK35xx family, procfs for RV110x/RV1126B (user guide 4.2).
_DRIVER_FILES_DEBUGFS_FIRST = (
    "sys/kernel/debug/rknpu/version",
    "sys/kernel/debug/rknpu/driver_version",
    "proc/debug/rknpu/driver_version",
    "proc/rknpu/version",
)
_PROCFS_DRIVER_SOCS = MRT_SOCS | {"rv1126b"}
CPUFREQ_DIR = "sys/devices/system/cpu/cpufreq"
DEVFREQ_DIR = "sys/class/devfreq"


@dataclass(frozen=True)
class PlatformInfo:
    root: Path = Path("/")
    soc: str = ""  # toolkit target name, e.g. "rk3588" ("" when unknown)
    compatible: tuple[str, ...] = ()
    board_model: str = ""
    driver_version: str = ""  # e.g. "0.9.8"
    npu_device: str = ""  # path on the board, e.g. "/dev/dri/renderD129"
    frequencies: tuple[FrequencyList, ...] = field(default_factory=tuple)

    @property
    def npu_cores(self) -> int:
        return NPU_CORES.get(self.soc, 1)

    @property
    def uses_mrt(self) -> bool:
        return self.soc in MRT_SOCS


def read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip("\x00\n ")
    except OSError:
        return ""


def soc_from_compatible(entries: tuple[str, ...]) -> str:
    """The SoC named by the most generic `rockchip,<soc>` entry (RK3588S counts as rk3588)."""
    for entry in reversed(entries):
        match = _SOC_RE.fullmatch(entry.strip())
        if match:
            return match.group(1)
    return ""


def _driver_version(root: Path, soc: str) -> str:
    files = _DRIVER_FILES_DEBUGFS_FIRST
    if soc in _PROCFS_DRIVER_SOCS:
        files = ("proc/rknpu/version", *files[:3])
    for name in files:
        text = read_text(root / name)
        if text:
            match = _DRIVER_RE.search(text)
            return match.group(1) if match else text
    return ""


def _render_node_is_npu(root: Path, node: str) -> bool:
    uevent = read_text(root / "sys/class/drm" / node / "device/uevent").lower()
    return "npu" in uevent


def _npu_device(root: Path, soc: str) -> str:
    """`/dev/rknpu` on RV110x, otherwise the DRM render node that belongs to the NPU."""
    rknpu = root / "dev/rknpu"
    render_nodes = sorted((root / "dev/dri").glob("renderD*")) if (root / "dev/dri").is_dir() else []
    npu_nodes = [node for node in render_nodes if _render_node_is_npu(root, node.name)]
    candidates: list[Path] = [rknpu, *npu_nodes] if soc in MRT_SOCS else [*npu_nodes, rknpu]
    if not npu_nodes and (root / "dev/dri/renderD129").exists():
        candidates.append(root / "dev/dri/renderD129")
    for candidate in candidates:
        if candidate.exists():
            return "/" + str(candidate.relative_to(root))
    return ""


def cpufreq_policies(root: Path) -> list[Path]:
    """One cpufreq policy folder per CPU cluster, in policy order."""
    folder = root / CPUFREQ_DIR
    if not folder.is_dir():
        return []
    policies = [path for path in folder.glob("policy*") if path.name[6:].isdigit()]
    return sorted(policies, key=lambda path: int(path.name[6:]))


def devfreq_devices(root: Path, kind: str) -> list[Path]:
    """devfreq folders of the NPU (kind "NPU") or the DDR controller (kind "DDR", named dmc)."""
    folder = root / DEVFREQ_DIR
    if not folder.is_dir():
        return []
    marker = "npu" if kind == "NPU" else "dmc"
    return sorted(path for path in folder.iterdir() if marker in path.name.lower())


def _ints(paths: list[Path]) -> tuple[int, ...]:
    values = []
    for path in paths:
        text = read_text(path)
        if text.isdigit():
            values.append(int(text))
    return tuple(values)


def read_frequencies(root: Path) -> tuple[FrequencyList, ...]:
    """Current CPU (kHz, one per cluster), NPU and DDR (Hz) frequencies (kinds without a reading omitted)."""
    cpu_files = []
    for policy in cpufreq_policies(root):
        current = policy / "scaling_cur_freq"
        cpu_files.append(current if current.exists() else policy / "cpuinfo_cur_freq")
    readings = [
        FrequencyList("CPU", _ints(cpu_files)),
        FrequencyList("NPU", _ints([path / "cur_freq" for path in devfreq_devices(root, "NPU")])),
        FrequencyList("DDR", _ints([path / "cur_freq" for path in devfreq_devices(root, "DDR")])),
    ]
    return tuple(reading for reading in readings if reading.values)


def probe_platform(root: Path) -> PlatformInfo:
    compatible = tuple(
        entry for entry in read_text(root / "proc/device-tree/compatible").split("\x00") if entry
    )
    soc = soc_from_compatible(compatible)
    return PlatformInfo(
        root=root,
        soc=soc,
        compatible=compatible,
        board_model=read_text(root / "proc/device-tree/model"),
        driver_version=_driver_version(root, soc),
        npu_device=_npu_device(root, soc),
        frequencies=read_frequencies(root),
    )
