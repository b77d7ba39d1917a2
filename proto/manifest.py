"""A model's content address: one digest over all of its files.

The digest is the sha256 of one line ``"<sha256> <size> <name>\\n"`` per file, main file first and
the others sorted by name, so that a model with ONNX external data is one cache entry and renaming
or changing any of its files changes the address.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rknn_proto import rknn_pb2

# Names a model file may carry on the wire and in the cache: no separators, no leading dot.
# Private, and only ever fullmatched: `$` with .match also accepts a trailing newline.
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_READ_BYTES = 1 << 20


@dataclass(frozen=True)
class FileEntry:
    name: str
    size: int
    sha256: str


def valid_file_name(name: str) -> bool:
    return bool(_FILE_NAME.fullmatch(name)) and ".." not in name


def valid_digest(text: str) -> bool:
    """A sha256 in the form the contract uses: 64 lower-case hex characters, nothing more."""
    return bool(_HEX_DIGEST.fullmatch(text))


def manifest_digest(files: Sequence[FileEntry]) -> str:
    """Digest of a manifest whose first entry is the main file."""
    if not files:
        raise ValueError("a model has at least one file")
    ordered = [files[0], *sorted(files[1:], key=lambda f: f.name)]
    text = "".join(f"{f.sha256} {f.size} {f.name}\n" for f in ordered)
    return hashlib.sha256(text.encode()).hexdigest()


def file_sha256(path: Path, progress: Callable[[int], None] | None = None) -> str:
    """The file's SHA-256; `progress` hears each block's size as it is hashed (big models take a while)."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(_READ_BYTES):
            h.update(block)
            if progress is not None:
                progress(len(block))
    return h.hexdigest()


def describe_files(
    paths: Sequence[Path],
    progress: Callable[[int], None] | None = None,
    hash_file: Callable[[Path, Callable[[int], None] | None], str] = file_sha256,
) -> rknn_pb2.ModelManifest:
    """Build the manifest of a model from its files on disk (paths[0] is the main file); `progress`
    hears the bytes hashed; `hash_file` may answer from a memory of digests (the client's)."""
    entries = [FileEntry(p.name, p.stat().st_size, hash_file(p, progress)) for p in paths]
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"model files must have distinct names, got {names}")
    for e in entries:
        if not valid_file_name(e.name):
            raise ValueError(
                f"model file name {e.name!r} is not allowed: use letters, digits, '.', '_' and '-' only"
            )
    ordered = [entries[0], *sorted(entries[1:], key=lambda f: f.name)]
    return rknn_pb2.ModelManifest(
        digest=manifest_digest(ordered),
        files=[rknn_pb2.ModelFile(name=e.name, size=e.size, sha256=e.sha256) for e in ordered],
    )


def one_file_manifest(name: str, data: bytes) -> rknn_pb2.ModelManifest:
    """The manifest of a one-file model held whole in memory."""
    entry = FileEntry(name, len(data), hashlib.sha256(data).hexdigest())
    return rknn_pb2.ModelManifest(
        digest=manifest_digest([entry]),
        files=[rknn_pb2.ModelFile(name=entry.name, size=entry.size, sha256=entry.sha256)],
    )


def entries_of(manifest: rknn_pb2.ModelManifest) -> list[FileEntry]:
    return [FileEntry(f.name, f.size, f.sha256) for f in manifest.files]
