"""Emulated board images: Debian root filesystems of another architecture, made with debootstrap, run
through qemu-user-static under a binfmt_misc handler of our own, and cached between runs.

A rootfs is built once per key (what it depends on: the suite, the architecture, the packages, this
file's RECIPE, and for the boards that carry the daemon's venv the daemon's dependencies) under
~/.cache/rknn_client/board/, outside the clone, so a fresh clone on the same machine reuses it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # the dev extra installs tomli below 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path.home() / ".cache" / "rknn_client" / "board"
BINFMT = Path("/proc/sys/fs/binfmt_misc")
MIRROR = "http://deb.debian.org/debian"
# Bump when the way a rootfs is made changes, so cached ones are rebuilt.
RECIPE = 1
# Where the board venv is made by hand, as docs/deploy.md says (deploy's own install dir).
BOARD_VENV = "/opt/rknn-server"
# pytest for the ABI test inside the board, kept apart from the daemon's venv.
BOARD_PYTEST = "/opt/board-test/pytest"
HANDLER_PREFIX = "rknn-board-"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
BOARD_CA = "/etc/ssl/host-ca.crt"
_DEBOOTSTRAP_SECONDS = 1500
_PIP_SECONDS = 1200


@dataclass(frozen=True)
class BoardSpec:
    """One emulated board image."""

    name: str
    suite: str  # Debian release
    arch: str  # Debian architecture (debootstrap --arch)
    qemu: str  # qemu's name for it (/usr/lib/binfmt.d/qemu-NAME.conf)
    machine: str  # what `uname -m` says on the board
    cross_cc: str  # the cross compiler for the stand-in runtime
    packages: tuple[str, ...] = ("python3", "ca-certificates")
    with_venv: bool = True  # carries the daemon's venv, made as docs/deploy.md says
    system_site_packages: bool = False  # the venv takes numpy from the distribution (armhf)


BOARDS = {
    "arm64": BoardSpec("arm64", "bookworm", "arm64", "aarch64", "aarch64", "aarch64-linux-gnu-gcc"),
    "armhf": BoardSpec(
        "armhf",
        "bookworm",
        "armhf",
        "arm",
        "armv7l",
        "arm-linux-gnueabihf-gcc",
        packages=("python3", "ca-certificates", "python3-numpy"),
        system_site_packages=True,
    ),
    # Debian 11's Python 3.9: deploy must refuse it, so it needs no venv.
    "bullseye": BoardSpec(
        "bullseye", "bullseye", "arm64", "aarch64", "aarch64", "aarch64-linux-gnu-gcc", with_venv=False
    ),
}


def daemon_requirements() -> list[str]:
    """The `[server]` install's requirements, as pyproject.toml declares them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["server"]]


def cache_key(spec: BoardSpec) -> str:
    recipe: dict[str, object] = {"recipe": RECIPE, "spec": asdict(spec), "mirror": MIRROR}
    if spec.with_venv:
        recipe["requirements"] = daemon_requirements()
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def cached_rootfs(spec: BoardSpec) -> Path:
    return CACHE / f"{spec.name}-{cache_key(spec)}"


@contextlib.contextmanager
def binfmt_handler(qemu: str) -> Iterator[str]:
    """Register Debian's qemu-user-static line for `qemu` under this project's own name (with this
    process's PID: concurrent runs keep theirs) for the duration; removed after, even on failure. The
    F flag opens the interpreter now, so the chroot needs no copy of qemu."""
    conf = Path(f"/usr/lib/binfmt.d/qemu-{qemu}.conf")
    line = conf.read_text().strip()
    if not line.startswith(f":qemu-{qemu}:"):
        raise RuntimeError(f"{conf} does not start with :qemu-{qemu}: but {line[:40]!r}")
    _remove_stale_handlers()
    name = f"{HANDLER_PREFIX}{qemu}-{os.getpid()}"
    (BINFMT / "register").write_text(f":{name}:" + line[len(f":qemu-{qemu}:") :])
    try:
        yield name
    finally:
        (BINFMT / name).write_text("-1")


def _remove_stale_handlers() -> None:
    """Handlers left by runs that were killed (their PID is gone)."""
    for entry in BINFMT.glob(f"{HANDLER_PREFIX}*"):
        pid = entry.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            entry.write_text("-1")


