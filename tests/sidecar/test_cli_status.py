"""``eerl status`` without ``--json``: the sidecar's answer in a few lines people read."""

from __future__ import annotations

from typing import Any

from eerl.cli import status_lines

REPLY: dict[str, Any] = {
    "version": "0.1.0",
    "job_id": "grpo-run",
    "gpus": ["0", "1"],
    "enabled": True,
    "connected": True,
    "attached": True,
    "session": "1a2b3c4d",
    "uptime_s": 12.5,
    "open_phases": [{"kind": "generation", "iteration": 3, "open_s": 1.2}],
    "phases": {
        "generation": {
            "state": "exploring",
            "sm_clock_mhz": 1200,
            "metered": 3,
            "duration_s": 30.0,
            "energy_j": 9e3,
        },
        "training": {
            "state": "baseline",
            "sm_clock_mhz": None,
            "metered": 3,
            "duration_s": 12.0,
            "energy_j": 4e3,
        },
    },
    "refused_requests": 0,
    "client": {"sent_events": 12},
}


def test_a_connected_session_in_a_few_lines() -> None:
    assert status_lines(REPLY) == [
        "job grpo-run on GPUs 0,1: connected to eerld, session 1a2b3c4d",
        "  generation: exploring, SM clock 1200 MHz; 3 phases metered, 30.0 s, 9000.0 J",
        "  training: baseline, default clocks; 3 phases metered, 12.0 s, 4000.0 J",
        "  open phases: generation 3",
    ]


def test_no_daemon_and_disabled_say_the_job_runs_at_default_clocks() -> None:
    away = status_lines({**REPLY, "connected": False, "phases": {}, "open_phases": []})
    assert away == [
        "job grpo-run on GPUs 0,1: not connected to eerld (the job runs at the default clocks)",
        "  open phases: none",
    ]
    assert "off (eerl is disabled" in status_lines({**REPLY, "enabled": False})[0]


def test_job_mode_shows_the_node_and_its_state() -> None:
    job = {"nodes": 2, "node_rank": 1, "state": "off", "reason": "the side group did not form"}
    assert (
        status_lines({**REPLY, "job": job})[-1]
        == "  job mode: node 1 of 2, off (the side group did not form)"
    )
