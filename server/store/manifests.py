"""A model's manifest checked once, before anything touches the disk: its digest, its files' names,
hashes and sizes, the limits they must keep, and that the digest is that of its file list."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from rknn_proto import rknn_pb2
from rknn_proto.manifest import entries_of, manifest_digest, valid_digest, valid_file_name
from rknn_server.config.limits import CacheLimits
from rknn_server.errors import InvalidInput, ResourceExhausted


@dataclass(frozen=True)
class CheckedManifest:
    """A manifest `validate_manifest` accepted, with its size: what the cache's steps of an upload
    take, so that each request's manifest is checked once, however many steps it goes through."""

    manifest: rknn_pb2.ModelManifest
    total_bytes: int

    @property
    def digest(self) -> str:
        return self.manifest.digest


def validate_manifest(manifest: rknn_pb2.ModelManifest, limits: CacheLimits) -> CheckedManifest:
    """Reject a manifest that is malformed, inconsistent or too large, saying what was expected.

    Runs before anything touches the disk; the count is checked before anything iterates the files."""
    if not valid_digest(manifest.digest):
        raise InvalidInput(f"model digest {manifest.digest[:80]!r} is not 64 lower-case hex characters")
    if not manifest.files:
        raise InvalidInput("model manifest lists no files; expected the main model file first")
    if len(manifest.files) > limits.max_model_files:
        raise ResourceExhausted(
            f"model manifest lists {len(manifest.files)} files, over the limit "
            f"max_model_files={limits.max_model_files} (daemon option --max-model-files)"
        )
    repeated = sorted(n for n, count in Counter(f.name for f in manifest.files).items() if count > 1)
    if repeated:
        raise InvalidInput(f"model manifest repeats file names {repeated[:5]}; expected each name once")
    for f in manifest.files:
        if not valid_file_name(f.name):
            raise InvalidInput(
                f"model file name {f.name[:200]!r} is not allowed; expected 1 to 128 letters, digits, "
                "'.', '_' and '-', not starting with '.' or '-'"
            )
        if not valid_digest(f.sha256):
            raise InvalidInput(
                f"sha256 of {f.name!r} ({f.sha256[:80]!r}) is not 64 lower-case hex characters"
            )
    total = sum(f.size for f in manifest.files)
    if total > limits.max_model_bytes:
        raise ResourceExhausted(
            f"model is {total} bytes, over the limit max_model_bytes={limits.max_model_bytes} "
            "(daemon option --max-model-bytes)"
        )
    if total > limits.quota_bytes:
        raise ResourceExhausted(
            f"model is {total} bytes, over the model cache quota "
            f"model_cache_quota_bytes={limits.quota_bytes} (daemon option --cache-quota)"
        )
    expected = manifest_digest(entries_of(manifest))
    if expected != manifest.digest:
        raise InvalidInput(
            f"model digest {manifest.digest} does not match its file list (expected {expected})"
        )
    return CheckedManifest(manifest, total)