def ensure_binfmt_misc() -> None:
    """Mount binfmt_misc where the kernel offers it but nothing mounted it yet."""
    if not (BINFMT / "register").exists():
        subprocess.run(
            ["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], check=True, capture_output=True
        )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One builder per cache entry at a time (two runs on one machine wait for each other)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_rootfs(spec: BoardSpec, wheel: Path, log: Path) -> tuple[Path, bool]:
    """The cached rootfs for `spec`, built first when missing; returns (path, built now)."""
    target = cached_rootfs(spec)
    with _locked(CACHE / f"{spec.name}.lock"):
        if target.is_dir():
            return target, False
        for stale in CACHE.glob(f"{spec.name}-*"):
            if stale.is_dir():
                shutil.rmtree(stale)
        # A debootstrap that finished is kept when a later step fails: the venv step can run again.
        building = CACHE / f".building-{spec.name}"
        debootstrapped = CACHE / f".building-{spec.name}.debootstrapped"
        log.write_text("")
        if not (building.is_dir() and debootstrapped.is_file() and debootstrapped.read_text() == target.name):
            debootstrapped.unlink(missing_ok=True)
            shutil.rmtree(building, ignore_errors=True)
            _debootstrap(spec, building, log)
            debootstrapped.write_text(target.name)
        if spec.with_venv:
            _install_venv(spec, building, wheel, log)
        building.rename(target)
        debootstrapped.unlink()
        return target, True


def _debootstrap(spec: BoardSpec, dest: Path, log: Path) -> None:
    # In a mount namespace of its own: the /proc and /sys it mounts inside `dest` vanish with it,
    # even when it fails half-way.
    command = ["unshare", "--mount", "--propagation", "private", "debootstrap", f"--arch={spec.arch}"]
    command += ["--variant=minbase", f"--include={','.join(spec.packages)}", spec.suite, str(dest), MIRROR]
    _logged(command, log, _DEBOOTSTRAP_SECONDS, f"debootstrap of {spec.suite} {spec.arch}")


def _install_venv(spec: BoardSpec, rootfs: Path, wheel: Path, log: Path) -> None:
    """docs/deploy.md by hand: a venv without pip (minbase has no python3-venv), pip run from its
    wheel, `pip install 'WHEEL[server]'` from PyPI; pytest beside it for the ABI test. pip verifies
    TLS with the host's CA bundle, as a network that re-signs TLS needs."""
    from tests.board.machine import Board  # the board needs a rootfs first: a late import, no cycle

    staged = rootfs / "tmp" / "stage"
    staged.mkdir(parents=True, exist_ok=True)
    pip_wheel = host_pip_wheel(staged)
    shutil.copy2(wheel, staged / wheel.name)
    if HOST_CA.is_file():
        shutil.copy2(HOST_CA, rootfs / BOARD_CA.lstrip("/"))
    system = " --system-site-packages" if spec.system_site_packages else ""
    pip = f"{BOARD_VENV}/bin/python /tmp/stage/{pip_wheel.name}/pip"
    cert = f" --cert {BOARD_CA}" if HOST_CA.is_file() else ""
    options = f"--no-cache-dir --disable-pip-version-check{cert}"
    script = (
        f"set -e; python3 -m venv --without-pip{system} {BOARD_VENV}; "
        f"{pip} install {options} '/tmp/stage/{wheel.name}[server]'; "
        f"{pip} install {options} --target {BOARD_PYTEST} pytest; rm -rf /tmp/stage"
    )
    with Board(rootfs, writable=True) as board:
        result = board.run(script, timeout=_PIP_SECONDS)
    with log.open("a") as out:
        out.write(result.stdout)
    if result.returncode != 0:
        raise RuntimeError(f"installing the venv in the {spec.name} rootfs failed:\n{result.stdout[-3000:]}")


def host_pip_wheel(dest: Path) -> Path:
    """pip's own wheel, as the host's Python bundles it (runnable as `python pip.whl/pip`)."""
    import ensurepip

    bundled = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"))
    if not bundled:
        raise RuntimeError("this Python's ensurepip bundles no pip wheel")
    return Path(shutil.copy2(bundled[-1], dest / bundled[-1].name))


def _logged(command: list[str], log: Path, timeout: float, what: str) -> None:
    with log.open("a") as out:
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {result.returncode}); its output is in {log}")


def missing_prerequisites(specs: list[BoardSpec]) -> str:
    """Why this machine cannot run the emulated boards, or '' when it can."""
    if os.geteuid() != 0:
        return "not root (debootstrap, chroot and binfmt_misc need root)"
    for tool in ("debootstrap", "unshare", "nsenter", "chroot"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install debootstrap util-linux coreutils)"
    for spec in specs:
        if not Path(f"/usr/lib/binfmt.d/qemu-{spec.qemu}.conf").is_file():
            return f"/usr/lib/binfmt.d/qemu-{spec.qemu}.conf is missing (apt-get install qemu-user-static)"
        if shutil.which(spec.cross_cc) is None:
            return (
                f"{spec.cross_cc} is not installed (apt-get install gcc-{spec.cross_cc.removesuffix('-gcc')})"
            )
    try:
        ensure_binfmt_misc()
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", b"") or str(error)
        return f"binfmt_misc cannot be mounted at {BINFMT}: {detail!s}".strip()
    return ""
