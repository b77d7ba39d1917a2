"""Triton's model repository layout (issue #30): `NAME/config.pbtxt` and numeric version folders, read
by the repository as Triton reads them, then served to the real tritonclient and perf_analyzer.

The repository half checks the reader against Triton's rules (version policies, the model file's name,
Triton's errors for a bad config, what is passed over); the daemon half serves a Triton-layout
repository and drives it with the real clients, unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rknn_server.protocols.kserve.pbtxt import top_level_fields
from rknn_server.protocols.kserve.repository import ModelRepository, RepositoryError
from tests.conftest import onnx_reference
from tests.kserve.conftest import V2Daemon
from tests.kserve.tritonclient_venv import PerfAnalyzer
from tests.metrics.conftest import start_metrics_daemon
from tests.models import identity_of, small_cnn

IMAGE = np.random.default_rng(5).standard_normal((1, 3, 16, 16)).astype(np.float32)
CNN_CONFIG = """
name: "cnn"                      # Triton checks it against the folder's name
platform: "onnxruntime_onnx"
max_batch_size: 0
version_policy: { all { } }
input [ { name: "input", data_type: TYPE_FP32, dims: [ 1, 3, 16, 16 ] } ]
output [ { name: "logits", data_type: TYPE_FP32, dims: [ 1, 10 ] } ]
instance_group [ { count: 2, kind: KIND_CPU } ]   # Triton's own: passed over
optimization { execution_accelerators { cpu_execution_accelerator: [ { name: "openvino" } ] } }
"""
BATCH_CONFIG = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ -1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
"""


def versions_of(root: Path, name: str, config: str, versions: tuple[str, ...] = ("1", "2", "3")) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    for version in versions:
        (folder / version).mkdir(parents=True)
        (folder / version / "model.onnx").write_bytes(b"x")
    (folder / "config.pbtxt").write_text(config)
    return folder


def served(root: Path, name: str) -> list[tuple[str, tuple[str, ...]]]:
    return [(f.version, f.files) for f in ModelRepository(root, (".onnx",), 10_000).read(name)]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("", ["3"]),  # Triton's default: the highest version
        ("version_policy: { latest { num_versions: 2 } }", ["2", "3"]),
        ("version_policy: { all { } }", ["1", "2", "3"]),
        ("version_policy: { specific { versions: [ 1, 3 ] } }", ["1", "3"]),
    ],
)
def test_the_version_policy_picks_the_versions_served(
    tmp_path: Path, policy: str, expected: list[str]
) -> None:
    versions_of(tmp_path, "m", policy)
    (tmp_path / "m" / "0").mkdir()  # not a version (Triton passes over a leading 0 and other names)
    (tmp_path / "m" / "07").mkdir()
    (tmp_path / "m" / "docs").mkdir()
    (tmp_path / "m" / "labels.txt").write_text("cat\n")
    assert served(tmp_path, "m") == [(v, ("model.onnx",)) for v in expected]


def test_a_config_less_versioned_folder_and_default_model_filename(tmp_path: Path) -> None:
    (tmp_path / "plain" / "1").mkdir(parents=True)
    (tmp_path / "plain" / "1" / "model.onnx").write_bytes(b"x")
    assert served(tmp_path, "plain") == [("1", ("model.onnx",))]
    versions_of(tmp_path, "named", 'default_model_filename: "net.onnx"', ("4",))
    (tmp_path / "named" / "4" / "net.onnx").write_bytes(b"x")
    assert served(tmp_path, "named") == [("4", ("net.onnx", "model.onnx"))]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            'name: "m"\nmax_batch_sise: 4\n',
            r"2:1 : Message type \"inference.ModelConfig\" has no field named \"max_batch_sise\"",
        ),
        ('input [ { name: "x", data_type: TYPE_FP23 } ]', r"TYPE_FP23"),
        ('name: "other"', r"name 'other' is not the folder's name 'm'"),
        ("max_batch_size: -1", r"max_batch_size -1 must be 0 \(no batching\) or more"),
        ("sequence_batching { }", r"does not serve sequence batching"),
        ("ensemble_scheduling { }", r"does not serve ensembles"),
        ('input [ { name: "x", reshape: { shape: [ 4 ] } } ]', r"'x' has a reshape"),
        ('input [ { name: "x" }, { name: "x" } ]', r"declared twice"),
        ("version_policy: { specific { versions: [ 2, 9 ] } }", r"version\(s\) \[9\], which have no folder"),
        ('default_model_filename: "net.onnx"', r"version 3 has no net.onnx"),
    ],
)
def test_a_bad_config_pbtxt_is_refused_with_what_is_wrong(tmp_path: Path, config: str, message: str) -> None:
    versions_of(tmp_path, "m", config)
    with pytest.raises(RepositoryError, match=message) as caught:
        served(tmp_path, "m")
    assert "model 'm'" in str(caught.value) and str(tmp_path) not in str(caught.value)


