"""Load: concurrent client processes send phase events; the daemon books every one to the right session."""

from __future__ import annotations

import pytest

from soak import load

pytestmark = pytest.mark.slow

CLIENTS = 8
EVENTS = 100


def test_every_event_of_concurrent_clients_is_booked_once_to_its_own_session() -> None:
    result = load.run_load(CLIENTS, EVENTS)
    assert result["mismatches"] == []
    assert result["rpc_errors"] == 0
    assert result["events_sent"] == CLIENTS * EVENTS
    assert result["sessions_left_after_close"] == 0
    assert result["daemon_exit_code"] == 0
