"""Emulated board images: Debian root filesystems of another architecture, made with mmdebstrap, run
through qemu-user-static under a binfmt_misc handler of our own, and cached between runs.

A rootfs is built once per key (what it depends on: the suite, the architecture, the packages, this
file's RECIPE, and for the boards that carry the daemon's venv the daemon's dependencies) under
~/.cache/rknn_client/board/ (or RKNN_BOARD_CACHE), outside the clone, so a fresh clone on the same
machine reuses it.
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
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rknn_client.deploy.board import BoardFacts
from rknn_client.deploy.bundle import build_bundle

if TYPE_CHECKING:
    from tests.board.machine import Board

if sys.version_info >= (3, 11):
    import tomllib
else:  # the dev extra installs tomli below 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
# RKNN_BOARD_CACHE moves the cache (a fresh folder measures a cold build as a fresh CI machine sees it).
ENV_CACHE = "RKNN_BOARD_CACHE"
CACHE = Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "rknn_client" / "board")
BINFMT = Path("/proc/sys/fs/binfmt_misc")
MIRROR = "http://deb.debian.org/debian"
# Bump when the way a rootfs is made changes, so cached ones are rebuilt.
RECIPE = 2
# Where the board venv is made by hand, as docs/deploy.md says (deploy's own install dir).
BOARD_VENV = "/opt/rknn-server"
# pytest for the ABI test inside the board, kept apart from the daemon's venv.
BOARD_PYTEST = "/opt/board-test/pytest"
HANDLER_PREFIX = "rknn-board-"
# A cold build of one image, everything included (about 5 min on an idle 2-core machine).
BUILD_SECONDS = 1500
# Unpacked by no test: left out of the images.
_EXCLUDED = ("/usr/share/doc", "/usr/share/man", "/usr/share/info", "/usr/share/locale")


@dataclass(frozen=True)
class BoardSpec:
    """One emulated board image."""

    name: str
    suite: str  # Debian release
    arch: str  # Debian architecture (mmdebstrap --arch)
    qemu: str  # qemu's name for it (/usr/lib/binfmt.d/qemu-NAME.conf)
    machine: str  # what `uname -m` says on the board
    cross_cc: str  # the cross compiler for the stand-in runtime
    # Debian's essential set plus python3 and libstdc++6 (grpcio's C++ core needs it; minbase has it
    # through apt). No ca-certificates: nothing on the board goes online (its wheels come from this
    # PC), and its configure step is minutes of emulated shell.
    packages: tuple[str, ...] = ("python3", "libstdc++6")
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
        packages=("python3", "libstdc++6", "python3-numpy"),
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


class Deadline:
    """One image build's time limit: each step gets what is left, and running out names the step, so a
    stuck mirror or an emulated process that never ends fails the run instead of hanging it."""

    def __init__(self, board: str, seconds: float) -> None:
        self.board, self.seconds, self.end = board, seconds, time.monotonic() + seconds

    def left(self, doing: str) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise self.expired(doing)
        return left

    def expired(self, doing: str) -> TimeoutError:
        return TimeoutError(
            f"building the {self.board} image passed its {self.seconds:.0f} s deadline while {doing}"
        )


@contextlib.contextmanager
def _locked(path: Path, deadline: Deadline) -> Iterator[None]:
    """One builder per cache entry at a time (two runs on one machine wait for each other, not forever)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                deadline.left(f"waiting for another run's build ({path} is locked)")
                time.sleep(1)
        yield


def ensure_rootfs(spec: BoardSpec, log: Path, seconds: float = BUILD_SECONDS) -> tuple[Path, bool]:
    """The cached rootfs for `spec`, built first when missing; returns (path, built now)."""
    target = cached_rootfs(spec)
    deadline = Deadline(spec.name, seconds)
    with _locked(CACHE / f"{spec.name}.lock", deadline):
        if target.is_dir():
            return target, False
        for stale in CACHE.glob(f"{spec.name}-*"):
            if stale.is_dir():
                shutil.rmtree(stale)
        # A bootstrap that finished is kept when a later step fails: the venv step can run again.
        building = CACHE / f".building-{spec.name}"
        bootstrapped = CACHE / f".building-{spec.name}.bootstrapped"
        log.write_text("")
        if not (building.is_dir() and bootstrapped.is_file() and bootstrapped.read_text() == target.name):
            bootstrapped.unlink(missing_ok=True)
            shutil.rmtree(building, ignore_errors=True)
            _bootstrap(spec, building, log, deadline)
            bootstrapped.write_text(target.name)
        if spec.with_venv:
            _install_venv(spec, building, log, deadline)
        building.rename(target)
        bootstrapped.unlink()
        return target, True


