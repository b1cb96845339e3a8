"""The Kubernetes manifests: valid against the Kubernetes client's models, and consistent with eerld."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from eerld.config import load_config
from eerld.ctl import _parser as eerlctl_parser

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy/kubernetes").glob("*.yaml"))
MODELS: dict[tuple[str, str], Any] = {
    ("v1", "Namespace"): k8s.V1Namespace,
    ("v1", "Service"): k8s.V1Service,
    ("v1", "Pod"): k8s.V1Pod,
    ("apps/v1", "DaemonSet"): k8s.V1DaemonSet,
}


def documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in MANIFESTS:
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d is not None)
    return docs


def one(kind: str) -> dict[str, Any]:
    (doc,) = (d for d in documents() if d["kind"] == kind)
    return doc


def check_service_monitor(doc: dict[str, Any]) -> None:
    """ServiceMonitor is a CRD (monitoring.coreos.com/v1): its required fields, checked by hand."""
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert doc["metadata"]["name"]
    spec = doc["spec"]
    assert set(spec) <= {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels"}
    assert isinstance(spec["selector"]["matchLabels"], dict)
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "honorLabels", "scheme"}
        assert isinstance(endpoint["port"], str)


class TestManifests:
    def test_every_manifest_validates_against_the_client_models(self) -> None:
        """Each document deserialises into its Kubernetes model with unknown fields forbidden."""
        kinds = []
        for doc in documents():
            kinds.append(doc["kind"])
            if doc["kind"] == "ServiceMonitor":
                check_service_monitor(doc)
                continue
            model = MODELS[(doc["apiVersion"], doc["kind"])]
            model.model_validate(doc)
        assert sorted(kinds) == ["DaemonSet", "Namespace", "Pod", "Service", "ServiceMonitor"]

    def test_a_misspelt_field_is_caught(self) -> None:
        """The validation is strict: a typo in a container field fails."""
        doc = one("DaemonSet")
        doc["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
        with pytest.raises(ValueError, match="imagePullPolcy"):
            k8s.V1DaemonSet.model_validate(doc)


class TestDaemonSet:
    def pod(self) -> dict[str, Any]:
        spec: dict[str, Any] = one("DaemonSet")["spec"]["template"]["spec"]
        return spec

    def container(self) -> dict[str, Any]:
        container: dict[str, Any] = self.pod()["containers"][0]
        return container

    def test_runs_on_gpu_nodes_as_node_critical_with_the_nvidia_runtime(self) -> None:
        """GPU node selector and toleration, system-node-critical, runtimeClassName nvidia."""
        pod = self.pod()
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
        assert (pod["priorityClassName"], pod["runtimeClassName"]) == ("system-node-critical", "nvidia")

    def test_has_only_the_capabilities_it_needs(self) -> None:
        """Not privileged; all capabilities dropped but SYS_ADMIN (clock locks) and CHOWN (socket group)."""
        security = self.container()["securityContext"]
        assert security["privileged"] is False
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN", "CHOWN"]}

    def test_does_not_claim_gpus_from_the_scheduler(self) -> None:
        """GPUs come from NVIDIA_VISIBLE_DEVICES=all, never from an nvidia.com/gpu request."""
        container = self.container()
        assert "nvidia.com/gpu" not in str(container["resources"])
        assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in container["env"]

    def test_the_daemons_flags_are_valid_eerld_flags(self) -> None:
        """eerld's own configuration parser accepts the container's arguments."""
        config = load_config(self.container()["args"])
        assert str(config.socket_path) == "/run/eerld/eerld.sock"
        assert config.metrics_address == "0.0.0.0:9478"

    def test_probes_run_valid_eerlctl_health_commands(self) -> None:
        """Every probe is an exec of `eerlctl … health` that eerlctl's parser accepts."""
        container = self.container()
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            command = container[probe]["exec"]["command"]
            assert command[0] == "eerlctl"
            assert eerlctl_parser().parse_args(command[1:]).command == "health"

    def test_probe_sockets_are_the_daemons_sockets(self) -> None:
        """The probes' default socket (EERLCTL_SOCKET) is the admin socket eerld is told to serve."""
        container = self.container()
        config = load_config(container["args"])
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["EERLCTL_SOCKET"] == str(config.admin_socket_path)
        readiness = eerlctl_parser().parse_args(container["readinessProbe"]["exec"]["command"][1:])
        assert readiness.socket == str(config.socket_path)

    def test_state_survives_restarts_and_the_worker_socket_is_on_the_host(self) -> None:
        """The ledger is on a hostPath; /run/eerld is the host's; the admin socket is not."""
        pod = self.pod()
        host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
        mounts = {m["mountPath"]: m["name"] for m in self.container()["volumeMounts"]}
        assert host_paths[mounts["/var/lib/eerld"]] == "/var/lib/eerld"
        assert host_paths[mounts["/run/eerld"]] == "/run/eerld"
        assert mounts["/run/eerld-admin"] not in host_paths


class TestWiring:
    def test_the_rl_pod_mounts_the_hosts_worker_socket_directory(self) -> None:
        """The example RL pod mounts hostPath /run/eerld and points EERL_SOCKET into it."""
        pod = one("Pod")["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        container = pod["containers"][0]
        (mount,) = container["volumeMounts"]
        assert volumes[mount["name"]]["hostPath"]["path"] == "/run/eerld"
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["EERL_SOCKET"].startswith(mount["mountPath"] + "/")

    def test_service_and_monitor_select_the_daemon_pods(self) -> None:
        """Service selector ⊆ pod labels; ServiceMonitor selector ⊆ Service labels; port names agree."""
        pod_labels = one("DaemonSet")["spec"]["template"]["metadata"]["labels"]
        service = one("Service")
        monitor = one("ServiceMonitor")
        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        ports = {p["name"] for p in service["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
        container_ports = {
            p["name"] for p in one("DaemonSet")["spec"]["template"]["spec"]["containers"][0]["ports"]
        }
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports
