"""The body of one rank in tests/client/job/test_dist.py (spawned; writes what it saw as JSON)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist
from eerl import ClientConfig
from eerl.dist import DistJob
from eerl.phases import PhaseKind

GEN, TRAIN = PhaseKind.GENERATION, PhaseKind.TRAINING


def run_rank(
    rank: int,
    world: int,
    init_file: str,
    sockets: list[str],
    out_dir: str,
    stall_rank: int,
    shift_rank: int = -1,
) -> None:
    per_node = world // len(sockets)
    node, local_rank = divmod(rank, per_node)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    config = ClientConfig.uds(sockets[node])
    job = DistJob(
        job_id="dist-job",
        config=config,
        local_rank=local_rank,
        gpus=[0, 1],
        timeout_s=2.0,
        policy="fixed",
        fixed_clocks={GEN: 1200, TRAIN: 1500},
    )
    seen: list[dict[str, Any]] = []
    for iteration in range(3):
        if rank == stall_rank and iteration == 1:
            time.sleep(3.0)  # a rank that stops taking part in the side group
        for kind in (GEN, TRAIN):
            # A shifted rank counts its iterations from 1: as if it had missed the job's first iteration.
            with job.phase(kind, iteration + (rank == shift_rank)) as phase:
                begin = job.last_begin if job.is_leader else None
                seen.append(
                    {
                        "iteration": iteration,
                        "kind": kind.value,
                        "enabled": job.enabled,
                        "verdict": begin.verdict.value if begin is not None else None,
                        "clock": begin.sm_clock_mhz if begin is not None else None,
                    }
                )
                time.sleep(0.02)
                phase.report(tokens=100, valid_tokens=50)
            if rank == 0 and job.last_observation is not None:
                seen[-1]["accepted"] = bool(job.last_observation.accepted)
    result = {
        "rank": rank,
        "leader": job.is_leader,
        "node_rank": job.node_rank,
        "nodes": job.nodes,
        "has_controller": job.controller is not None,
        "enabled": job.enabled,
        "disabled_reason": job.disabled_reason,
        "phases": seen,
    }
    job.close()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
