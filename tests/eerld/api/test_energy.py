"""Per-phase energy: attributed to (session, phase, iteration) as the counters measured it."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc
from eerl_sim.gpu import VirtualClock, create_sim_backend
from eerl_sim.profiles import builtin_profile

from eerld.energy import CounterReading, phase_energy
from eerld.testing import FakeGpuBackend, ManualClock, running_daemon
from tests.eerld.conftest import GEN, TRAIN, begin, end, open_session


class TestAttribution:
    def test_each_phase_is_credited_with_the_energy_its_gpus_used_between_begin_and_end(
        self, phase, fake: FakeGpuBackend, clock: ManualClock
    ):
        session = open_session(phase, 0, 1)
        begin(phase, session.session_id, GEN, 0)
        clock.advance(10.0)
        generation = end(phase, session.session_id, GEN, 0)
        begin(phase, session.session_id, TRAIN, 0)
        clock.advance(4.0)
        training = end(phase, session.session_id, TRAIN, 0)
        expected_gen_mj = 2 * (80 + 520 * 1200 / 1980) * 10 * 1000
        expected_train_mj = 2 * (80 + 520 * 1500 / 1980) * 4 * 1000
        assert generation.energy_mj == pytest.approx(expected_gen_mj, rel=0.01)
        assert training.energy_mj == pytest.approx(expected_train_mj, rel=0.01)
        assert generation.duration_s == pytest.approx(10.0)
        assert generation.mean_power_w == pytest.approx(expected_gen_mj / 1000 / 10, rel=0.01)
        closed = phase.CloseSession(pb.CloseSessionRequest(session_id=session.session_id))
        assert closed.energy_mj == pytest.approx(generation.energy_mj + training.energy_mj)
        assert closed.valid_tokens == 1000

    def test_phases_of_other_sessions_do_not_leak_into_a_session(self, phase, clock: ManualClock):
        one = open_session(phase, 0)
        two = open_session(phase, 1, 2)
        begin(phase, one.session_id, GEN, 0)
        clock.advance(5.0)
        begin(phase, two.session_id, GEN, 0)
        clock.advance(5.0)
        first = end(phase, one.session_id, GEN, 0)
        second = end(phase, two.session_id, GEN, 0)
        per_gpu_mj = (80 + 520 * 1200 / 1980) * 1000
        assert first.energy_mj == pytest.approx(10 * per_gpu_mj, rel=0.01)
        assert second.energy_mj == pytest.approx(2 * 5 * per_gpu_mj, rel=0.01)

    def test_energy_matches_the_simulators_ground_truth_within_one_percent(self, sock_dir):
        vclock = VirtualClock(start_s=100.0)
        backend = create_sim_backend(builtin_profile("h100-sxm"), 2, clock=vclock, seed=7)
        device = backend.device
        with (
            running_daemon(sock_dir, backend=backend, clock=vclock.now_s, reaper=False) as handle,
            grpc.insecure_channel(f"unix:{handle.socket_path}") as channel,
        ):
            stub = pb_grpc.PhaseServiceStub(channel)
            session = open_session(stub, 0, 1)
            for iteration, kind in enumerate([GEN, TRAIN, GEN, TRAIN]):
                truth_before = sum(device.true_energy_j(i) for i in (0, 1))
                begin(stub, session.session_id, kind, iteration)
                work = 3.0e5 if kind == TRAIN else 1.0e5
                for gpu in (0, 1):
                    device.run_segments(gpu, np.full(50, work), np.full(50, 0.02))
                measured = end(stub, session.session_id, kind, iteration)
                truth_mj = (sum(device.true_energy_j(i) for i in (0, 1)) - truth_before) * 1000
                assert measured.energy_mj == pytest.approx(truth_mj, rel=0.01)


class TestCounterArithmetic:
    def test_a_counter_that_went_backwards_never_yields_negative_energy(self):
        begin = CounterReading(0.0, {0: 5_000_000, 1: 1_000})
        end = CounterReading(2.0, {0: 300, 1: 3_000})
        energy = phase_energy(begin, end, [0, 1])
        assert energy.energy_mj == 300 + 2_000
        assert energy.counter_reset
        assert energy.complete

    def test_a_gpu_whose_counter_could_not_be_read_is_left_out_and_flagged(self):
        energy = phase_energy(CounterReading(0.0, {0: 10, 1: 10}), CounterReading(1.0, {0: 20}), [0, 1])
        assert energy.energy_mj == 10
        assert not energy.complete
