"""deploy/kubernetes/rl-job-sidecar-pod.yaml: a valid Pod; the sidecar native, the only container that
reaches eerld (through its inline csi.eerl.dev volume); the whole pod within the "restricted" Pod Security
level; flags that parse."""

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
RESTRICTED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
"""The volume types the "restricted" Pod Security Standard admits (v1.29+)."""


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
    if "procMount" in context and context["procMount"] != "Default":
        problems.append("procMount")
    return problems


def pod_violations(pod: dict[str, Any]) -> list[str]:
    """The "restricted" checks of the whole pod: its own fields, its volumes and every container."""
    spec = pod["spec"]
    problems = [key for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if kinds - RESTRICTED_VOLUME_TYPES:
            problems.append(f"volume {volume['name']}: {', '.join(sorted(kinds))}")
    security = spec.get("securityContext", {})
    if security.get("runAsUser") == 0:
        problems.append("pod runAsUser 0")
    for container in spec.get("initContainers", []) + spec.get("containers", []):
        problems += [f"{container['name']}: {p}" for p in restricted_violations(container, security)]
    return problems


class TestSidecarPod:
    def test_validates_against_the_kubernetes_model(self, pod: dict[str, Any]) -> None:
        assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
        k8s.V1Pod.model_validate(pod)

    def test_the_whole_pod_meets_the_restricted_level(self, pod: dict[str, Any]) -> None:
        assert pod_violations(pod) == []
        assert "hostPath" not in MANIFEST.read_text().split("apiVersion:", 1)[1]

    def test_the_restricted_check_is_real(self, pod: dict[str, Any]) -> None:
        """A hostPath volume, a root container or a missing seccomp profile each fail it."""
        spec = pod["spec"]
        host = {**pod, "spec": {**spec, "volumes": [{"name": "h", "hostPath": {"path": "/run/eerld"}}]}}
        (sidecar,) = spec["initContainers"]
        root = {**sidecar, "securityContext": {**sidecar["securityContext"], "runAsUser": 0}}
        rooted = {**pod, "spec": {**spec, "initContainers": [root]}}
        bare = {k: v for k, v in sidecar["securityContext"].items() if k != "seccompProfile"}
        loose_spec = {**spec, "securityContext": {"runAsNonRoot": True}}
        loose = {**pod, "spec": {**loose_spec, "initContainers": [{**sidecar, "securityContext": bare}]}}
        assert pod_violations(host) == ["volume h: hostPath"]
        assert pod_violations(rooted) == ["eerl-sidecar: runAsUser 0"]
        assert pod_violations(loose) == ["eerl-sidecar: seccomp"]

    def test_the_sidecar_is_native_and_the_only_container_that_reaches_eerld(
        self, pod: dict[str, Any]
    ) -> None:
        spec = pod["spec"]
        (sidecar,) = spec["initContainers"]
        assert sidecar["restartPolicy"] == "Always"
        assert sidecar["command"] == ["eerl-sidecar"]
        volume, listening = spec["volumes"]
        assert volume["csi"]["driver"] == "csi.eerl.dev"
        assert volume["csi"]["volumeAttributes"] == {"uid": "1000", "gid": "1000"}
        assert listening["emptyDir"]["medium"] == "Memory"
        mounts = [(m["name"], m.get("readOnly", False)) for m in sidecar["volumeMounts"]]
        assert mounts == [(volume["name"], True), (listening["name"], False)]
        for container in spec["containers"]:  # the trainer sees the sidecar's socket, never eerld's
            assert [m["name"] for m in container["volumeMounts"]] == [listening["name"]]
        assert sidecar["securityContext"]["runAsUser"] == int(volume["csi"]["volumeAttributes"]["uid"])
        assert sidecar["securityContext"]["runAsGroup"] == int(volume["csi"]["volumeAttributes"]["gid"])
        assert "nvidia.com/gpu" not in sidecar.get("resources", {}).get("limits", {})

    def test_the_sidecars_job_id_is_the_pods_uid_which_the_grant_admits(self, pod: dict[str, Any]) -> None:
        """eerl-csi makes the grant for job id = the pod's uid (eerld.csi.grant.plan_grant)."""
        (sidecar,) = pod["spec"]["initContainers"]
        (job_id,) = (e for e in sidecar["env"] if e["name"] == "EERL_JOB_ID")
        assert job_id["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"

    def test_the_trainer_requests_gpus_and_speaks_only_to_the_sidecar(self, pod: dict[str, Any]) -> None:
        (trainer,) = pod["spec"]["containers"]
        (sidecar,) = pod["spec"]["initContainers"]
        assert int(trainer["resources"]["limits"]["nvidia.com/gpu"]) > 0
        env = {e["name"]: e.get("value") for e in trainer["env"]}
        listen = sidecar_parser().parse_args(expand(sidecar["args"], sidecar["env"])).listen
        assert env["EERL_SIDECAR"] == listen
        assert listen.startswith("unix:/run/eerl-sidecar/")
        assert "EERL_SOCKET" not in env

    def test_the_trainer_and_the_sidecar_are_one_user_since_the_sidecar_serves_only_its_own(
        self, pod: dict[str, Any]
    ) -> None:
        spec = pod["spec"]
        (trainer,) = spec["containers"]
        (sidecar,) = spec["initContainers"]

        def uid(container: dict[str, Any]) -> int:
            return int(
                container.get("securityContext", {}).get("runAsUser", spec["securityContext"]["runAsUser"])
            )

        assert uid(trainer) == uid(sidecar) != 0

    def test_the_sidecars_flags_and_probes_are_valid(self, pod: dict[str, Any]) -> None:
        (sidecar,) = pod["spec"]["initContainers"]
        args = sidecar_parser().parse_args(expand(sidecar["args"], sidecar["env"]))
        assert args.listen.startswith("unix:")
        probe_env = {e["name"]: e.get("value") for e in sidecar["env"]}
        assert probe_env["EERL_SIDECAR"] == args.listen  # where the probes' `eerl status` looks
        assert args.scoped
        assert args.socket == "/run/eerl/eerld.sock"  # eerld.grants.OWN_DIRECTORY_SOCKET in the mount
        assert args.socket == sidecar["volumeMounts"][0]["mountPath"] + "/eerld.sock"
        for probe in ("startupProbe", "livenessProbe"):
            command = sidecar[probe]["exec"]["command"]
            assert command[0] == "eerl"
            assert eerl_parser().parse_args(command[1:]).strict
