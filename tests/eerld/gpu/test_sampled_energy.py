"""The daemon metering phases through background-sampled energy counters (the NVML default)."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from eerld.gpu.energy_sampler import SampledEnergyBackend
from eerld.testing import FakeGpuBackend, running_daemon
from tests.eerld.conftest import GEN, TRAIN, begin, end, open_session


def test_phase_energy_from_sampled_counters_matches_the_power_drawn(sock_dir: Path) -> None:
    """Each phase's energy is its power times its duration within 8%, though no phase event reads a counter.

    The fake GPU draws a constant power per locked clock (generation 1200 MHz, training 1500 MHz), so the
    truth of a phase is that power times the duration the daemon measured.
    """
    fake = FakeGpuBackend(gpus=2)
    sampled = SampledEnergyBackend(fake, period_s=0.02)
    with (
        running_daemon(sock_dir, backend=sampled, reaper=False) as handle,
        grpc.insecure_channel(f"unix:{handle.socket_path}") as channel,
    ):
        stub = pb_grpc.PhaseServiceStub(channel)
        session = open_session(stub, 0, 1)
        time.sleep(0.3)  # a daemon serves for a while before the first phase: the samplers have history
        for iteration in range(2):
            for kind, clock_mhz in ((GEN, 1200), (TRAIN, 1500)):
                begin(stub, session.session_id, kind, iteration)
                assert fake.locked() == {0: clock_mhz, 1: clock_mhz}
                power_w = 2 * fake.power_at(0)  # both GPUs, locked alike
                time.sleep(0.8)
                ended = end(stub, session.session_id, kind, iteration)
                expected_mj = power_w * ended.duration_s * 1000.0
                assert abs(ended.energy_mj - expected_mj) <= 0.08 * expected_mj
