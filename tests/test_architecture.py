"""The rooms and their doors: who may import whom, and what a board-side install pulls in."""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the suite runs on 3.11, boards may not
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
# tomli is not here: the daemon reads `--config rknn_server.toml` with it on Python 3.10 (pure Python).
PC_ONLY = {"adbutils", "onnxruntime", "onnx", "jinja2", "plotly", "pillow", "tqdm"}


def imported_modules(folder: Path) -> dict[Path, set[str]]:
    found: dict[Path, set[str]] = {}
    for path in folder.rglob("*.py"):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[path] = names
    return found


def offenders(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)} imports {name}"
        for path, names in imported_modules(ROOT / folder).items()
        for name in sorted(names)
        if name.split(".")[0] in forbidden or name.startswith(forbidden)
    ]


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("server", ("rknn_client",)),
        ("client", ("rknn_server",)),
        ("proto", ("rknn_server", "rknn_client")),
        (
            "server/runtime",
            (
                "grpc",
                "google.protobuf",
                "rknn_proto.rknn_pb2",
                "rknn_server.protocols.grpc.service",
                "rknn_server.daemon",
                "rknn_server.core.sessions",
            ),
        ),
    ],
)
def test_rooms_import_only_what_the_architecture_allows(folder: str, forbidden: tuple[str, ...]) -> None:
    assert offenders(folder, forbidden) == []


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        # The handlers translate protobuf over the data plane: which backend serves is not their business.
        (
            "server/protocols/grpc/service.py",
            (
                "rknn_server.runtime.host",
                "rknn_server.runtime.rknnrt",
                "rknn_server.runtime.isolated",
                "rknn_server.runtime.select",
                "rknn_server.runtime.backend_hook",
            ),
        ),
        (
            "server/protocols/grpc/pipeline.py",
            (
                "rknn_server.runtime.host",
                "rknn_server.runtime.rknnrt",
                "rknn_server.runtime.isolated",
                "rknn_server.runtime.select",
                "rknn_server.runtime.backend_hook",
            ),
        ),
        # The data plane knows no protocol, so a second one (a legacy listener, KServe v2) can call it.
        (
            "server/core/data_plane.py",
            (
                "grpc",
                "rknn_proto.rknn_pb2",
                "rknn_proto.rknn_pb2_grpc",
                "rknn_server.protocols.grpc.service",
                "rknn_server.core.frames",
                "rknn_server.protocols.grpc.pipeline",
            ),
        ),
        # KServe v2's protocol-neutral half is shared by its gRPC and REST forms: it knows neither.
        *(
            (
                f"server/protocols/kserve/{name}.py",
                (
                    "rknn_proto.kserve",
                    "rknn_server.protocols.http.endpoint",
                    "rknn_server.protocols.kserve.grpc_service",
                    "rknn_server.protocols.kserve.rest",
                    "rknn_server.protocols.grpc.service",
                    "rknn_server.runtime.host",
                    "rknn_server.runtime.rknnrt",
                    "rknn_server.runtime.isolated",
                ),
            )
            for name in ("models", "repository", "datatypes")
        ),
        # The plain messages: what runtimes and the data plane use, without protobuf.
        ("proto/messages.py", ("grpc", "google.protobuf", "rknn_proto.rknn_pb2", "rknn_proto.rknn_pb2_grpc")),
    ],
)
def test_a_module_imports_only_what_its_room_allows(module: str, forbidden: tuple[str, ...]) -> None:
    path = ROOT / module
    names = imported_modules(path.parent)[path]
    # `from rknn_proto import rknn_pb2` names the package: count the names imported from it too.
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    bad = sorted(n for n in names if n.split(".")[0] in forbidden or n.startswith(forbidden))
    assert bad == []


def test_a_board_install_pulls_in_nothing_pc_only() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    board = [*project["dependencies"], *project["optional-dependencies"]["server"]]
    names = {
        req.split(";")[0].split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip().lower()
        for req in board
    }
    assert not names & PC_ONLY, names & PC_ONLY
    uvloop = next(req for req in board if req.startswith("uvloop"))
    assert "armv7l" in uvloop, "uvloop has no armv7 wheels: it must be optional there"


# The client's one way to a daemon is `Device` (client/device.py): credentials, the protocol version and
# the error mapping are applied there, so nothing else holds a stub or reaches into a Device's privates.
DEVICE_MODULES = {"client/device.py", "client/transport/health.py"}
# Everything of Device that is not its public calls (Session, in session.py, uses only those).
DEVICE_PRIVATES = {
    "_stub",
    "_channel",
    "_call",
    "_rpc",
    "_frame_streams",
    "_negotiate",
    "_info",
    "_run_call",
}
STUB_MODULES = ("rknn_proto.rknn_pb2_grpc", "grpc_health.v1.health_pb2_grpc")


