"""The model repository (--model-repository DIR): one folder per model, read as hostile content.

A folder's name is the model's v2 name. It is laid out one of two ways. Triton's: numeric version
folders (`NAME/1/model.onnx`, `NAME/2/...`) and an optional `config.pbtxt` (rknn_server.protocols.kserve.pbtxt:
its version_policy picks the versions served, by default the highest; default_model_filename names the
file in each version folder, else `model.onnx` / `model.rknn` as the runtime loads; its inputs and
outputs are checked against the model). Or the project's own, one version: the model's file(s) in
the folder (the main file has a suffix the backend loads: .onnx for the host runtime, .rknn for
rknnrt) and an optional `config.toml`:

    file = "model.onnx"              # the main file, when the folder holds several candidates
    [[inputs]]                       # one table per model input, in the model's order
    name = "image"                   # the name v2 clients use (default: the model's own)
    layout = "NHWC"                  # the layout clients send 4-D data in (default: the model's)
    [[outputs]]
    name = "scores"

Names must be plain folder and file names; symbolic links, named pipes and devices are refused, and
so are subfolders of a model's files (a Triton layout's other plain files and non-numeric folders are
passed over, as Triton does), the config is read with a bounded read and unknown keys are errors. Whoever can write a
folder can swap it or anything in it while the daemon reads it, so the root and each model folder are
opened once (`rknn_server.protocols.kserve.folder`) and every file is listed, opened and read through that
descriptor, never through a path again. A model enters the daemon the way an upload does: its files
are hashed into a manifest, written into the model cache through an upload and verified there, so
what runs (and what its external data check sees) is the cache's copy of the bytes hashed. Error
messages name the model, never a server path.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rknn_proto import rknn_pb2
from rknn_proto.manifest import FileEntry, manifest_digest, valid_digest, valid_file_name
from rknn_server.config.limits import CacheLimits
from rknn_server.errors import DataLoss, InvalidInput, NotFound
from rknn_server.protocols.kserve.folder import FileChanged, Folder, UnsafeEntry, kind_of
from rknn_server.protocols.kserve.pbtxt import CONFIG_PBTXT, ConfigError, TritonConfig, parse_pbtxt
from rknn_server.store.model_cache import ModelCache

CONFIG_FILE = "config.toml"
VERSION_OF_FLAT = "1"  # the one version of a model in the project's own layout
MAX_CONFIG_BYTES = 64 << 10
_TENSOR_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,127}")
_LAYOUTS = ("NCHW", "NHWC")
_TOP_KEYS = ("file", "inputs", "outputs")
_TENSOR_KEYS = {"inputs": ("name", "layout"), "outputs": ("name",)}


class RepositoryError(InvalidInput):
    """A model folder this daemon cannot serve; the message names the model and what is expected."""


@dataclass(frozen=True)
class TensorConfig:
    name: str = ""  # empty: the model's own name
    layout: str = ""  # inputs only; empty: the model's layout


@dataclass(frozen=True)
class ModelConfig:
    file: str = ""
    inputs: tuple[TensorConfig, ...] = ()
    outputs: tuple[TensorConfig, ...] = ()
    triton: TritonConfig | None = None  # a Triton layout's config.pbtxt (then the fields above are unset)


@dataclass(frozen=True)
class ModelFolder:
    """One served version of a model folder as read: its name and version, the folder its files are
    in ("" for the model's folder itself, else the version folder), main file first, and its config."""

    name: str
    version: str
    subfolder: str
    files: tuple[str, ...]
    config: ModelConfig


def valid_model_name(name: str) -> bool:
    """A plain folder name; 64 hex characters are refused, as they address uploaded models."""
    return valid_file_name(name) and not valid_digest(name)


def _loads_toml(model: str, text: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10 board images: the [server] extra installs tomli
        try:
            import tomli as tomllib
        except ImportError:
            raise RepositoryError(
                f"model {model!r}: reading {CONFIG_FILE} on Python 3.10 needs tomli"
            ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RepositoryError(f"model {model!r}: {CONFIG_FILE} is not valid TOML: {exc}") from None


def _tensors(model: str, key: str, value: object) -> tuple[TensorConfig, ...]:
    where = f"model {model!r}: {CONFIG_FILE}"
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise RepositoryError(f"{where}: {key} must be an array of tables ([[{key}]])")
    allowed = _TENSOR_KEYS[key]
    found = []
    for index, item in enumerate(value):
        unknown = sorted(set(item) - set(allowed))
        if unknown:
            raise RepositoryError(
                f"{where}: [[{key}]] {index} has unknown key(s) {unknown}; expected {', '.join(allowed)}"
            )
        name, layout = item.get("name", ""), item.get("layout", "")
        if not isinstance(name, str) or (name and not _TENSOR_NAME.fullmatch(name)):
            raise RepositoryError(
                f"{where}: [[{key}]] {index} name {str(name)[:64]!r} is not allowed; expected 1 to 128 "
                "letters, digits, '_', '.', ':', '/' and '-'"
            )
        if not isinstance(layout, str) or (layout and layout.upper() not in _LAYOUTS):
            raise RepositoryError(
                f"{where}: [[{key}]] {index} layout {str(layout)[:16]!r}; expected one of {', '.join(_LAYOUTS)}"
            )
        found.append(TensorConfig(name, layout.upper()))
    names = [t.name for t in found if t.name]
    if len(set(names)) != len(names):
        raise RepositoryError(f"{where}: [[{key}]] repeats a name ({', '.join(names)})")
    return tuple(found)


def parse_config(model: str, text: str) -> ModelConfig:
    """A model's config.toml, validated: unknown keys and bad values are errors that say what is expected."""
    table = _loads_toml(model, text)
    unknown = sorted(set(table) - set(_TOP_KEYS))
    if unknown:
        raise RepositoryError(
            f"model {model!r}: {CONFIG_FILE} has unknown key(s) {unknown}; expected {', '.join(_TOP_KEYS)}"
        )
    file = table.get("file", "")
    if not isinstance(file, str) or (file and not valid_file_name(file)):
        raise RepositoryError(f"model {model!r}: {CONFIG_FILE}: file must be a plain file name in the folder")
    return ModelConfig(
        file,
        _tensors(model, "inputs", table.get("inputs", [])),
        _tensors(model, "outputs", table.get("outputs", [])),
    )


class ModelRepository:
    """The folders of --model-repository, read on demand (load, index) and imported into the cache.

    The root is opened once; each load opens the model's folder once through it for reading its
    config and once for importing its files, reading everything through that descriptor."""

    def __init__(
        self,
        root: Path,
        suffixes: tuple[str, ...],
        max_model_bytes: int,
        max_model_files: int = CacheLimits.max_model_files,
    ) -> None:
        try:
            self._root = Folder.open(os.path.realpath(root))  # the operator's own links, resolved once
        except (OSError, UnsafeEntry):
            raise RepositoryError(f"--model-repository {root} is not a folder") from None
        self.suffixes = suffixes
        self.max_model_bytes = max_model_bytes
        self.max_model_files = max_model_files

    def names(self) -> list[str]:
        """The model names the repository offers (folders with plain names; others are skipped)."""
        with os.scandir(self._root.fd) as listing:
            return sorted(
                entry.name
                for entry in listing
                if entry.is_dir(follow_symlinks=False) and valid_model_name(entry.name)
            )

    @contextlib.contextmanager
    def _folder(self, name: str, subfolder: str = "") -> Iterator[Folder]:
        """The model's folder (or its version `subfolder`), each opened once (never through a link);
        UnsafeEntry and OSError raised inside name the model, never a path."""
        try:
            folder = Folder.open(name, self._root.fd)
        except (OSError, UnsafeEntry):
            raise NotFound(
                f"the model repository has no model {name!r} (a model is a plain folder, not a symbolic link)"
            ) from None
        where = f"model {name!r}" + (f" version {subfolder}" if subfolder else "")
        try:
            with folder:
                if not subfolder:
                    yield folder
                    return
                with Folder.open(subfolder, folder.fd) as version:
                    yield version
        except UnsafeEntry as exc:
            raise RepositoryError(f"{where}: {exc}; a model's files are plain files only") from None
        except (FileChanged, ConfigError) as exc:
            raise RepositoryError(f"{where}: {exc}") from None
        except OSError as exc:
            raise RepositoryError(
                f"{where}: cannot read its files ({exc.strerror or type(exc).__name__})"
            ) from None

    def read(self, name: str) -> tuple[ModelFolder, ...]:
        """One model's folder, checked (plain files only, bounded sizes, a valid config): each version
        served, lowest first."""
        if not valid_model_name(name):
            raise NotFound(f"{name[:80]!r} is not a model name of the repository (plain folder names only)")
        with self._folder(name) as folder:
            entries = self._entries(name, folder, extra=2)  # the model's files, its config and one more
            versions = [int(e) for e, info in entries.items() if _version_folder(e, info)]
            if CONFIG_PBTXT not in entries and not versions:
                text = _config_text(folder, CONFIG_FILE) if CONFIG_FILE in entries else ""
                return (self._flat(name, entries, parse_config(name, text)),)
            if CONFIG_FILE in entries:
                raise RepositoryError(
                    f"model {name!r} holds both {CONFIG_PBTXT} (Triton's layout) and {CONFIG_FILE}; keep one"
                )
            text = _config_text(folder, CONFIG_PBTXT) if CONFIG_PBTXT in entries else ""
            triton = parse_pbtxt(name, text)
        if not versions:
            raise RepositoryError(
                f"model {name!r} has {CONFIG_PBTXT} but no version folder: Triton's layout keeps the model "
                f"file in {name}/1/ (a folder per version, numbered from 1)"
            )
        missing = sorted(set(triton.policy.versions) - set(versions))
        if missing:
            raise RepositoryError(
                f"model {name!r}: {CONFIG_PBTXT}'s version_policy names version(s) {missing}, which have "
                f"no folder (found {', '.join(map(str, sorted(versions)))})"
            )
        config = ModelConfig(triton=triton)
        return tuple(self._version(name, str(v), config) for v in triton.policy.served(versions))

    def _entries(self, name: str, folder: Folder, extra: int) -> dict[str, os.stat_result]:
        """The folder's entries, bounded; links, pipes and devices refused (anywhere in a model)."""
        entries = folder.entries(self.max_model_files + extra)
        if len(entries) > self.max_model_files + extra - 1:
            raise RepositoryError(
                f"model {name!r} holds over {self.max_model_files} files, over the limit "
                f"max_model_files={self.max_model_files}"
            )
        for file, info in entries.items():
            kind = kind_of(info.st_mode)
            if kind and kind != "a subfolder":
                raise UnsafeEntry(f"{file[:80]!r} is {kind}")
            if not valid_file_name(file):
                raise RepositoryError(f"model {name!r}: file name {file[:80]!r} is not allowed")
        return entries

    def _flat(self, name: str, entries: dict[str, os.stat_result], config: ModelConfig) -> ModelFolder:
        """The project's layout: the model's files in its folder, no subfolder."""
        _plain_files_only(entries)
        files = [file for file in entries if file != CONFIG_FILE]
        self._check_total(name, sum(entries[file].st_size for file in files))
        return ModelFolder(name, VERSION_OF_FLAT, "", self._ordered(name, config, files), config)

    def _version(self, name: str, version: str, config: ModelConfig) -> ModelFolder:
        """A Triton version folder: plain files only, the model file by default_model_filename or as
        the runtime loads (model.onnx, model.rknn)."""
        assert config.triton is not None
        with self._folder(name, version) as folder:
            entries = self._entries(name, folder, extra=1)
            _plain_files_only(entries)
        files = list(entries)
        self._check_total(name, sum(info.st_size for info in entries.values()))
        wanted = [config.triton.default_model_filename] if config.triton.default_model_filename else []
        wanted = wanted or [f"model{suffix}" for suffix in self.suffixes]
        main = next((file for file in wanted if file in files), "")
        if not main:
            raise RepositoryError(
                f"model {name!r} version {version} has no {' or '.join(wanted)} (it holds "
                f"{', '.join(files[:5]) or 'nothing'}); name the file so, or set default_model_filename "
                f"in {CONFIG_PBTXT}"
            )
        return ModelFolder(name, version, version, (main, *sorted(f for f in files if f != main)), config)

    def _check_total(self, name: str, total: int) -> None:
        if total > self.max_model_bytes:
            raise RepositoryError(
                f"model {name!r} is {total} bytes, over the limit max_model_bytes={self.max_model_bytes}"
            )

    def _ordered(self, name: str, config: ModelConfig, files: list[str]) -> tuple[str, ...]:
        if config.file:
            if config.file not in files:
                raise RepositoryError(
                    f"model {name!r}: {CONFIG_FILE} names file {config.file!r}, not in the folder"
                )
            main = config.file
        else:
            candidates = [f for f in files if f.endswith(self.suffixes)]
            if len(candidates) != 1:
                found = f"{len(candidates)} ({', '.join(candidates[:5])})" if candidates else "none"
                raise RepositoryError(
                    f"model {name!r}: expected one model file ({', '.join(self.suffixes)}) in the folder, found "
                    f'{found}; name the main one with file = "..." in {CONFIG_FILE}'
                )
            main = candidates[0]
        return (main, *sorted(f for f in files if f != main))

    def import_into(self, model: ModelFolder, cache: ModelCache) -> str:
        """Bring the model's files into the cache the way an upload does; returns its digest.

        Each file is opened through the folder's descriptor, hashed up to the size checked, then
        copied into an upload from that same file (same inode, size and time, else refused), which
        hashes what it writes and commits only bytes that match: the cache holds exactly the bytes
        hashed, from the files checked. Blocking: run it in the executor."""
        with self._folder(model.name, model.subfolder) as folder:
            hashed: list[tuple[FileEntry, os.stat_result]] = []
            for name in model.files:
                with folder.open_file(name) as file:
                    self._check_total(model.name, sum(e.size for e, _ in hashed) + file.size)
                    hasher = hashlib.sha256()
                    for _, block in file.blocks():
                        hasher.update(block)
                    hashed.append((FileEntry(name, file.size, hasher.hexdigest()), file.info))
            entries = [entry for entry, _ in hashed]
            manifest = rknn_pb2.ModelManifest(
                digest=manifest_digest(entries),
                files=[rknn_pb2.ModelFile(name=e.name, size=e.size, sha256=e.sha256) for e in entries],
            )
            cached, _ = cache.prepare(manifest)
            if not cached:
                _copy(folder, manifest, [info for _, info in hashed], cache)
        return manifest.digest


def _plain_files_only(entries: dict[str, os.stat_result]) -> None:
    """Where a model's files are, a subfolder is refused like a link (_entries let it be listed)."""
    for file, info in entries.items():
        kind = kind_of(info.st_mode)
        if kind:
            raise UnsafeEntry(f"{file[:80]!r} is {kind}")


def _version_folder(name: str, info: os.stat_result) -> bool:
    """A Triton version folder: a subfolder named by a number from 1, without a leading 0 (Triton
    passes over any other subfolder)."""
    return kind_of(info.st_mode) == "a subfolder" and name.isdigit() and not name.startswith("0")


def _config_text(folder: Folder, name: str) -> str:
    """The config file `name`, read through the folder with a bounded read."""
    with folder.open_file(name) as file:
        return file.read_at_most(MAX_CONFIG_BYTES).decode("utf-8", errors="replace")


def _copy(
    folder: Folder, manifest: rknn_pb2.ModelManifest, hashed: list[os.stat_result], cache: ModelCache
) -> None:
    """Write the files just hashed into an upload of `manifest`, refusing any that changed since."""
    upload = cache.begin_upload(manifest, [0] * len(manifest.files))
    try:
        for index, (entry, info) in enumerate(zip(manifest.files, hashed, strict=True)):
            with folder.open_file(entry.name) as file:
                if not file.same_as(info):
                    raise FileChanged(f"{entry.name[:80]!r} changed while it was imported; load it again")
                for offset, block in file.blocks():
                    upload.write(index, offset, block)
        try:
            upload.finish()
        except DataLoss:
            raise FileChanged("its files changed while they were imported; load it again") from None
    finally:
        upload.close()


__all__ = [
    "CONFIG_FILE",
    "VERSION_OF_FLAT",
    "ModelConfig",
    "ModelFolder",
    "ModelRepository",
    "RepositoryError",
    "TensorConfig",
    "parse_config",
    "valid_model_name",
]
