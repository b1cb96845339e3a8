"""A minimal worker process for the client-death tests: opens a session, begins a phase, then waits.

Usage: python client_proc.py SOCKET stream|lease GPU[,GPU...]. Prints ``ready`` once the phase's clock
holds, then sleeps until killed (holding the Attach stream open in ``stream`` mode).
"""

from __future__ import annotations

import sys
import time

import grpc
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc


def main() -> None:
    socket_path, mode, gpus = sys.argv[1], sys.argv[2], [int(g) for g in sys.argv[3].split(",")]
    channel = grpc.insecure_channel(f"unix:{socket_path}")
    stub = pb_grpc.PhaseServiceStub(channel)
    session = stub.OpenSession(
        pb.OpenSessionRequest(
            job_id="victim", gpus=[pb.GpuRef(index=i) for i in gpus], client_name="client_proc"
        )
    )
    if mode == "stream":
        events = stub.Attach(pb.AttachRequest(session_id=session.session_id))
        next(events)
    stub.BeginPhase(pb.BeginPhaseRequest(session_id=session.session_id, kind=pb.PHASE_KIND_GENERATION))
    print("ready", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
