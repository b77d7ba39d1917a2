"""The model repository (--model-repository DIR): one folder per model, read as hostile content.

A folder's name is the model's v2 name; it holds the model's file(s) (the main file has a suffix the
backend loads: .onnx for the host runtime, .rknn for rknnrt) and an optional `config.toml`:

    file = "model.onnx"              # the main file, when the folder holds several candidates
    [[inputs]]                       # one table per model input, in the model's order
    name = "image"                   # the name v2 clients use (default: the model's own)
    layout = "NHWC"                  # the layout clients send 4-D data in (default: the model's)
    [[outputs]]
    name = "scores"

Names must be plain folder and file names, symbolic links and subfolders are refused, the config is
size-bounded and unknown keys are errors. A model enters the daemon the way an upload does: its files
are hashed into a manifest, written into the model cache through an upload and verified there, so
what runs is what the cache verified. Error messages name the model, never a server path.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rknn_proto import rknn_pb2
from rknn_proto.manifest import FileEntry, manifest_digest, valid_digest, valid_file_name
from rknn_server.errors import InvalidInput, NotFound
from rknn_server.model_cache import ModelCache

CONFIG_FILE = "config.toml"
MAX_CONFIG_BYTES = 64 << 10
_READ_BYTES = 4 << 20
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


@dataclass(frozen=True)
class ModelFolder:
    """A model folder as read: its name, main file first, and its config."""

    name: str
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


def _open_plain(path: Path) -> int:
    """A descriptor of a regular file, never through a symbolic link."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path.name} is not a regular file")
    return fd


def _blocks(path: Path) -> Iterator[bytes]:
    fd = _open_plain(path)
    try:
        while block := os.read(fd, _READ_BYTES):
            yield block
    finally:
        os.close(fd)


class ModelRepository:
    """The folders of --model-repository, read on demand (load, index) and imported into the cache."""

    def __init__(self, root: Path, suffixes: tuple[str, ...], max_model_bytes: int) -> None:
        if not root.is_dir():
            raise RepositoryError(f"--model-repository {root} is not a folder")
        self.root = root
        self.suffixes = suffixes
        self.max_model_bytes = max_model_bytes

    def names(self) -> list[str]:
        """The model names the repository offers (folders with plain names; others are skipped)."""
        return sorted(
            entry.name
            for entry in os.scandir(self.root)
            if entry.is_dir(follow_symlinks=False) and valid_model_name(entry.name)
        )

    def read(self, name: str) -> ModelFolder:
        """One model's folder, checked: plain files only, bounded sizes, a valid config."""
        if not valid_model_name(name):
            raise NotFound(f"{name[:80]!r} is not a model name of the repository (plain folder names only)")
        folder = self.root / name
        try:
            entries = list(os.scandir(folder)) if folder.is_dir() and not folder.is_symlink() else None
        except OSError:
            entries = None
        if entries is None:
            raise NotFound(f"the model repository has no model {name!r}")
        text = ""
        files: list[tuple[str, int]] = []
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name.startswith("."):
                continue
            if entry.is_symlink() or not entry.is_file(follow_symlinks=False):
                kind = "a symbolic link" if entry.is_symlink() else "a subfolder"
                raise RepositoryError(
                    f"model {name!r}: {entry.name[:80]!r} is {kind}; a model folder holds plain files only"
                )
            if not valid_file_name(entry.name):
                raise RepositoryError(f"model {name!r}: file name {entry.name[:80]!r} is not allowed")
            size = entry.stat(follow_symlinks=False).st_size
            if entry.name == CONFIG_FILE:
                if size > MAX_CONFIG_BYTES:
                    raise RepositoryError(
                        f"model {name!r}: {CONFIG_FILE} is {size} bytes, over {MAX_CONFIG_BYTES}"
                    )
                text = b"".join(_blocks(folder / entry.name)).decode("utf-8", errors="replace")
            else:
                files.append((entry.name, size))
        config = parse_config(name, text)
        total = sum(size for _, size in files)
        if total > self.max_model_bytes:
            raise RepositoryError(
                f"model {name!r} is {total} bytes, over the limit max_model_bytes={self.max_model_bytes}"
            )
        return ModelFolder(name, self._ordered(name, config, [n for n, _ in files]), config)

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
        """Bring the model's files into the cache the way an upload does (hashed, written, verified
        there); returns its digest. Blocking: run it in the executor."""
        folder = self.root / model.name
        entries = []
        try:
            for name in model.files:
                size, hasher = 0, hashlib.sha256()
                for block in _blocks(folder / name):
                    size += len(block)
                    hasher.update(block)
                entries.append(FileEntry(name, size, hasher.hexdigest()))
            manifest = rknn_pb2.ModelManifest(
                digest=manifest_digest(entries),
                files=[rknn_pb2.ModelFile(name=e.name, size=e.size, sha256=e.sha256) for e in entries],
            )
            cached, _ = cache.prepare(manifest)
            if cached:
                return manifest.digest
            upload = cache.begin_upload(manifest, [0] * len(entries))
            try:
                for index, name in enumerate(model.files):
                    offset = 0
                    for block in _blocks(folder / name):
                        upload.write(index, offset, block)
                        offset += len(block)
                upload.finish()
            finally:
                upload.close()
        except OSError as exc:
            raise RepositoryError(
                f"model {model.name!r}: cannot read its files ({exc.strerror or 'not a regular file'})"
            ) from None
        return manifest.digest


__all__ = [
    "CONFIG_FILE",
    "ModelConfig",
    "ModelFolder",
    "ModelRepository",
    "RepositoryError",
    "TensorConfig",
    "parse_config",
    "valid_model_name",
]
