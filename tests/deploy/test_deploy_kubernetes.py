"""The Kubernetes manifests: valid against the Kubernetes schema, and the farm facts hold."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from deploy_files import DEPLOY, find_tool

MANIFEST = DEPLOY / "kubernetes" / "rknn-server.yaml"


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    tool = find_tool("kubernetes-validate", "pip package kubernetes-validate")
    return subprocess.run([tool, "--strict", str(path)], capture_output=True, text=True, check=False)


def objects() -> dict[str, dict[str, Any]]:
    yaml = pytest.importorskip("yaml", reason="PyYAML comes with kubernetes-validate")
    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text())}


def test_manifests_pass_strict_schema_validation() -> None:
    manifests = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
    assert manifests
    for manifest in manifests:
        result = validate(manifest)
        assert result.returncode == 0, result.stdout + result.stderr


def test_validation_rejects_an_unknown_field(tmp_path: Path) -> None:
    """Guards the test above: strict mode must reject what the schema does not know."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(MANIFEST.read_text().replace("hostPort: 50515", "hostPortt: 50515"))
    result = validate(bad)
    assert result.returncode != 0
    assert "hostPortt" in result.stdout + result.stderr


def test_daemonset_runs_only_on_labelled_npu_boards() -> None:
    pod = objects()["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["rknn-server-oss/npu"] == "true"
    assert pod["nodeSelector"]["kubernetes.io/arch"] == "arm64"


def test_npu_node_soc_id_and_runtime_come_from_the_host() -> None:
    pod = objects()["DaemonSet"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    expected = {
        "/dev/dri/renderD129": ("CharDevice", False),
        "/proc/device-tree/compatible": ("File", True),
        "/usr/lib/librknnrt.so": ("File", True),
    }
    for path, (kind, read_only) in expected.items():
        volume = volumes[mounts[path]["name"]]
        assert volume["hostPath"] == {"path": path, "type": kind}
        assert mounts[path].get("readOnly", False) is read_only
    # A hostPath character device opens only in a privileged container (the documented default).
    assert container["securityContext"]["privileged"] is True


def test_grpc_port_and_native_grpc_probes() -> None:
    [container] = objects()["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    port = next(p for p in container["ports"] if p["name"] == "grpc")
    assert port["containerPort"] == 50515
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": 50515}


def test_runs_the_image_command_with_the_token_of_its_secret() -> None:
    """Like the compose board service: the image's CMD and variables, only the token's path changed."""
    [container] = objects()["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    assert "args" not in container and "command" not in container
    env = {e["name"]: e["value"] for e in container["env"]}
    # The token's path, and the metrics listener its Prometheus annotations scrape.
    assert set(env) == {"RKNN_SERVER_AUTH_TOKEN_FILE", "RKNN_SERVER_METRICS_LISTEN"}
    token = env["RKNN_SERVER_AUTH_TOKEN_FILE"]
    mount = next(m for m in container["volumeMounts"] if token.startswith(m["mountPath"] + "/"))
    assert mount["name"] == "auth-token"


def test_headless_service_selects_the_daemonset_pods() -> None:
    found = objects()
    service = found["Service"]["spec"]
    pod_labels = found["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    assert service["clusterIP"] == "None"
    assert service["selector"].items() <= pod_labels.items()
    assert [(p["port"], p["targetPort"]) for p in service["ports"]] == [(50515, "grpc")]


def test_prometheus_scrapes_the_metrics_listener() -> None:
    template = objects()["DaemonSet"]["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    [container] = template["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    listen = env["RKNN_SERVER_METRICS_LISTEN"]
    port = next(p for p in container["ports"] if p["name"] == "metrics")
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert listen == f"tcp://0.0.0.0:{annotations['prometheus.io/port']}"
    assert port["containerPort"] == int(annotations["prometheus.io/port"])
    # A non-loopback metrics port is refused without a token: the pod must have one.
    assert "RKNN_SERVER_AUTH_TOKEN_FILE" in env and "RKNN_SERVER_INSECURE" not in env
