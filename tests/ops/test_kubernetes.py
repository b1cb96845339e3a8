"""The Kubernetes manifests: valid against the Kubernetes client's models, and consistent with eerld."""

from __future__ import annotations

import os
import posixpath
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from eerl.config import DEFAULT_RUN_DIR
from kubernetes import client as k8s

from eerlctl.main import _parser as eerlctl_parser
from eerld.cdi import load_spec, patch_spec
from eerld.config import load_config
from eerld.csi import DRIVER_NAME
from eerld.csi.main import build_parser as csi_parser

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy/kubernetes").glob("*.yaml"))
MODELS: dict[tuple[str, str], Any] = {
    ("v1", "Namespace"): k8s.V1Namespace,
    ("v1", "Service"): k8s.V1Service,
    ("v1", "Pod"): k8s.V1Pod,
    ("apps/v1", "DaemonSet"): k8s.V1DaemonSet,
    ("storage.k8s.io/v1", "CSIDriver"): k8s.V1CSIDriver,
}


def documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in MANIFESTS:
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d is not None)
    return docs


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    (doc,) = (d for d in documents() if d["kind"] == kind and name in (None, d["metadata"]["name"]))
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


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What the restricted Pod Security Standard refuses in ``pod`` (the checks of its baseline and
    restricted profiles that a manifest shows), one ``check: where`` string each."""
    spec = pod["spec"]
    found: list[str] = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            found.append(f"{key}: pod")
    found += [f"hostPath: volume {v['name']}" for v in spec.get("volumes", []) if "hostPath" in v]
    pod_security = spec.get("securityContext", {})
    for c in spec.get("initContainers", []) + spec.get("containers", []):
        sc = c.get("securityContext", {})
        where = f"container {c['name']}"
        if sc.get("privileged"):
            found.append(f"privileged: {where}")
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"allowPrivilegeEscalation: {where}")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []) or set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"capabilities: {where}")
        if (
            not sc.get("runAsNonRoot", pod_security.get("runAsNonRoot"))
            or sc.get("runAsUser", pod_security.get("runAsUser")) == 0
        ):
            found.append(f"runAsNonRoot: {where}")
        seccomp = sc.get("seccompProfile", pod_security.get("seccompProfile", {}))
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            found.append(f"seccompProfile: {where}")
    return found


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
        assert sorted(kinds) == [
            "CSIDriver",
            "DaemonSet",
            "Namespace",
            "Pod",
            "Pod",
            "Service",
            "ServiceMonitor",
        ]

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

    def test_reaches_every_gpu_as_the_gpu_operators_node_agents_do(self) -> None:
        """Privileged with NVIDIA_VISIBLE_DEVICES=all on the NVIDIA runtime, as the GPU Operator runs
        dcgm-exporter: a toolkit that ignores the variable in unprivileged containers still honours it (an
        unprivileged eerld would see no GPU there). Root filesystem read-only, seccomp RuntimeDefault."""
        security = self.container()["securityContext"]
        assert security["privileged"] is True
        assert "allowPrivilegeEscalation" not in security  # false is invalid with privileged
        assert "capabilities" not in security  # a privileged container has them all: no false promise
        assert (security["readOnlyRootFilesystem"], security["seccompProfile"]) == (
            True,
            {"type": "RuntimeDefault"},
        )
        assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in self.container()["env"]
        assert self.pod()["runtimeClassName"] == "nvidia"
        assert one("Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"

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

    def test_state_survives_restarts_and_the_worker_sockets_are_on_the_host(self) -> None:
        """The ledger is on a hostPath; /run/eerld (worker sockets) is the host's; the admin socket is not."""
        pod = self.pod()
        host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
        mounts = {m["mountPath"]: m["name"] for m in self.container()["volumeMounts"]}
        assert host_paths[mounts["/var/lib/eerld"]] == "/var/lib/eerld"
        assert host_paths[mounts["/run/eerld"]] == "/run/eerld"
        assert mounts["/run/eerld-admin"] not in host_paths

    def test_is_multi_tenant_with_per_gpu_sockets_at_the_same_path_on_the_host(self) -> None:
        """--tenancy=multi; --gpu-socket-dir is in a hostPath mounted at its own host path, as CDI needs."""
        config = load_config(self.container()["args"])
        assert (config.tenancy, str(config.gpu_socket_dir)) == ("multi", "/run/eerld/gpus")
        host_paths = {v["name"]: v["hostPath"]["path"] for v in self.pod()["volumes"] if "hostPath" in v}
        (mount,) = (
            m
            for m in self.container()["volumeMounts"]
            if str(config.gpu_socket_dir).startswith(m["mountPath"] + "/")
        )
        assert host_paths[mount["name"]] == mount["mountPath"]


