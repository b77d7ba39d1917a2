"""What deploy needs to know about a board, read in one adb shell round trip, and which boards it refuses."""

from __future__ import annotations

from dataclasses import dataclass, field

from rknn_client.boards.doctor import VENDOR_FIX, VENDOR_SCRIPTS, is_vendor_binary
from rknn_client.boards.shell import BoardShell
from rknn_client.errors import ErrorWithFix

INSTALL_DIR = "/opt/rknn-server"
# The project's distribution name as wheels and dist-info folders spell it.
DIST_NAME = "rknn_server_oss"
MIN_PYTHON = (3, 10)
SUPPORTED_ARCHES = ("aarch64", "armv7l", "x86_64")
# PyPI's grpcio wheels for armv7l (linux_armv7l, cp310-cp313) need glibc >= 2.34.
ARMV7L_GLIBC = (2, 34)
DOCS = "docs/deploy.md"


class DeployError(ErrorWithFix):
    """Deploy stopped: `problem` says why, `fix` what to do."""


class DeployRefused(DeployError):
    """The board cannot run the daemon this way; nothing was changed on it."""


@dataclass(frozen=True)
class BoardFacts:
    serial: str
    arch: str  # `uname -m`
    android: bool
    python: tuple[int, int] | None  # python3's version; None when there is no python3
    libc: str  # "glibc", "musl", "uclibc" or ""
    libc_version: str
    installed_version: str  # the daemon version in INSTALL_DIR, "" when none
    running_pid: int | None  # the daemon deploy started last, when it still runs
    vendor_binaries: tuple[str, ...] = field(default=())
    vendor_scripts: tuple[str, ...] = field(default=())
    system_numpy: bool = False  # python3 imports numpy from the distribution (python3-numpy)

    @property
    def python_tag(self) -> str:
        assert self.python is not None
        return f"{self.python[0]}.{self.python[1]}"


def _probe_script() -> str:
    dist_info = f"{INSTALL_DIR}/lib/python3*/site-packages/{DIST_NAME}-*.dist-info"
    python = (
        "import sys, platform, importlib.util as u; "
        "print('%d.%d' % sys.version_info[:2], ' '.join(platform.libc_ver()) or 'unknown', "
        "'numpy' if u.find_spec('numpy') else '')"
    )
    return "; ".join(
        [
            "echo arch=$(uname -m)",
            "echo android=$(getprop ro.build.version.sdk 2>/dev/null)",
            f'echo python=$(python3 -c "{python}" 2>/dev/null)',
            "echo uclibc=$(ls /lib/ld-uClibc.so.0 /lib/libuClibc.so.0 2>/dev/null)",
            f"echo installed=$(ls -d {dist_info} 2>/dev/null)",
            f"echo running=$(p=$(cat {INSTALL_DIR}/rknn_server.pid 2>/dev/null) && kill -0 $p 2>/dev/null && echo $p)",
            "echo vendor=$(for p in $(pidof rknn_server); do readlink /proc/$p/exe; done)",
            f"echo scripts=$(ls {' '.join(VENDOR_SCRIPTS)} 2>/dev/null)",
        ]
    )


def probe(serial: str, shell: BoardShell) -> BoardFacts:
    facts = dict(line.split("=", 1) for line in shell.output(_probe_script()).splitlines() if "=" in line)
    python_words = facts.get("python", "").split()
    python: tuple[int, int] | None = None
    if python_words and python_words[0].count(".") == 1:
        major, minor = python_words[0].split(".")
        python = (int(major), int(minor))
    libc, libc_version = [*python_words[1:3], "", ""][:2]
    if facts.get("uclibc", "").strip():
        libc = "uclibc"
    installed = facts.get("installed", "").strip()
    version = installed.rsplit("/", 1)[-1].removeprefix(f"{DIST_NAME}-").removesuffix(".dist-info")
    running = facts.get("running", "").strip()
    return BoardFacts(
        serial=serial,
        arch=facts.get("arch", "").strip(),
        android=bool(facts.get("android", "").strip()),
        python=python,
        libc=libc,
        libc_version=libc_version,
        installed_version=version if installed else "",
        running_pid=int(running) if running.isdigit() else None,
        vendor_binaries=tuple(exe for exe in facts.get("vendor", "").split() if is_vendor_binary(exe)),
        vendor_scripts=tuple(facts.get("scripts", "").split()),
        system_numpy="numpy" in python_words[3:],
    )