def _client_sources() -> dict[str, ast.Module]:
    return {
        str(path.relative_to(ROOT)): ast.parse(path.read_text())
        for path in sorted((ROOT / "client").rglob("*.py"))
        if not path.name.endswith(("_pb2.py", "_pb2_grpc.py"))
    }


def _stub_uses(tree: ast.Module) -> list[str]:
    """Where a module imports a generated stub module or names a `*Stub` class."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            modules = []
        found += [f"line {node.lineno}: imports {m}" for m in modules if m in STUB_MODULES]
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
        if name.endswith("Stub"):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def _foreign_privates(tree: ast.Module, names: set[str] | None = None) -> list[str]:
    """Attribute accesses `x._name` on anything but `self`/`cls` (all private names, or only `names`)."""
    return [
        f"line {node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and (names is None or node.attr in names)
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    ]


def _device_rule_breaches(sources: dict[str, ast.Module]) -> dict[str, list[str]]:
    bad = {
        module: [*_stub_uses(tree), *_foreign_privates(tree, DEVICE_PRIVATES)]
        for module, tree in sources.items()
        if module not in DEVICE_MODULES
    }
    return {module: found for module, found in bad.items() if found}


def test_only_the_device_module_talks_to_the_stub() -> None:
    assert _device_rule_breaches(_client_sources()) == {}


def test_the_device_rule_catches_a_session_reaching_into_the_device() -> None:
    sources = _client_sources()
    sources["client/session.py"].body += ast.parse(
        "def shortcut(session):\n    return session.device._rpc('Run', None, b'')\n"
    ).body
    assert _device_rule_breaches(sources) == {"client/session.py": ["line 2: session.device._rpc"]}


def test_the_compat_layer_uses_only_the_public_client_api() -> None:
    bad: dict[str, list[str]] = {}
    for module, tree in _client_sources().items():
        if not module.startswith("client/compat/"):
            continue
        private_imports = [
            f"line {node.lineno}: imports {alias.name} from {node.module}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            and node.module in ("rknn_client.device", "rknn_client.session")
            for alias in node.names
            if alias.name.startswith("_")
        ]
        if found := [*private_imports, *_foreign_privates(tree)]:
            bad[module] = found
    assert bad == {}


# The daemon's folders are its layers, lowest first (docs/architecture.md): every module is listed
# under its folder, so a new module must be placed (a folder's __init__.py belongs to the folder), and
# a module imports only modules of its own layer or of layers below it.
SERVER_LAYERS: list[tuple[str, dict[str, tuple[str, ...]]]] = [
    # the option parser reads these, and `rknn_server --help` imports nothing else
    ("config", {"": ("__init__",), "config": ("sizes", "options", "limits", "listen", "daemon_config")}),
    ("board", {"board": ("platform", "telemetry", "peers", "allocator")}),
    # runtimes import nothing of the daemon above them
    (
        "runtime",
        {
            "runtime": (
                "base",
                "redact",
                "onnx_graph",
                "external_data",
                "qdq_outputs",
                "host_facts",
                "host_study",
                "host_model",
                "host",
                "isolated",
                "backend_hook",
                "select",
            ),
            "runtime/rknnrt": (
                "abi",
                "library",
                "tensors",
                "plugins",
                "perf_text",
                "layer_dumps",
                "dump_child",
                "freq_pin",
                "model",
                "backend",
            ),
        },
    ),
    ("errors", {"": ("errors",)}),
    (
        "store",
        {
            "store": (
                "durability",
                "block_writer",
                "cache_records",
                "manifests",
                "uploads",
                "quota",
                "verification",
                "model_cache",
                "reservations",
            )
        },
    ),
    ("observe", {"observe": ("logs", "metrics", "calls")}),
    ("core", {"core": ("memory", "sessions", "frames", "shm", "data_plane")}),
    ("kit", {"kit": ("auth", "connections", "guard", "replies")}),  # the front-door kit every door uses
    (
        "protocols",
        {
            "protocols/grpc": ("service", "pipeline", "upload_wire"),
            "protocols/local": ("shm_run", "doorbell"),
            "protocols/http": ("endpoint",),
            "protocols/kserve": (
                "datatypes",
                "pbtxt",
                "folder",
                "repository",
                "session_pools",
                "batcher",
                "models",
                "system_shm",
                "grpc_service",
                "rest",
            ),
            "protocols/legacy": (
                "wire",
                "layouts",
                "messages",
                "intake",
                "startup",
                "connection",
                "listener",
            ),
        },
    ),
    ("composition", {"": ("daemon", "cli", "__main__", "testing")}),
]
# Known exceptions (importer, imported module), each with its reason.
LAYER_EXCEPTIONS = {
    # The toolkit releases the listener speaks are data (a name and offsets); the option parser offers them.
    ("server/config/daemon_config.py", "protocols/legacy/layouts"),
}


# The client's folders, lowest first: the library (Device, Session and what they stand on: transports,
# same-host frames), the features built on it (each may use another, never the commands), and the
# commands (`rknn-client`, `python -m rknn_client.exec`). A feature's own subcommands (farm/cli.py,
# toolkit/cli.py) live in its folder; the commands only gather them.
CLIENT_LAYERS: list[tuple[str, dict[str, tuple[str, ...]]]] = [
    (
        "library",
        {
            "": (
                "__init__",
                "lazy",
                "user_cache",
                "errors",
                "negotiate",
                "model_files",
                "digest_cache",
                "progress",
                "upload_stream",
                "reservation",
                "timing",
                "report",
                "input_files",
                "frame_spec",
                "pipeline",
                "routes",
                "session",
                "device",
            ),
            "transport": ("base", "security", "resolve", "tcp", "adb", "private", "health"),
            "local": ("doorbell", "shared_memory"),
        },
    ),
    (
        "features",
        {
            "boards": ("shell", "doctor", "devices"),
            "deploy": ("board", "bundle", "install"),
            "toolkit": ("locate", "install", "bridge", "worker", "cli"),
            "accuracy": (
                "errors",
                "preprocess",
                "layers",
                "fusion",
                "quantize",
                "calibrate",
                "build",
                "capture",
                "runtime_side",
                "compare",
                "text_dump",
                "summary",
                "report",
                "analysis",
                "steps",
                "session",
                "single",
            ),
            "compat": (
                "aliases",
                "config_rules",
                "core_masks",
                "custom_op",
                "inputs",
                "lite",
                "onnx_build",
                "onnx_edit",
                "rknn_state",
                "rknn",
                "rknn_file",
                "shapes",
                "toolkit_log",
                "toolkit_route",
            ),
            "load": ("ranges", "windows", "drivers", "ctrl_c", "output", "command"),
            "farm": (
                "auth",
                "inventory",
                "probe",
                "pool",
                "progress",
                "compare",
                "report",
                "runner",
                "check",
                "labgrid_agent",
                "labgrid_driver",
                "labgrid_farm",
                "pytest_plugin",
                "cli",
            ),
        },
    ),
    ("commands", {"cli": ("parser", "boards", "commands", "__main__"), "": ("exec",)}),
]


@dataclass(frozen=True)
class Tree:
    """One package's source folder, its import name and its layers (lowest first)."""

    folder: str
    package: str
    layers: list[tuple[str, dict[str, tuple[str, ...]]]]
    exceptions: frozenset[tuple[str, str]] = frozenset()

    def placed(self) -> dict[str, str]:
        """Each placed module's path under the folder (without .py) -> its layer; folders' __init__ too."""
        placed: dict[str, str] = {}
        for layer, folders in self.layers:
            for folder, modules in folders.items():
                for module in modules:
                    placed[f"{folder}/{module}".lstrip("/")] = layer
                parts = folder.split("/") if folder else []
                for end in range(1, len(parts) + 1):  # a folder's package, and the packages above it
                    placed.setdefault("/".join(parts[:end]) + "/__init__", layer)
        return placed

    def modules(self) -> list[str]:
        """The folder's modules, as paths under it without .py (package data such as the toolkit's
        torch-stub, in no importable folder, left out)."""
        found = []
        for path in (ROOT / self.folder).rglob("*.py"):
            relative = path.relative_to(ROOT / self.folder).with_suffix("")
            if all(part.isidentifier() for part in relative.parts):
                found.append(str(relative))
        return sorted(found)

    def misplaced(self, modules: list[str]) -> list[str]:
        listed = [
            f"{folder}/{m}".lstrip("/")
            for _, folders in self.layers
            for folder, ms in folders.items()
            for m in ms
        ]
        twice = sorted({name for name in listed if listed.count(name) > 1})
        placed = self.placed()
        return (
            [f"{n} is listed twice" for n in twice]
            + [
                f"{self.folder}/{n}.py is in no folder's list of its layers"
                for n in modules
                if n not in placed
            ]
            + [
                f"{self.folder}/{n}.py is listed but does not exist"
                for n in sorted(set(placed) - set(modules))
            ]
        )

    def imports(self) -> dict[str, set[str]]:
        """Each module's path -> the names of this package it imports."""
        return {
            f"{self.folder}/{module}.py": _imports_of(ROOT / self.folder / f"{module}.py", self.package)
            for module in self.modules()
        }

    def reaching_up(self, imports: dict[str, set[str]]) -> list[str]:
        """Each import of a module of a layer above the importer's (path -> its imports)."""
        placed = self.placed()
        rank = {layer: index for index, (layer, _) in enumerate(self.layers)}
        found = []
        for path, names in sorted(imports.items()):
            mine = placed[path.removeprefix(f"{self.folder}/").removesuffix(".py")]
            for name in sorted(names):
                target = _module_of(name, placed)
                if target is None or (path, target) in self.exceptions:
                    continue
                if rank[placed[target]] > rank[mine]:
                    found.append(f"{path} ({mine}) imports {name} ({placed[target]})")
        return found


