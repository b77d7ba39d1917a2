"""What the daemon is started with: every option of `rknn_server serve` as one value. Light on purpose
(no daemon code): the option parser reads its defaults, so `rknn_server --help` stays fast."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rknn_server.config.limits import Limits
from rknn_server.config.listen import DEFAULT_LISTEN, ListenAddress, parse_listen
from rknn_server.protocols.legacy.layouts import DEFAULT_VERSION

if TYPE_CHECKING:
    from rknn_server.kit.auth import TlsFiles


@dataclass
class DaemonConfig:
    listen: list[ListenAddress] = field(default_factory=lambda: [parse_listen(a) for a in DEFAULT_LISTEN])
    runtime: str = "auto"
    soc: str = ""
    model_cache: Path = field(default_factory=lambda: Path("~/.cache/rknn_server").expanduser())
    limits: Limits = field(default_factory=Limits.for_machine)  # every limit (server/config/limits.py)
    verify_interval_s: float = 86400.0  # re-hash each cached model this often (0: only when its files change)
    model_repository: Path | None = None  # KServe v2 models by folder name (server/kserve)
    verify_cache: bool = False  # re-hash every cached model at start-up, before serving
    isolation: str = "thread"  # "thread": in the daemon; "process": one worker process per session
    threads: int | None = None
    grace_s: float = 10.0
    exit_with_stdin: bool = False
    runtime_lib: Path | None = None  # librknnrt/librknnmrt to load instead of searching for one
    plugin_dir: Path | None = None  # custom-op plugins for the rknnrt runtime
    sysfs_root: Path = Path("/")  # where the platform probe reads /proc, /sys and /dev
    auth_token_file: Path | None = None
    trust_loopback: bool = False  # let this machine's callers in without a token or certificate
    tls: TlsFiles | None = None
    insecure: bool = False
    backend: str = ""  # MODULE:CALLABLE serving instead of `runtime` (see runtime/backend_hook.py)
    metrics_listen: ListenAddress | None = None  # HTTP: /metrics and the KServe v2 health endpoints
    ready_file: Path | None = None  # JSON of the bound listeners, written once serving (rknn_proto.ready)
    # Where the RKNN-Toolkit2 protocol is served (server/legacy): None = the default, () = off.
    legacy_listen: tuple[str, ...] | None = None
    legacy_toolkit: str = DEFAULT_VERSION  # whose message layout it speaks (a key of layouts.RELEASES)
    shm: bool = True  # offer shared-memory tensors to same-host callers (server/core/shm.py)

    def enforced_limits(self) -> Limits:
        """The limits as served: a call deadline binds worker processes only (a thread cannot be killed)."""
        return self.limits if self.isolation == "process" else self.limits.without_call_timeout()
