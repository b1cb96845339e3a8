"""Sessions and phases against a recording fake daemon over a real gRPC channel."""

from __future__ import annotations

import eerl
import pytest
from eerl import ClientConfig, ConfigError, PhaseKind, Workload
from eerl.testing import FakeDaemon, RecordedPhase


def _phases(fake: FakeDaemon) -> list[tuple[bool, PhaseKind, int, Workload]]:
    return [(p.begin, p.kind, p.iteration, p.workload) for p in fake.phases]


def _ends(fake: FakeDaemon) -> list[RecordedPhase]:
    return [p for p in fake.phases if not p.begin]


class TestOpening:
    def test_the_session_claims_the_gpus_by_index_and_uuid(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        with eerl.connect(gpus=[0, "GPU-5f1c", "MIG-77aa"], job_id="job-1", config=config) as session:
            assert session.wait_until_connected(5)
        (request,) = [s.request for s in fake.sessions]
        refs = [ref.index if ref.WhichOneof("ref") == "index" else ref.uuid for ref in request.gpus]
        assert (request.job_id, refs) == ("job-1", [0, "GPU-5f1c", "MIG-77aa"])

    def test_mode_role_rank_and_threshold_reach_the_daemon(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        with eerl.connect(
            gpus=[1], config=config, mode="async", role="training", rank=3, world_size=8, threshold=0.9
        ) as session:
            assert session.wait_until_connected(5)
        request = fake.sessions[0].request
        assert (request.mode, request.role, request.rank, request.world_size) == (2, 3, 3, 8)
        assert request.policy.throughput_threshold == pytest.approx(0.9)

    def test_gpus_default_to_cuda_visible_devices(
        self, fake: FakeDaemon, config: ClientConfig, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb")
        with eerl.connect(config=config) as session:
            assert session.gpus == ("GPU-aaaa", "GPU-bbbb")
            assert session.wait_until_connected(5)
        assert [ref.uuid for ref in fake.sessions[0].request.gpus] == ["GPU-aaaa", "GPU-bbbb"]

    def test_the_stream_binds_the_session(self, fake: FakeDaemon, config: ClientConfig) -> None:
        with eerl.connect(gpus=[0], config=config) as session:
            assert session.wait_until_connected(5)
            assert fake.wait_for(lambda f: f.sessions[0].attached)

    def test_close_ends_the_session_at_the_daemon(self, fake: FakeDaemon, config: ClientConfig) -> None:
        session = eerl.connect(gpus=[0], config=config)
        assert session.wait_until_connected(5)
        session.close()
        session.close()
        assert fake.sessions[0].closed
        assert fake.live_sessions() == []

    @pytest.mark.parametrize(
        ("argument", "value"), [("mode", "lockstep"), ("role", "critic"), ("threshold", 1.5)]
    )
    def test_invalid_arguments_are_the_callers_error(
        self, config: ClientConfig, argument: str, value: object
    ) -> None:
        with pytest.raises(ConfigError, match=argument):
            eerl.connect(gpus=[0], config=config, **{argument: value})  # type: ignore[arg-type]


class TestPhases:
    def test_phases_arrive_in_order_with_their_tokens(self, fake: FakeDaemon, config: ClientConfig) -> None:
        with eerl.connect(gpus=[0], config=config) as session:
            with session.phase("generation", iteration=4) as p:
                p.report(tokens=300, sequences=4, max_response_tokens=120, prompt_tokens=80)
            with session.phase("training", iteration=4) as p:
                p.report(tokens=380, valid_tokens=300, sequences=4)
            assert session.flush(5)
        assert _phases(fake) == [
            (True, PhaseKind.GENERATION, 4, Workload()),
            (False, PhaseKind.GENERATION, 4, Workload(300, 0, 4, 120, 80)),
            (True, PhaseKind.TRAINING, 4, Workload()),
            (False, PhaseKind.TRAINING, 4, Workload(380, 300, 4, 0, 0)),
        ]

    def test_reports_add_up_and_the_longest_response_wins(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        with eerl.connect(gpus=[0], config=config) as session:
            with session.phase("training") as p:
                p.report(tokens=10, valid_tokens=5, sequences=1, max_response_tokens=5)
                p.report(tokens=20, valid_tokens=7, sequences=2, max_response_tokens=4)
            assert session.flush(5)
        assert _ends(fake)[0].workload == Workload(30, 12, 3, 5, 0)

    def test_the_busiest_workers_kv_reads_reach_the_daemon_and_the_largest_wins(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        """Workers report their own KV reads; the phase's figure is the busiest one's (over the wire)."""
        with eerl.connect(gpus=[0], config=config) as session:
            with session.phase("generation") as p:
                p.report(tokens=100, sequences=2, max_worker_kv_tokens=5_000)
                p.report(tokens=100, sequences=2, max_worker_kv_tokens=9_000)
                p.report(tokens=100, sequences=2, max_worker_kv_tokens=7_000)
            assert session.flush(5)
        assert _ends(fake)[0].workload == Workload(300, 0, 6, 0, 0, 9_000)

    def test_hints_go_with_the_begin(self, fake: FakeDaemon, config: ClientConfig) -> None:
        with eerl.connect(gpus=[0], config=config) as session:
            with session.phase("generation", hints=Workload(sequences=64, prompt_tokens=4096)):
                pass
            assert session.flush(5)
        assert fake.phases[0].workload == Workload(sequences=64, prompt_tokens=4096)

    def test_iterations_count_up_per_kind_after_the_last_explicit_one(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        with eerl.connect(gpus=[0], config=config) as session:
            for _ in range(2):
                with session.phase("gen"), session.phase("train"):
                    pass
            with session.phase("generation", iteration=10):
                pass
            with session.phase("generation"):
                pass
            assert session.flush(5)
        generation = [p.iteration for p in _ends(fake) if p.kind is PhaseKind.GENERATION]
        training = [p.iteration for p in _ends(fake) if p.kind is PhaseKind.TRAINING]
        assert (generation, training) == ([0, 1, 10, 11], [0, 1])

    def test_the_end_is_sent_when_the_body_raises(self, fake: FakeDaemon, config: ClientConfig) -> None:
        with eerl.connect(gpus=[0], config=config) as session:

            def failing_step() -> None:
                with session.phase("training") as p:
                    p.report(tokens=1)
                    raise RuntimeError("boom")

            with pytest.raises(RuntimeError, match="boom"):
                failing_step()
            assert session.flush(5)
        assert [(p.begin, p.workload.tokens) for p in fake.phases] == [(True, 0), (False, 1)]

    def test_hints_that_are_no_workload_are_the_callers_error(self, config: ClientConfig) -> None:
        with eerl.connect(gpus=[0], config=config) as session, pytest.raises(ConfigError, match="hints"):
            session.phase("generation", hints={"tokens": 5})  # type: ignore[arg-type]

    def test_an_unknown_phase_kind_is_the_callers_error(self, config: ClientConfig) -> None:
        with eerl.connect(gpus=[0], config=config) as session, pytest.raises(ConfigError, match="phase kind"):
            session.phase("evaluation")

    def test_waiting_for_the_clock_returns_after_the_daemon_began_the_phase(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        with eerl.connect(gpus=[0], config=config) as session:
            assert session.wait_until_connected(5)
            with session.phase("generation", wait_for_clock_s=5.0):
                assert [p.begin for p in fake.phases] == [True]


class TestDecorator:
    def test_each_call_is_one_phase_with_a_counted_iteration(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        with eerl.connect(gpus=[0], config=config) as session:

            @session.phase("generation")
            def generate(batch: list[int]) -> int:
                session.report(tokens=sum(batch), sequences=len(batch))
                return len(batch)

            assert generate([1, 2]) == 2
            assert generate([3]) == 1
            assert session.flush(5)
        assert [(p.iteration, p.workload.tokens, p.workload.sequences) for p in _ends(fake)] == [
            (0, 3, 2),
            (1, 3, 1),
        ]

    def test_a_callable_iteration_sees_the_functions_arguments(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        with eerl.connect(gpus=[0], config=config) as session:

            @session.phase("training", iteration=lambda step, **_: step * 10)
            def train(step: int, *, lr: float) -> float:
                return lr

            assert train(2, lr=0.5) == 0.5
            assert session.flush(5)
        assert [p.iteration for p in fake.phases] == [20, 20]

    def test_report_outside_a_phase_is_ignored(self, config: ClientConfig) -> None:
        with eerl.connect(gpus=[0], config=config) as session:
            session.report(tokens=5)
            assert session.current_phase() is None
