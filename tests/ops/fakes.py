"""A fake metrics source for the operations tests: a node with one session, one lock and one pin."""

from __future__ import annotations

from dataclasses import dataclass

from eerl.phases import ControllerState, PhaseKind

from eerld.metrics import (
    DaemonSample,
    GpuSample,
    MetricsSnapshot,
    PhaseSample,
    SessionSample,
)


@dataclass
class FakeMetricsSource:
    """A node with GPU 0 locked by a session's controller and GPU 1 pinned by an admin."""

    energy_j: float = 1000.0
    fail: bool = False
    hostname: str = "node-1"

    def metrics_snapshot(self) -> MetricsSnapshot:
        """Every metric family populated; the energy grows by 10 J per scrape."""
        if self.fail:
            raise RuntimeError("backend exploded")
        self.energy_j += 10.0
        gpus = (
            GpuSample(
                index=0,
                uuid="GPU-00000000-0000-0000-0000-000000000000",
                name="NVIDIA H100 80GB HBM3",
                pci_bus_id="00000000:18:00.0",
                energy_j=self.energy_j,
                power_w=512.5,
                power_limit_w=700.0,
                sm_clock_mhz=1410,
                locked_sm_clock_mhz=1410,
            ),
            GpuSample(
                index=1,
                uuid="GPU-11111111-1111-1111-1111-111111111111",
                name="NVIDIA H100 80GB HBM3",
                pci_bus_id="00000000:2A:00.0",
                energy_j=2 * self.energy_j,
                power_w=120.0,
                power_limit_w=700.0,
                sm_clock_mhz=1200,
                locked_sm_clock_mhz=1200,
                admin_pinned=True,
                degraded_reason="",
            ),
            GpuSample(
                index=2,
                uuid="GPU-22222222-2222-2222-2222-222222222222",
                name="NVIDIA H100 80GB HBM3",
                pci_bus_id="00000000:3A:00.0",
                energy_j=0.0,
                power_w=0.0,
                power_limit_w=700.0,
                sm_clock_mhz=0,
                locked_sm_clock_mhz=None,
                degraded_reason="GPU lost",
            ),
        )
        session = SessionSample(
            job_id="job-42",
            rank=0,
            gpu_indices=(0,),
            mode="sync",
            phases=(
                PhaseSample(
                    kind=PhaseKind.GENERATION,
                    state=ControllerState.COMMITTED,
                    sm_clock_mhz=1410,
                    phases=12,
                    energy_j=3600.0,
                    valid_tokens=0,  # generation credits no valid tokens of its own
                    energy_per_valid_token_j=0.0,
                    throughput_tokens_per_s=8000.0,
                    estimated_savings_fraction=0.12,
                    exploration_cost_j=40.0,
                    predictor_error_fraction=0.02,
                ),
                PhaseSample(
                    kind=PhaseKind.TRAINING,
                    state=ControllerState.BASELINE,
                    sm_clock_mhz=None,
                    phases=12,
                    energy_j=5000.0,
                    valid_tokens=120_000,
                    energy_per_valid_token_j=0.03,
                ),
            ),
        )
        daemon = DaemonSample(
            version="0.1.0",
            backend="sim",
            controller="eerl",
            dry_run=False,
            hostname=self.hostname,
            started_at_unix_s=1_700_000_000.0,
        )
        return MetricsSnapshot(daemon=daemon, gpus=gpus, sessions=(session,))