SERVER = Tree("server", "rknn_server", SERVER_LAYERS, frozenset(LAYER_EXCEPTIONS))
CLIENT = Tree("client", "rknn_client", CLIENT_LAYERS)


def _module_of(dotted: str, placed: dict[str, str]) -> str | None:
    """The placed module or package a dotted name imports (its longest known prefix)."""
    parts = dotted.split(".")[1:]
    for end in range(len(parts), -1, -1):
        path = "/".join(parts[:end])
        for candidate in (path, f"{path}/__init__" if path else "__init__"):
            if candidate in placed:
                return candidate
    return None


def _imports_of(path: Path, package: str) -> set[str]:
    """The names of `package` that `path` imports (`from x import y` counts x.y), leaving out imports
    only a type checker runs (`if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skipped.update(id(inner) for inner in ast.walk(node))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name == package or name.startswith(f"{package}.")}


@pytest.mark.parametrize("tree", [SERVER, CLIENT], ids=["server", "client"])
def test_every_module_is_placed_in_its_folder(tree: Tree) -> None:
    assert tree.misplaced(tree.modules()) == []


@pytest.mark.parametrize("tree", [SERVER, CLIENT], ids=["server", "client"])
def test_each_layer_imports_only_itself_and_the_layers_below(tree: Tree) -> None:
    assert tree.reaching_up(tree.imports()) == []


def test_the_layer_rules_catch_a_new_module_and_one_that_reaches_up() -> None:
    """The rules can fail: a module placed nowhere, and the store importing a door, are reported."""
    assert SERVER.misplaced([*SERVER.modules(), "core/scheduler"]) == [
        "server/core/scheduler.py is in no folder's list of its layers"
    ]
    imports = SERVER.imports()
    imports["server/store/model_cache.py"] = {
        "rknn_server.protocols.grpc.service.RknnService",
        "rknn_server.errors",
    }
    assert SERVER.reaching_up(imports) == [
        "server/store/model_cache.py (store) imports rknn_server.protocols.grpc.service.RknnService (protocols)"
    ]


def test_the_client_rules_catch_a_stray_module_and_a_library_that_imports_a_command() -> None:
    assert CLIENT.misplaced([*CLIENT.modules(), "helpers"]) == [
        "client/helpers.py is in no folder's list of its layers"
    ]
    imports = CLIENT.imports()
    imports["client/session.py"] |= {"rknn_client.cli.commands.main"}
    imports["client/deploy/install.py"] |= {"rknn_client.cli.parser.Parser"}
    assert CLIENT.reaching_up(imports) == [
        "client/deploy/install.py (features) imports rknn_client.cli.parser.Parser (commands)",
        "client/session.py (library) imports rknn_client.cli.commands.main (commands)",
    ]


def test_an_upload_knows_nothing_of_the_cache_that_begins_it() -> None:
    """No call cycle in the store: the cache begins an upload and hands it a `Destination` (its
    folder, its commit, its release); uploads.py imports nothing of model_cache, not even for types."""
    tree = ast.parse((ROOT / "server/store/uploads.py").read_text())
    modules = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    modules |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not [name for name in modules if "model_cache" in name]


# Who is calling is decided in the front-door kit alone (kit/auth.py's AccessPolicy and the
# connection identities of kit/connections.py): a door never reads a socket's owner or a token itself.
IDENTITY_SOURCES = ("rknn_server.board.peers", "rknn_server.kit.auth.TokenTable")


def _doors_admitting(imports: dict[str, set[str]]) -> list[str]:
    return [
        f"{path} decides who is calling outside the kit: imports {name}"
        for path, names in sorted(imports.items())
        if path.startswith("server/protocols/")
        for name in sorted(names)
        if name.startswith(IDENTITY_SOURCES)
    ]


def test_doors_admit_callers_only_through_the_kit() -> None:
    assert _doors_admitting(SERVER.imports()) == []


def test_the_admission_rule_catches_a_door_that_identifies_callers_itself() -> None:
    imports = SERVER.imports()
    imports["server/protocols/legacy/listener.py"] |= {"rknn_server.board.peers.socket_owner"}
    assert _doors_admitting(imports) == [
        "server/protocols/legacy/listener.py decides who is calling outside the kit: "
        "imports rknn_server.board.peers.socket_owner"
    ]


# Where a model's runtime is called to run: the data plane's one timed path, and the shared-memory
# frames it runs (shm_run prepares a frame whose run the plane calls under the session's lock).
RUNS_A_MODEL = ("run", "run_into", "bind")
RUNNERS = {"server/core/data_plane.py", "server/protocols/local/shm_run.py"}


def _model_runs(source: str) -> list[int]:
    """Lines of `source` that call a runtime's run methods (`<...>runtime.run(...)` and alike)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in RUNS_A_MODEL:
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name in ("runtime", "_runtime"):
                lines.append(node.lineno)
    return lines


