"""A job that holds a GPU without an Attach stream: imports gRPC as root, drops to a user, claims, steers.

It opens a session with the lease it asks for (the attack asks for an hour) and no Attach stream, begins a
generation phase (a fixed controller locks the GPU's clock), prints one JSON line with what it got
(``{"code", "details", "session_id", "lease_ttl_s"}``), then waits: with ``--heartbeat S`` it renews the
lease every S seconds (a process that outlives its pod), without it it just waits (a job about to be
SIGKILLed mid-phase). It ends when stdin closes; the tests mostly SIGKILL it.

Usage: python lease_job.py UID GID TARGET JOB_ID LEASE_TTL_S [--heartbeat S]
"""

from __future__ import annotations

import contextlib
import json
import select
import sys

import grpc
from attacker import drop_privileges  # this directory: it also imports what grpc would import lazily
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc


def _wait(channel: grpc.Channel, session_id: str, heartbeat_s: float | None) -> None:
    stub = pb_grpc.PhaseServiceStub(channel)
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], heartbeat_s if heartbeat_s else None)
        if ready and not sys.stdin.readline():
            return  # stdin closed: the test is done with this job
        if heartbeat_s:
            # the session may have been ended under it: keep waiting, as a stuck job would
            with contextlib.suppress(grpc.RpcError):
                stub.Heartbeat(pb.HeartbeatRequest(session_id=session_id), timeout=5)


def main() -> int:
    uid, gid, target, job_id, lease_ttl_s = sys.argv[1:6]
    heartbeat_s = float(sys.argv[7]) if sys.argv[6:7] == ["--heartbeat"] else None
    drop_privileges(int(uid), int(gid), [])
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.PhaseServiceStub(channel)
        try:
            opened = stub.OpenSession(
                pb.OpenSessionRequest(job_id=job_id, lease_ttl_s=float(lease_ttl_s)), timeout=10
            )
            stub.BeginPhase(
                pb.BeginPhaseRequest(
                    session_id=opened.session_id, kind=pb.PHASE_KIND_GENERATION, iteration=0
                ),
                timeout=10,
            )
        except grpc.RpcError as e:
            print(json.dumps({"code": e.code().name, "details": e.details() or ""}), flush=True)
            return 0
        reply = {"code": "OK", "details": "", "session_id": opened.session_id}
        print(json.dumps({**reply, "lease_ttl_s": opened.lease_ttl_s}), flush=True)
        _wait(channel, opened.session_id, heartbeat_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
