"""Bad input: fuzzed requests on every RPC get documented codes only and leave the state alone."""

from __future__ import annotations

from soak import fuzz

EXAMPLES = 1000


def test_fuzzed_requests_to_every_rpc_never_crash_the_daemon_nor_change_its_state_when_rejected() -> None:
    result = fuzz.run_fuzz(EXAMPLES)
    assert result["problems"] == []
    assert result["requests"] >= EXAMPLES