def refuse_unsupported(facts: BoardFacts) -> None:
    """Raise DeployRefused, with the precise reason and the alternative, unless deploy can serve the board."""
    container = (
        f"run the daemon in its container instead on an arm64 board with Docker (`docker compose up -d`, {DOCS}), "
        "or keep the vendor's rknn_server on this board"
    )
    if facts.android:
        raise DeployRefused(
            f"{facts.serial} runs Android, which has no python3 for the daemon's venv",
            f"install a Python environment under /data/rknn-server and start it with "
            f"deploy/android/rknn_server_oss.rc ({DOCS}); or {container}",
        )
    if facts.libc == "uclibc":
        raise DeployRefused(
            f"{facts.serial} runs a uClibc image (RV1103/RV1106 class): no Python, and no wheels exist for uClibc",
            f"the daemon cannot run on this image; {container}",
        )
    if facts.arch not in SUPPORTED_ARCHES:
        raise DeployRefused(
            f"{facts.serial} is {facts.arch or 'of unknown architecture'}: PyPI has no grpcio wheels for it "
            f"(deploy serves {' and '.join(SUPPORTED_ARCHES)})",
            f"flash the board's 64-bit (aarch64) image if it has one; otherwise {container}",
        )
    if facts.python is None:
        raise DeployRefused(
            f"{facts.serial} has no python3",
            f"install Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]} in the board image (apt install python3); "
            f"or {container}",
        )
    if facts.python < MIN_PYTHON:
        raise DeployRefused(
            f"{facts.serial} has Python {facts.python_tag}; the daemon needs >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]}",
            f"upgrade the board image to one with a newer python3; or {container}",
        )
    if facts.libc != "glibc":
        raise DeployRefused(
            f"{facts.serial} uses {facts.libc or 'an unknown C library'}; the offline bundle holds glibc "
            "(manylinux) wheels only",
            container,
        )
    if facts.arch == "armv7l":
        _refuse_armv7l(facts, container)


def _refuse_armv7l(facts: BoardFacts, container: str) -> None:
    """armv7l runs PyPI's grpcio (glibc >= 2.34) and the distribution's numpy (PyPI has no armv7l wheel)."""
    glibc = tuple(int(p) for p in facts.libc_version.split(".")[:2] if p.isdigit())
    if glibc < ARMV7L_GLIBC:
        raise DeployRefused(
            f"{facts.serial} is armv7l with glibc {facts.libc_version or 'of unknown version'}: PyPI's grpcio "
            f"wheels for armv7l need glibc >= {ARMV7L_GLIBC[0]}.{ARMV7L_GLIBC[1]} (Debian 12, Ubuntu 22.04)",
            f"upgrade the board image; or {container}",
        )
    if not facts.system_numpy:
        raise DeployRefused(
            f"{facts.serial} is armv7l and its python3 has no numpy: PyPI has no numpy wheel for armv7l, so "
            "the daemon's venv takes the distribution's",
            "install it on the board (`apt install python3-numpy`), then run deploy again",
        )


def refuse_vendor_daemon(facts: BoardFacts) -> None:
    """The vendor's rknn_server holds the socket our daemon needs: stop before changing anything."""
    if facts.vendor_binaries:
        raise DeployRefused(
            f"the vendor's closed rknn_server runs on {facts.serial} ({', '.join(facts.vendor_binaries)})",
            VENDOR_FIX + "; then run deploy again",
        )


def vendor_script_warning(facts: BoardFacts) -> str:
    """Why the vendor's respawn scripts matter, or '' when the board has none."""
    if not facts.vendor_scripts:
        return ""
    return (
        f"the vendor's respawn scripts exist ({', '.join(facts.vendor_scripts)}): they run "
        f"`killall rknn_server`, which also stops this daemon. {VENDOR_FIX}"
    )