def test_what_a_triton_layout_may_not_hold(tmp_path: Path) -> None:
    versions_of(tmp_path, "both", "")
    (tmp_path / "both" / "config.toml").write_text("")
    versions_of(tmp_path, "noversion", "", ())
    versions_of(tmp_path, "linked", "", ("1",))
    (tmp_path / "linked" / "1" / "model.onnx").unlink()
    (tmp_path / "linked" / "1" / "model.onnx").symlink_to("/etc/passwd")
    versions_of(tmp_path, "deep", "", ("1",))
    (tmp_path / "deep" / "1" / "sub").mkdir()
    versions_of(tmp_path, "linkedversion", "", ("1",))
    (tmp_path / "linkedversion" / "2").symlink_to(tmp_path / "linkedversion" / "1")
    for name, message in {
        "both": "holds both config.pbtxt \\(Triton's layout\\) and config.toml",
        "noversion": "has config.pbtxt but no version folder",
        "linked": "version 1: 'model.onnx' is a symbolic link",
        "deep": "version 1: 'sub' is a subfolder",
        "linkedversion": "'2' is a symbolic link",
    }.items():
        with pytest.raises(RepositoryError, match=message) as caught:
            served(tmp_path, name)
        assert str(tmp_path) not in str(caught.value), name


def test_top_level_fields_skip_strings_comments_and_nesting() -> None:
    text = 'name: "a # b: c"  # input: no\ninput [ { name: "x" dims: [ -1 ] } ]\nparameters { key: "k" }\nmax_batch_size: 2'
    assert [name for name, _, _ in top_level_fields(text)] == [
        "name",
        "input",
        "parameters",
        "max_batch_size",
    ]


def make_triton_repository(root: Path) -> Path:
    """cnn: two versions (different weights) and a Triton config with Triton-only fields; batch: a
    dynamic-batch identity declared with max_batch_size; wrongtype: a config whose datatype is not the
    model's (UNAVAILABLE with Triton's reason)."""
    for version, seed in (("1", 1), ("2", 2)):
        (root / "cnn" / version).mkdir(parents=True)
        small_cnn(root / "cnn" / version / "model.onnx", seed=seed)
    (root / "cnn" / "config.pbtxt").write_text(CNN_CONFIG)
    (root / "batch" / "1").mkdir(parents=True)
    identity_of(root / "batch" / "1" / "model.onnx", "float32", ("N", 4))  # type: ignore[arg-type]
    (root / "batch" / "config.pbtxt").write_text(BATCH_CONFIG)
    (root / "wrongtype" / "1").mkdir(parents=True)
    identity_of(root / "wrongtype" / "1" / "model.onnx", "float32")
    (root / "wrongtype" / "config.pbtxt").write_text(
        'input [ { name: "x", data_type: TYPE_INT8, dims: [ 2, 3 ] } ]'
    )
    return root


@pytest.fixture(scope="module")
def triton_daemon(tmp_path_factory: pytest.TempPathFactory, triton_python: Path) -> Iterator[V2Daemon]:
    folder = tmp_path_factory.mktemp("triton-layout")
    repository = make_triton_repository(folder / "repository")
    running = start_metrics_daemon(folder, "--model-repository", str(repository))
    yield V2Daemon(running, triton_python, folder)
    assert running.daemon.stop() == 0