def _doors_running_models(files: dict[str, str]) -> list[str]:
    return [
        f"{path}:{line} runs a model outside the data plane (DataPlane.run, in_session)"
        for path, source in sorted(files.items())
        if path not in RUNNERS and not path.startswith("server/runtime/")
        for line in _model_runs(source)
    ]


def _server_sources() -> dict[str, str]:
    return {
        str(path.relative_to(ROOT)): path.read_text()
        for path in (ROOT / "server").rglob("*.py")
        if not path.name.endswith(("_pb2.py", "_pb2_grpc.py"))
    }


def test_models_run_only_through_the_data_plane() -> None:
    """Every door's model runs take the one timed path (metrics, records, the session's checks)."""
    assert _doors_running_models(_server_sources()) == []


def test_the_run_rule_catches_a_door_that_runs_a_model_itself() -> None:
    sources = _server_sources()
    sources["server/protocols/legacy/connection.py"] += (
        "\n\ndef shortcut(session):\n    return session.runtime.run([], None)\n"
    )
    (found,) = _doors_running_models(sources)
    assert found.startswith("server/protocols/legacy/connection.py:") and "outside the data plane" in found


# tests/unit mirrors the source tree: a unit test sits in the folder (under its package's) of a module
# it imports, so a module's tests are found beside where it lives.
UNIT_PACKAGES = {"client": "rknn_client", "server": "rknn_server", "proto": "rknn_proto"}


