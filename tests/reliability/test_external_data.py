"""No model reads, stats or reports on a file outside its own cache folder through ONNX external data.

The attack (issue 12, item 1): a QDQ model, which the host runtime rewrites and loads from bytes, whose
tensor names external data `location="etc/shadow"` read that file relative to the daemon's working
directory and returned it as an output; errors told whether other paths exist and how long they are.
Each case runs against a live daemon started in `/` and in its cache folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import grpc
import numpy as np
import pytest

from rknn_proto import rknn_pb2, rknn_pb2_grpc
from tests.reliability.conftest import StartDaemon, device
from tests.reliability.hostile_models import PLACES, SIZE, reader_model, upload_raw

SECRET = b"SECRET-1" + b"s" * 4091  # 4099 bytes: its size must not appear in any answer either
TENSOR_NAMES = {"initializer": "'c'", "constant": "'w'", "if_branch": "'w'", "sparse_initializer": "'c'"}
REFUSED = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)


def _open(channel: grpc.Channel, digest: str) -> rknn_pb2.InitRuntimeResponse:
    reply: rknn_pb2.InitRuntimeResponse = rknn_pb2_grpc.RknnServerStub(channel).InitRuntime(
        rknn_pb2.InitRuntimeRequest(model_digest=digest), timeout=60
    )
    return reply


def _leaked(daemon: object, digest: str) -> bytes:
    """What a run of a model that loaded returns: the bytes its external tensor read."""
    with device(daemon) as dev, dev.open_session(digest) as session:  # type: ignore[arg-type]
        (out,) = session.run([np.zeros(SIZE, np.uint8)])
    return bytes(np.asarray(out).astype(np.uint8))


def _profiled_layers(daemon: object, digest: str) -> int:
    """Rows of a per-layer profile (ONNX Runtime's profiler loads the model once more)."""
    with device(daemon) as dev, dev.open_session(digest, perf_debug=True) as session:  # type: ignore[arg-type]
        return len(session.perf(fix_freq=False).layers)


def _dumped_sum(daemon: object, digest: str) -> bytes:
    """The `Add` layer of a per-layer dump with zeros in (the dump loads a rewritten model of its own)."""
    with device(daemon) as dev, dev.open_session(digest) as session:  # type: ignore[arg-type]
        layers = {layer.tensor_name: layer.array for layer in session.dump_layers([np.zeros(SIZE, np.uint8)])}
    return bytes(np.asarray(layers["sum"]).astype(np.uint8))


def _assert_refused_cleanly(
    daemon: object, channel: grpc.Channel, location: str, place: str, tmp_path: Path
) -> None:
    digest = upload_raw(channel, [("m.onnx", reader_model(location, place))])
    try:
        reply = _open(channel, digest)
    except grpc.RpcError as exc:
        details = exc.details() or ""
        context = f"{place} {location!r}: {exc.code()} {details}"
        assert exc.code() in REFUSED, context
        assert TENSOR_NAMES[place] in details and repr(location) in details, context
        rest = re.sub(r"[0-9a-f]{64}", "", details.replace(repr(location), ""))
        assert str(tmp_path) not in rest and "/tmp" not in rest and str(len(SECRET)) not in rest, context
        assert b"SECRET" not in details.encode(), context
        return
    leaked = _leaked(daemon, digest)
    pytest.fail(f"{place} {location!r} loaded (session {reply.session_id[:8]}) and read {leaked!r}")


@pytest.mark.parametrize("cwd", ["root", "cache"])
def test_external_data_outside_the_model_folder_is_refused(
    daemons: StartDaemon, tmp_path: Path, cwd: str
) -> None:
    secret = tmp_path / "secret" / "shadow"
    secret.parent.mkdir()
    secret.write_bytes(SECRET)
    cache = tmp_path / "cache"
    cache.mkdir()
    workdir = Path("/") if cwd == "root" else cache
    daemon = daemons(cache=cache, cwd=workdir)
    locations = [
        os.path.relpath(secret, workdir),  # what the attack used: relative to the working directory
        os.path.relpath(secret, cache / "models" / ("0" * 64)),  # out of the model's folder with '..'
        str(secret),  # absolute
    ]
    with grpc.insecure_channel(daemon.address) as channel:
        for place in PLACES:
            for location in locations:
                _assert_refused_cleanly(daemon, channel, location, place, tmp_path)
            # The same model naming a file of its own upload still loads and reads that file, in runs,
            # layer dumps and profiles, whatever the working directory.
            weights = bytes(range(10, 10 + SIZE))
            digest = upload_raw(channel, [("m.onnx", reader_model("w.bin", place)), ("w.bin", weights)])
            _open(channel, digest)
            assert _leaked(daemon, digest) == weights, place
            assert _dumped_sum(daemon, digest) == weights, place
            assert _profiled_layers(daemon, digest) > 0, place
    assert daemon.process.poll() is None


def test_a_model_file_turned_into_a_link_out_of_the_folder_is_refused(
    daemons: StartDaemon, tmp_path: Path
) -> None:
    """A link that leaves the folder is never followed, even to bytes that hash like the upload."""
    cache = tmp_path / "cache"
    daemon = daemons(cache=cache)
    weights = bytes(range(20, 20 + SIZE))
    outside = tmp_path / "outside.bin"
    outside.write_bytes(weights)
    with grpc.insecure_channel(daemon.address) as channel:
        digest = upload_raw(channel, [("m.onnx", reader_model("w.bin", "constant")), ("w.bin", weights)])
        stored = cache / "models" / digest / "w.bin"
        stored.unlink()
        stored.symlink_to(outside)
        with pytest.raises(grpc.RpcError) as refused:
            _open(channel, digest)
    assert refused.value.code() in REFUSED
    assert "'w.bin'" in (refused.value.details() or "")
    assert str(tmp_path) not in (refused.value.details() or "")