def _bootstrap(spec: BoardSpec, dest: Path, log: Path, deadline: Deadline) -> None:
    """mmdebstrap's essential set plus the spec's packages: apt fetches them in parallel, the host
    unpacks them, and one dpkg run configures them under qemu (debootstrap's per-package second stage
    was the slow part). In a mount namespace of its own: the /proc and /sys it mounts inside `dest`
    vanish with it, even when it fails half-way. No docs, man pages or locales: nothing here reads them."""
    command = ["unshare", "--mount", "--propagation", "private", "mmdebstrap", "--mode=root"]
    command += ["--variant=essential", f"--arch={spec.arch}", f"--include={','.join(spec.packages)}"]
    # Debian's binfmt line has the F flag, but under our own handler name mmdebstrap cannot see it.
    command += ["--skip=check/qemu", *(f"--dpkgopt=path-exclude={p}/*" for p in _EXCLUDED)]
    command += [spec.suite, str(dest), MIRROR]
    doing = f"bootstrapping {spec.suite} {spec.arch} with mmdebstrap"
    logged(command, log, deadline, doing)


def _install_venv(spec: BoardSpec, rootfs: Path, log: Path, deadline: Deadline) -> None:
    """docs/deploy.md by hand: a venv without pip (the image has no python3-venv), pip run from its
    wheel, the `[server]` install; pytest beside it for the ABI test. The wheels come from deploy's own
    bundle, downloaded on this PC for the board (an emulated pip resolver and downloads are minutes)."""
    from tests.board.machine import Board  # the board needs a rootfs first: a late import, no cycle

    staged = rootfs / "tmp" / "stage"
    with Board(rootfs, writable=True) as board:
        facts = _facts(spec, board)
        deadline.left("downloading the board's wheels on this PC")
        bundle = build_bundle(facts, staged)
        pytest_wheels = ["--only-binary=:all:", "--python-version", facts.python_tag, "--dest", str(staged)]
        logged(
            [sys.executable, "-m", "pip", "download", *pytest_wheels, "pytest"],
            log,
            deadline,
            "downloading pytest",
        )
        system = " --system-site-packages" if bundle.system_site_packages else ""
        pip = f"{BOARD_VENV}/bin/python /tmp/stage/{bundle.pip_wheel}/pip"
        options = "--no-index --find-links /tmp/stage --no-cache-dir --disable-pip-version-check"
        script = (
            f"set -e; python3 -m venv --without-pip{system} {BOARD_VENV}; "
            f"{pip} install {options} '/tmp/stage/{bundle.project_wheel}[server]'; "
            f"{pip} install {options} --target {BOARD_PYTEST} pytest; rm -rf /tmp/stage"
        )
        doing = f"installing the venv in the {spec.name} rootfs"
        try:
            result = board.run(script, timeout=deadline.left(doing))
        except subprocess.TimeoutExpired:
            raise deadline.expired(doing) from None
    with log.open("a") as out:
        out.write(result.stdout)
    if result.returncode != 0:
        raise RuntimeError(f"{doing} failed:\n{result.stdout[-3000:]}")


def _facts(spec: BoardSpec, board: Board) -> BoardFacts:
    """What deploy would probe on this image: its Python and glibc, for the bundle's wheel tags."""
    probe = "import sys, platform; print('%d.%d' % sys.version_info[:2], platform.libc_ver()[1])"
    words = board.run(f'python3 -c "{probe}"').stdout.split()
    if len(words) != 2:
        raise RuntimeError(f"the {spec.name} image's python3 did not say its version: {words}")
    major, minor = words[0].split(".")
    python = (int(major), int(minor))
    return BoardFacts(
        serial=spec.name,
        arch=spec.machine,
        android=False,
        python=python,
        libc="glibc",
        libc_version=words[1],
        installed_version="",
        running_pid=None,
    )


def host_pip_wheel(dest: Path) -> Path:
    """pip's own wheel, as the host's Python bundles it (runnable as `python pip.whl/pip`)."""
    import ensurepip

    bundled = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"))
    if not bundled:
        raise RuntimeError("this Python's ensurepip bundles no pip wheel")
    return Path(shutil.copy2(bundled[-1], dest / bundled[-1].name))


def logged(command: list[str], log: Path, deadline: Deadline, doing: str) -> None:
    """Run one build step with its output in `log`, within what is left of the deadline."""
    with log.open("a") as out:
        try:
            result = subprocess.run(
                command, stdout=out, stderr=subprocess.STDOUT, timeout=deadline.left(doing), check=False
            )
        except subprocess.TimeoutExpired:
            raise deadline.expired(doing) from None
    if result.returncode != 0:
        raise RuntimeError(f"{doing} failed (exit {result.returncode}); its output is in {log}")