def _folder_of(dotted: str, folder: str) -> str | None:
    """The folder, under the package's source folder, of the module a dotted name imports."""
    parts = dotted.split(".")[1:]
    for end in range(len(parts), -1, -1):
        path = ROOT / folder / "/".join(parts[:end])
        if path.with_suffix(".py").is_file():
            return "/".join(parts[: end - 1])
        if (path / "__init__.py").is_file():
            return "/".join(parts[:end])
    return None


def _unit_tests_astray(tests: dict[str, set[str]]) -> list[str]:
    """Each unit test (path under tests/unit -> the package names it imports) in no folder of them."""
    astray = []
    for path, names in sorted(tests.items()):
        folder, *rest = path.split("/")
        where = "/".join(rest[:-1])
        folders = sorted({f for name in names if (f := _folder_of(name, folder)) is not None})
        if where not in folders:
            astray.append(f"tests/unit/{path} tests {folder}/{{{', '.join(folders)}}}, not {folder}/{where}")
    return astray


def _unit_tests() -> dict[str, set[str]]:
    found = {}
    for folder, package in UNIT_PACKAGES.items():
        for path in (ROOT / "tests/unit" / folder).rglob("test_*.py"):
            found[str(path.relative_to(ROOT / "tests/unit"))] = _imports_of(path, package)
    return found


def test_unit_tests_mirror_the_source_tree() -> None:
    assert _unit_tests_astray(_unit_tests()) == []


def test_the_mirror_rule_catches_a_test_beside_the_wrong_folder() -> None:
    tests = _unit_tests()
    tests["client/test_windows.py"] = {"rknn_client.load.windows.Window"}
    tests["server/core/test_guard.py"] = {"rknn_server.kit.guard.Guard", "rknn_server.errors"}
    assert _unit_tests_astray(tests) == [
        "tests/unit/client/test_windows.py tests client/{load}, not client/",
        "tests/unit/server/core/test_guard.py tests server/{, kit}, not server/core",
    ]
