"""deploy/kubernetes/rl-job-sidecar-pod.yaml: a valid Pod; the sidecar native, the only container that
reaches the node; the trainer container within the "restricted" Pod Security level; flags that parse."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from eerl.cli import build_parser as eerl_parser
from eerl.sidecar.server import build_parser as sidecar_parser
from kubernetes import client as k8s

MANIFEST = Path(__file__).resolve().parents[2] / "deploy/kubernetes/rl-job-sidecar-pod.yaml"


@pytest.fixture(scope="module")
def pod() -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d is not None]
    return doc


def expand(args: list[str], env: list[dict[str, Any]]) -> list[str]:
    """Kubernetes' $(VAR) expansion, with each env var standing in by its name."""
    names = {e["name"]: e.get("value", f"<{e['name']}>") for e in env}
    return [re.sub(r"\$\((\w+)\)", lambda m: names[m.group(1)], arg) for arg in args]


def restricted_violations(container: dict[str, Any], pod_security: dict[str, Any]) -> list[str]:
    """The container-level checks of the "restricted" Pod Security Standard (v1.29+)."""
    context = container.get("securityContext", {})
    problems = []
    if context.get("privileged"):
        problems.append("privileged")
    if context.get("allowPrivilegeEscalation") is not False:
        problems.append("allowPrivilegeEscalation must be false")
    if context.get("capabilities", {}).get("drop") != ["ALL"]:
        problems.append("capabilities must drop ALL")
    if set(context.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
        problems.append("capabilities added")
    non_root = context.get("runAsNonRoot", pod_security.get("runAsNonRoot"))
    if non_root is not True:
        problems.append("runAsNonRoot")
    if context.get("runAsUser", pod_security.get("runAsUser")) == 0:
        problems.append("runAsUser 0")
    seccomp = context.get("seccompProfile", pod_security.get("seccompProfile", {})).get("type")
    if seccomp not in ("RuntimeDefault", "Localhost"):
        problems.append("seccomp")
    if any(port.get("hostPort") for port in container.get("ports", [])):
        problems.append("hostPort")
    if container.get("volumeMounts"):
        problems.append("volume mounts (the trainer needs none)")
    return problems


class TestSidecarPod:
    def test_validates_against_the_kubernetes_model(self, pod: dict[str, Any]) -> None:
        assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
        k8s.V1Pod.model_validate(pod)

    def test_the_sidecar_is_native_and_the_only_container_with_a_node_volume(
        self, pod: dict[str, Any]
    ) -> None:
        spec = pod["spec"]
        (sidecar,) = spec["initContainers"]
        assert sidecar["restartPolicy"] == "Always"
        assert sidecar["command"] == ["eerl-sidecar"]
        host_volumes = {v["name"] for v in spec["volumes"] if "hostPath" in v}
        assert host_volumes == {"eerld-grants"}
        assert [m["name"] for m in sidecar["volumeMounts"]] == ["eerld-grants"]
        assert all(m["readOnly"] for m in sidecar["volumeMounts"])
        for container in spec["containers"]:
            assert not container.get("volumeMounts")
        assert sidecar["securityContext"]["runAsUser"] != 0
        assert sidecar["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert "nvidia.com/gpu" not in sidecar.get("resources", {}).get("limits", {})

    def test_the_trainer_meets_the_restricted_level(self, pod: dict[str, Any]) -> None:
        (trainer,) = pod["spec"]["containers"]
        assert restricted_violations(trainer, pod["spec"]["securityContext"]) == []
        assert int(trainer["resources"]["limits"]["nvidia.com/gpu"]) > 0
        env = {e["name"]: e.get("value") for e in trainer["env"]}
        assert env["EERL_SIDECAR"] == "http://127.0.0.1:9479"
        assert "EERL_SOCKET" not in env

    def test_the_sidecars_flags_and_probes_are_valid(self, pod: dict[str, Any]) -> None:
        (sidecar,) = pod["spec"]["initContainers"]
        args = sidecar_parser().parse_args(expand(sidecar["args"], sidecar["env"]))
        assert args.listen == "127.0.0.1:9479"
        assert args.scoped
        assert args.socket == "/run/eerld/grants/job-<EERL_JOB_ID>.sock"
        assert args.socket.startswith(sidecar["volumeMounts"][0]["mountPath"] + "/")
        for probe in ("startupProbe", "livenessProbe"):
            command = sidecar[probe]["exec"]["command"]
            assert command[0] == "eerl"
            assert eerl_parser().parse_args(command[1:]).strict
