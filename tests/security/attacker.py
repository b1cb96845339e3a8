"""An attacker process: imports gRPC and the eerl stubs as root, drops to an unprivileged user, then calls.

The tests of this package run it through :func:`tests.security.conftest.run_as`, so that every attack on the
root daemon's boundary is made the way a real local user would make it: a process whose uid, gid and groups
the kernel checks when it connects to a socket. Everything the attack needs is imported *before* the drop
(the checkout and its virtual environment may not be readable by that user); nothing privileged is kept.

Input (stdin, one line of JSON): ``{"uid": U, "gid": G, "groups": [...], "target": "unix:/path" | "host:port",
"tls": {"ca": PEM, "cert": PEM, "key": PEM} | null, "calls": [{"service": S, "method": M,
"request": {...}, "timeout_s": T}]}``. Output (stdout, JSON): ``{"euid": U, "results": [{"code": NAME,
"details": TEXT, "response": {...}}]}``, one result per call, in order. With ``"hold": {"streams": N,
"channels": C}`` instead of calls, it holds N idle streams open (see :func:`_hold`) until stdin closes.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

import grpc

# grpc imports these lazily, on the first channel: after the drop the checkout may not be readable.
import grpc._channel
import grpc._interceptor
import grpc._utilities
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2_grpc

from eerld.csi.proto import csi_pb2, csi_pb2_grpc

STUBS: dict[str, Any] = {
    "PhaseService": pb_grpc.PhaseServiceStub,
    "AdminService": pb_grpc.AdminServiceStub,
    "Health": health_pb2_grpc.HealthStub,
    "Identity": csi_pb2_grpc.IdentityStub,
    "Node": csi_pb2_grpc.NodeStub,
}
MESSAGES: dict[str, Any] = {"Health": health_pb2, "Identity": csi_pb2, "Node": csi_pb2}


def drop_privileges(uid: int, gid: int, groups: list[int]) -> None:
    """Become ``uid``/``gid`` with ``groups`` (everything needed is imported already)."""
    os.setgroups(groups)
    os.setgid(gid)
    os.setuid(uid)
    if os.geteuid() != uid or os.getegid() != gid or (uid == 0 and groups):
        raise SystemExit("attacker: could not drop privileges")


def _request(service: str, method: str, fields: dict[str, Any]) -> Any:
    module = MESSAGES.get(service, pb)
    descriptor = module.DESCRIPTOR.services_by_name[service].methods_by_name[method]
    message_class = getattr(module, descriptor.input_type.name)
    return json_format.ParseDict(fields, message_class())


def _channel(target: str, tls: dict[str, str] | None) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(target)
    credentials = grpc.ssl_channel_credentials(
        tls["ca"].encode(),
        tls["key"].encode() if tls.get("key") else None,
        tls["cert"].encode() if tls.get("cert") else None,
    )
    return grpc.secure_channel(target, credentials)


def _call(channel: grpc.Channel, call: dict[str, Any]) -> dict[str, Any]:
    stub = STUBS[call["service"]](channel)
    request = _request(call["service"], call["method"], call.get("request", {}))
    try:
        response = getattr(stub, call["method"])(request, timeout=call.get("timeout_s", 10.0))
        if not hasattr(response, "DESCRIPTOR"):  # a server stream: read what it sends
            response = list(response)[-1] if call.get("read_stream") else None
    except grpc.RpcError as e:
        return {"code": e.code().name, "details": e.details() or "", "response": {}}
    body = json_format.MessageToDict(response) if response is not None else {}
    return {"code": "OK", "details": "", "response": body}


def _hold(target: str, hold: dict[str, Any]) -> dict[str, Any]:
    """Open ``streams`` streams that never send (3 in 4 reflection, 1 in 4 health Watch) over ``channels``.

    Prints ``ready`` with what the server did to them after ``settle_s`` (how many it ended at once, and
    with which codes), then holds the open ones until stdin closes; returns how each one ended.
    """
    never = threading.Event()

    def silence() -> Any:
        never.wait()
        yield from ()

    channels = [grpc.insecure_channel(target) for _ in range(hold.get("channels", 1))]
    ended: dict[str, int] = {}
    lock = threading.Lock()

    def done(call: Any) -> None:
        with lock:
            name = call.code().name
            ended[name] = ended.get(name, 0) + 1

    calls = []
    for i in range(hold["streams"]):
        channel = channels[i % len(channels)]
        if i % 4 != 3:  # reflection takes a server thread per stream; health Watch does not, but counts
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            call = stub.ServerReflectionInfo(silence())
        else:
            call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        call.add_done_callback(done)
        calls.append(call)
    time.sleep(hold.get("settle_s", 2.0))
    with lock:
        settled = dict(ended)
    print(json.dumps({"ready": True, "ended_at_once": settled}), flush=True)
    sys.stdin.read()  # the test closes stdin when it has measured
    with lock:
        final = dict(ended)
    never.set()
    for call in calls:
        call.cancel()
    for channel in channels:
        channel.close()
    return {"ended_at_once": settled, "ended_while_held": final}


def main() -> int:
    spec = json.loads(sys.stdin.readline())
    drop_privileges(spec["uid"], spec["gid"], spec.get("groups", []))
    if "hold" in spec:
        json.dump({"euid": os.geteuid(), **_hold(spec["target"], spec["hold"])}, sys.stdout)
        return 0
    results = []
    with _channel(spec["target"], spec.get("tls")) as channel:
        for call in spec["calls"]:
            results.append(_call(channel, call))
    json.dump({"euid": os.geteuid(), "results": results}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
