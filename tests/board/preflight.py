"""Whether this machine can run the emulated boards at all, and reach what a run downloads from. Either
missing makes `make board-test` skip with the reason (exit 0): a machine without them has nothing to
test, while a failure once they are there is a real one."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from tests.board.rootfs import BINFMT, CACHE, MIRROR, BoardSpec, cached_rootfs, ensure_binfmt_misc

_NETWORK_SECONDS = 20
PYPI = "https://pypi.org/simple"


def missing_prerequisites(specs: list[BoardSpec]) -> str:
    """Why this machine cannot run the emulated boards, or '' when it can."""
    if os.geteuid() != 0:
        return "not root (mmdebstrap, chroot and binfmt_misc need root)"
    for tool in ("mmdebstrap", "unshare", "nsenter", "chroot"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install mmdebstrap util-linux coreutils)"
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
    if not os.access(BINFMT / "register", os.W_OK):
        return f"{BINFMT}/register is not writable here (a container without binfmt_misc rights)"
    return _namespace_problem()


def _namespace_problem() -> str:
    """Why a board cannot boot here ('' when it can): a PID namespace and an overlay over the cache's
    file system, which some container file systems refuse."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix=".probe-") as probe:
        for name in ("lower", "upper", "work", "root"):
            (Path(probe) / name).mkdir()
        options = f"lowerdir={probe}/lower,upperdir={probe}/upper,workdir={probe}/work"
        script = f"mount -t overlay overlay -o {options} {probe}/root && echo ok"
        command = ["unshare", "--pid", "--fork", "--mount", "--propagation", "private", "sh", "-c", script]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if result.stdout.strip() == "ok":
        return ""
    return f"a PID namespace with an overlay mount under {CACHE} failed: {result.stderr.strip()[-300:]}"


def unreachable(specs: list[BoardSpec]) -> str:
    """What a run needs online and cannot reach ('' when all answer): the package index the deploy
    bundle and the images download from, and Debian's mirror when an image is still to be built."""
    index = os.environ.get("PIP_INDEX_URL", PYPI).rstrip("/")
    urls = [f"{index}/pip/"]
    urls += [f"{MIRROR}/dists/{s.suite}/Release" for s in specs if not cached_rootfs(s).is_dir()]
    context = ssl.create_default_context(cafile=os.environ.get("PIP_CERT") or None)
    for url in dict.fromkeys(urls):
        try:
            request = urllib.request.Request(url, method="HEAD")
            with urllib.request.urlopen(request, timeout=_NETWORK_SECONDS, context=context):
                pass
        except (OSError, urllib.error.URLError) as error:
            return f"cannot reach {url} ({error})"
    return ""