@pytest.mark.parametrize("protocol", ["grpc", "http-binary"])
def test_tritonclient_addresses_each_version_and_the_latest_by_default(
    triton_daemon: V2Daemon, tmp_path: Path, protocol: str
) -> None:
    repository = triton_daemon.folder / "repository"
    expected = {v: onnx_reference(repository / "cnn" / v / "model.onnx")([IMAGE])[0] for v in ("1", "2")}
    assert not np.allclose(expected["1"], expected["2"])
    for version, wanted in (("", "2"), ("1", "1"), ("2", "2")):
        got = triton_daemon.infer("cnn", protocol, {"input": IMAGE}, version=version)["logits"]
        np.testing.assert_allclose(got, expected[wanted], rtol=1e-5, atol=1e-6)
    np.savez(tmp_path / "in.npz", input=IMAGE)
    missing = triton_daemon.one(
        {
            "op": "infer",
            "model": "cnn",
            "protocol": protocol,
            "version": "3",
            "inputs": str(tmp_path / "in.npz"),
            "out": str(tmp_path / "out.npz"),
        }
    )
    assert "has no version '3'; its version(s) served: 1, 2" in missing["error"], missing


def test_metadata_index_config_and_statistics_show_the_layout(triton_daemon: V2Daemon) -> None:
    metadata, index, cnn_config, batch_config, stats = triton_daemon.drive(
        {"op": "metadata", "model": "cnn"},
        {"op": "index"},
        {"op": "config", "model": "cnn"},
        {"op": "config", "model": "batch"},
        {"op": "stats", "model": "cnn"},
    )
    assert metadata["ok"]["versions"] == ["1", "2"]
    rows = {(r["name"], r.get("version", "")): r for r in index["ok"]}
    assert (
        rows[("cnn", "1")]["state"] == rows[("cnn", "2")]["state"] == rows[("batch", "1")]["state"] == "READY"
    )
    wrong = [r for (name, _), r in rows.items() if name == "wrongtype"]
    assert wrong and wrong[0]["state"] == "UNAVAILABLE"
    assert "'x' is declared TYPE_INT8; the model's is FP32" in wrong[0]["reason"]
    assert int(cnn_config["ok"].get("max_batch_size", 0)) == 0
    assert [list(map(int, i["dims"])) for i in cnn_config["ok"]["input"]] == [[1, 3, 16, 16]]
    assert int(batch_config["ok"]["max_batch_size"]) == 8
    assert [list(map(int, i["dims"])) for i in batch_config["ok"]["input"]] == [[4]]  # after the batch
    assert sorted(s["version"] for s in stats["ok"]["model_stats"]) == ["1", "2"]


def test_a_batching_model_takes_any_batch_up_to_its_size(triton_daemon: V2Daemon, tmp_path: Path) -> None:
    batch = np.arange(24, dtype=np.float32).reshape(6, 4)
    assert np.array_equal(triton_daemon.infer("batch", "grpc", {"x": batch})["y"], batch)
    np.savez(tmp_path / "in.npz", x=np.zeros((9, 4), np.float32))
    over = triton_daemon.one(
        {"op": "infer", "model": "batch", "protocol": "grpc", "inputs": str(tmp_path / "in.npz"), "out": ""}
    )
    assert "first dimension is the batch, at most 8 (max_batch_size" in over["error"], over


def test_perf_analyzer_measures_a_triton_layout_model(
    perf_analyzer: PerfAnalyzer, triton_daemon: V2Daemon, tmp_path: Path
) -> None:
    """perf_analyzer as a Triton user runs it: the model's config says it batches; -b 4 sends [4, 4]."""
    measured = perf_analyzer.measure(
        tmp_path / "report.csv",
        *("-m", "batch", "-u", triton_daemon.grpc, "-i", "grpc", "-b", "4", "--concurrency-range", "1:2"),
    )
    assert sorted(row["Concurrency"] for row in measured) == ["1", "2"]  # its report's order varies
    assert all(float(row["Inferences/Second"]) > 0 for row in measured)