class TestCdiSidecar:
    def pod(self) -> dict[str, Any]:
        spec: dict[str, Any] = one("DaemonSet")["spec"]["template"]["spec"]
        return spec

    def sidecar(self) -> dict[str, Any]:
        (container,) = (c for c in self.pod()["initContainers"] if c["name"] == "cdi-sockets")
        return container  # type: ignore[no-any-return]

    def env(self) -> dict[str, str]:
        return {e["name"]: e["value"] for e in self.sidecar()["env"]}

    def test_is_a_native_sidecar_without_gpus(self) -> None:
        """An init container with restartPolicy Always, so it runs beside eerld, and it takes no GPU."""
        sidecar = self.sidecar()
        assert sidecar["restartPolicy"] == "Always"
        assert self.env()["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert "nvidia.com/gpu" not in str(sidecar["resources"])

    def test_patches_the_socket_directory_that_eerld_serves(self) -> None:
        """Its socket directory is eerld's --gpu-socket-dir, seen read-only through the same host volume."""
        eerld = self.pod()["containers"][0]
        assert self.env()["EERL_GPU_SOCKET_DIR"] == str(load_config(eerld["args"]).gpu_socket_dir)
        mounts = {m["mountPath"]: m for m in self.sidecar()["volumeMounts"]}
        eerld_mounts = {m["mountPath"]: m["name"] for m in eerld["volumeMounts"]}
        assert mounts["/run/eerld"]["name"] == eerld_mounts["/run/eerld"]
        assert mounts["/run/eerld"]["readOnly"] is True

    def test_writes_the_hosts_cdi_directory_without_any_capability(self) -> None:
        """The specs it patches are in the host's /var/run/cdi, mounted writable; it has no capability."""
        host_paths = {v["name"]: v["hostPath"]["path"] for v in self.pod()["volumes"] if "hostPath" in v}
        mounts = {m["mountPath"]: m for m in self.sidecar()["volumeMounts"]}
        assert host_paths[mounts["/var/run/cdi"]["name"]] == "/var/run/cdi"
        assert not mounts["/var/run/cdi"].get("readOnly", False)
        assert {posixpath.dirname(p) for p in self.env()["EERL_CDI_SPECS"].split()} == {"/var/run/cdi"}
        security = self.sidecar()["securityContext"]
        assert (security["privileged"], security["allowPrivilegeEscalation"]) == (False, False)
        assert security["capabilities"] == {"drop": ["ALL"]}

    def test_its_script_mounts_the_present_gpu_directories_and_keeps_them_on_sigterm(
        self, tmp_path: Path, sock_dir: Path
    ) -> None:
        """Run for real: GPU0's directory (its socket gone) is mounted, GPU1's (never made) is not; SIGTERM
        ends the loop at once and leaves the mounts."""
        gpu0 = "GPU-6f8b2a3e-1c4d-4b5e-9a7f-0e1d2c3b4a59"
        gpu1 = "GPU-0d3c9e8a-7b21-4f6c-8e5d-a1b2c3d4e5f6"
        fixture = Path(__file__).parent / "data/nvidia-cdi.yaml"
        spec_path = tmp_path / "nvidia.yaml"
        shutil.copyfile(fixture, spec_path)
        sockets = sock_dir / "gpus"
        sockets.mkdir(mode=0o700)
        (sockets / gpu0).mkdir(mode=0o711)  # eerld served GPU0 and stopped: its socket is gone, not its dir
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "eerl-cdi").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m eerld.cdi "$@"\n')
        (bin_dir / "eerl-cdi").chmod(0o755)
        env = {
            **self.env(),
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "EERL_CDI_SPECS": f"{spec_path} {tmp_path / 'k8s.device-plugin.nvidia.com-gpu.json'}",
            "EERL_GPU_SOCKET_DIR": str(sockets),
            "PYTHONPATH": os.pathsep.join(sys.path),
            "EERL_CDI_PERIOD_S": "3600",  # the next round is an hour away: only the trap can end it in time
        }
        script = subprocess.Popen(self.sidecar()["command"], env=env, stdout=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while f"{sockets}/{gpu0}" not in spec_path.read_text() and time.monotonic() < deadline:
                time.sleep(0.1)
            patched = load_spec(spec_path.read_text(), "yaml")
            # The round's report line comes after the spec is written: wait for it too, or a SIGTERM sent
            # in between ends the loop before it prints (seen once on a busy machine).
            assert script.stdout is not None
            ready, _, _ = select.select([script.stdout], [], [], max(0.0, deadline - time.monotonic()))
            first = script.stdout.readline() if ready else ""
            script.send_signal(signal.SIGTERM)
            rest, _ = script.communicate(timeout=60)  # TimeoutExpired: it waited for the next round
            stdout = first + rest
        finally:
            if script.poll() is None:
                script.kill()
                script.wait()
            if script.stdout is not None:
                script.stdout.close()  # else a failed run's pipe is collected, unclosed, in another test
        original = load_spec(fixture.read_text(), "yaml")
        assert patched == patch_spec(original, str(sockets), uuids={gpu0}).spec
        assert f"{sockets}/{gpu1}" not in str(patched)
        assert (script.returncode, load_spec(spec_path.read_text(), "yaml")) == (0, patched)
        assert "patched" in stdout


class TestCsiPlugin:
    """eerl-csi and its registrar in the DaemonSet, and the CSIDriver they serve."""

    def pod(self) -> dict[str, Any]:
        spec: dict[str, Any] = one("DaemonSet")["spec"]["template"]["spec"]
        return spec

    def container(self, name: str) -> dict[str, Any]:
        (container,) = (c for c in self.pod()["containers"] if c["name"] == name)
        return container  # type: ignore[no-any-return]

    def host_paths(self) -> dict[str, str]:
        return {v["name"]: v["hostPath"]["path"] for v in self.pod()["volumes"] if "hostPath" in v}

    def test_the_driver_is_ephemeral_with_pod_info_and_no_attach(self) -> None:
        spec = one("CSIDriver")["spec"]
        assert one("CSIDriver")["metadata"]["name"] == DRIVER_NAME
        assert (spec["volumeLifecycleModes"], spec["podInfoOnMount"], spec["attachRequired"]) == (
            ["Ephemeral"],
            True,
            False,
        )
        assert spec["fsGroupPolicy"] == "None"

    def test_eerl_csis_flags_parse_and_reach_eerlds_admin_socket_and_the_kubelet(self) -> None:
        csi = self.container("eerl-csi")
        args = csi_parser().parse_args(csi["args"])
        eerld_config = load_config(self.pod()["containers"][0]["args"])
        mounts = {m["mountPath"]: m for m in csi["volumeMounts"]}
        assert args.admin_socket == eerld_config.admin_socket_path
        assert mounts[str(args.admin_socket.parent)]["name"] == "admin"  # the pod's own emptyDir
        assert str(args.csi_socket) == f"/var/lib/kubelet/plugins/{DRIVER_NAME}/csi.sock"
        kubelet = mounts[str(args.kubelet_dir)]
        assert (self.host_paths()[kubelet["name"]], kubelet["mountPropagation"]) == (
            "/var/lib/kubelet",
            "Bidirectional",
        )
        assert str(args.pod_resources_socket).startswith(str(args.kubelet_dir) + "/")
        assert self.host_paths()[mounts[str(args.state_dir)]["name"]] == str(args.state_dir)
        grants = eerld_config.grant_dir
        assert grants is not None
        (run,) = (m for m in csi["volumeMounts"] if str(grants).startswith(m["mountPath"] + "/"))
        assert self.host_paths()[run["name"]] == run["mountPath"]  # eerld's grant directories, as the host's
        assert args.grant_dir == grants  # where a volume published while eerld is away gets its directory
        assert not run.get("readOnly", False)  # which eerl-csi then makes
        assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in csi["env"]

    def test_the_registrar_points_the_kubelet_at_eerl_csis_socket(self) -> None:
        registrar = self.container("csi-node-driver-registrar")
        assert registrar["image"].startswith("registry.k8s.io/sig-storage/csi-node-driver-registrar:")
        args = dict(a.lstrip("-").split("=", 1) for a in registrar["args"])
        csi_socket = str(csi_parser().parse_args(self.container("eerl-csi")["args"]).csi_socket)
        mounts = {m["mountPath"]: m["name"] for m in registrar["volumeMounts"]}
        assert args["kubelet-registration-path"] == csi_socket
        assert self.host_paths()[mounts["/csi"]] + "/" + Path(args["csi-address"]).name == csi_socket
        assert self.host_paths()[mounts["/registration"]] == "/var/lib/kubelet/plugins_registry"
        assert registrar["securityContext"]["capabilities"]["drop"] == ["ALL"]


class TestWiring:
    def test_the_rl_pod_gets_its_gpus_sockets_through_cdi_not_a_host_path(self) -> None:
        """No hostPath, no EERL_SOCKET: the client looks for CDI-mounted sockets where eerld serves them."""
        pod = one("Pod", "rl-job-example")["spec"]
        container = pod["containers"][0]
        assert not any("hostPath" in v for v in pod.get("volumes", []))
        assert "volumeMounts" not in container
        assert "EERL_SOCKET" not in {e["name"] for e in container["env"]}
        eerld_args = one("DaemonSet")["spec"]["template"]["spec"]["containers"][0]["args"]
        assert str(load_config(eerld_args).gpu_socket_dir) == posixpath.join(DEFAULT_RUN_DIR, "gpus")

    def test_the_rl_pod_requests_gpus_and_runs_as_a_non_root_user(self) -> None:
        """nvidia.com/gpu from the scheduler (hence the CDI devices); runAsNonRoot with a non-zero uid."""
        pod = one("Pod", "rl-job-example")["spec"]
        assert int(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) > 0
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0

    def test_the_rl_pod_meets_the_restricted_pod_security_level(self) -> None:
        """The checks of the restricted Pod Security Standard: no host namespaces or hostPath, not
        privileged, no privilege escalation, every capability dropped, non-root, seccomp RuntimeDefault."""
        pod = one("Pod", "rl-job-example")
        assert restricted_violations(pod) == []

    def test_the_restricted_check_is_real(self) -> None:
        """The daemon's pod fails it (privileged, hostPath, root)."""
        daemon_pod = {"spec": one("DaemonSet")["spec"]["template"]["spec"]}
        assert {"privileged", "hostPath", "runAsNonRoot"} <= {
            v.split(":")[0] for v in restricted_violations(daemon_pod)
        }

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
