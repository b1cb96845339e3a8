"""Crashes: clients killed mid-phase, the daemon killed under load, a process killed mid ledger write."""

from __future__ import annotations

import pytest

from soak import kills

pytestmark = pytest.mark.slow


def test_clients_killed_mid_phase_have_their_gpus_reset_by_the_end_of_their_stream_and_leak_no_lock() -> None:
    """With an hour-long lease, every reset seen comes from the broken Attach stream, not the lease.

    How fast it comes (the 2 s bound) is a figure of `make soak`, not an assertion here.
    """
    result = kills.client_kills(5, lease_ttl_s=3600.0)
    assert result["problems"] == []
    assert result["kills"] == 5
    assert result["leaked_locks"] == 0
    assert result["ledger_entries_left"] == 0


def test_after_each_daemon_kill_no_gpu_is_left_locked_the_ledger_is_intact_and_clients_carry_on() -> None:
    result = kills.daemon_kills(3)
    assert result["problems"] == []
    assert result["workers_alive_at_end"] == result["clients"]
    assert result["leaked_locks_at_end"] == 0
    assert result["ledger_entries_at_end"] == 0


def test_a_process_killed_while_rewriting_the_ledger_leaves_a_readable_ledger() -> None:
    result = kills.ledger_write_kills(3)
    assert result["corrupt"] == 0
