"""The sidecar's HTTP API: what it refuses (4xx, a one-line JSON error naming the field, nothing forwarded),
its bounds, and the pure parsing behind it."""

from __future__ import annotations

import http.client
import json
import select
from collections.abc import Callable
from typing import Any

import eerl
import pytest
from eerl import ClientConfig
from eerl.errors import ConfigError
from eerl.phases import PhaseKind, Workload
from eerl.sidecar._address import SidecarAddress, parse_address
from eerl.sidecar._api import ApiError, parse_begin, parse_end

from tests.sidecar.conftest import SidecarProcess, SimEerld, sidecar_for, wait_until

BAD_REQUESTS: list[tuple[str, bytes, int, str]] = [
    # (endpoint, body, status, the field the error names)
    ("begin", b"{bad", 400, "body"),
    ("begin", b"", 400, "body"),
    ("begin", b"[1, 2]", 400, "body"),
    ("begin", b'"generation"', 400, "body"),
    ("begin", b"\xff\xfe", 400, "body"),
    ("begin", b'{"iteration": 1}', 400, "kind"),
    ("begin", b'{"kind": "decoding", "iteration": 1}', 400, "kind"),
    ("begin", b'{"kind": 7, "iteration": 1}', 400, "kind"),
    ("begin", b'{"kind": "generation", "iteration": -1}', 400, "iteration"),
    ("begin", b'{"kind": "generation", "iteration": "3"}', 400, "iteration"),
    ("begin", b'{"kind": "generation", "iteration": 2.5}', 400, "iteration"),
    ("begin", b'{"kind": "generation", "iteration": true}', 400, "iteration"),
    ("begin", b'{"kind": "generation", "iteration": 1000000000001}', 400, "iteration"),
    ("begin", b'{"kind": "generation", "iteration": NaN}', 400, "body"),
    ("begin", b'{"kind": "generation", "iteration": 1, "tokens": 5}', 400, "tokens"),
    ("begin", b'{"kind": "generation", "hints": [1]}', 400, "hints"),
    ("begin", b'{"kind": "generation", "hints": {"tokens": -1}}', 400, "hints.tokens"),
    ("begin", b'{"kind": "generation", "hints": {"tokenz": 1}}', 400, "hints.tokenz"),
    ("end", b'{"kind": "generation", "iteration": 1, "tokens": -5}', 400, "tokens"),
    ("end", b'{"kind": "training", "iteration": 1, "tokens": 10, "valid_tokens": 20}', 400, "valid_tokens"),
    ("end", b'{"kind": "training", "iteration": 1, "tokens": 1000000000001}', 400, "tokens"),
    ("end", b'{"kind": "training", "iteration": 1, "sequences": "16"}', 400, "sequences"),
    ("end", b'{"kind": "training", "iteration": 1, "sequences": 1e10}', 400, "sequences"),
    ("end", b'{"kind": "training", "iteration": 1, "hints": {}}', 400, "hints"),
    ("end", b'{"kind": "generation", "iteration": 9}', 409, "iteration"),
    ("end", b'{"kind": "training"}', 409, "kind"),
]


def state(sidecar: SidecarProcess, eerld_sim: SimEerld, job_id: str) -> tuple[Any, ...]:
    """Everything a request could change: the sidecar's phases and counters, the daemon's session."""
    status = sidecar.status()
    session = eerld_sim.session_of(job_id)
    assert session is not None
    return (
        [(p["kind"], p["iteration"]) for p in status["open_phases"]],
        status["phases"],
        status["client"]["sent_events"],
        status["client"]["queued_events"],
        session.current_phase,
        session.iteration,
        [(p.kind, p.phases) for p in session.phases],
        eerld_sim.locks(),
    )


@pytest.fixture
def api_sidecar(eerld_sim: SimEerld, start_sidecar: Callable[..., SidecarProcess]) -> SidecarProcess:
    sidecar = sidecar_for(start_sidecar, eerld_sim.socket_path, "api-job", "--max-connections", "3")
    wait_until("the sidecar's session", lambda: sidecar.status()["connected"])
    return sidecar


class TestRefusals:
    def test_bad_requests_get_a_4xx_naming_the_field_and_change_nothing(
        self, api_sidecar: SidecarProcess, eerld_sim: SimEerld
    ) -> None:
        # One phase open, so that a refused end or a refused begin could disturb it.
        assert api_sidecar.post("/v1/phases/begin", {"kind": "generation", "iteration": 1})[0] == 200
        before = state(api_sidecar, eerld_sim, "api-job")
        for endpoint, body, status, field in BAD_REQUESTS:
            code, reply = api_sidecar.request("POST", f"/v1/phases/{endpoint}", body)
            assert code == status, (endpoint, body, reply)
            assert list(reply) == ["error"], reply
            assert reply["error"].startswith(f"{field}:"), (body, reply)
            assert "\n" not in reply["error"]
        code, reply = api_sidecar.post("/v1/phases/begin", {"kind": "generation", "iteration": 1})
        assert (code, reply["error"]) == (409, "iteration: the generation phase 1 is already open")
        assert state(api_sidecar, eerld_sim, "api-job") == before
        assert api_sidecar.status()["refused_requests"] == len(BAD_REQUESTS) + 1
        # The open phase is intact: it ends and is metered.
        code, reply = api_sidecar.post("/v1/phases/end", {"kind": "gen", "iteration": 1, "tokens": 3})
        assert code == 200
        assert reply["metered"] is True
        assert reply["duration_clock"] == "simulated"  # eerld --backend sim: not wall seconds, and it says so
        assert eerld_sim.metered("api-job")["PHASE_KIND_GENERATION"] == 1

    def test_wrong_paths_methods_and_bodies(self, api_sidecar: SidecarProcess) -> None:
        assert api_sidecar.request("GET", "/v1/phases/begin")[0] == 405
        assert api_sidecar.request("POST", "/v1/status", b"{}")[0] == 405
        code, reply = api_sidecar.request("GET", "/v1/nothing")
        assert code == 404
        assert reply["error"].startswith("path:")
        too_large = b"POST /v1/phases/begin HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n"
        chunked = (
            b"POST /v1/phases/begin HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b'16\r\n{"kind": "generation"}\r\n0\r\n\r\n'
        )
        for request, status in ((too_large, 413), (chunked, 411)):
            with api_sidecar.connect() as raw:
                raw.sendall(request)  # all at once: the sidecar answers without reading a body, and closes
                reply = http.client.HTTPResponse(raw)
                reply.begin()
                assert reply.status == status
                assert json.loads(reply.read())["error"].startswith("body:")

    def test_healthz_answers(self, api_sidecar: SidecarProcess) -> None:
        assert api_sidecar.request("GET", "/healthz") == (200, {"ok": True})

    def test_connections_beyond_the_bound_get_a_503_at_once(self, api_sidecar: SidecarProcess) -> None:
        # The job's own connections (its user's, on the private Unix socket) fill the table: a fourth one
        # is turned away at once, never left waiting.
        idle = [api_sidecar.connect(5) for _ in range(3)]

        def fourth_request() -> tuple[int, Any]:
            # A connection the sidecar turned away (the fixture's status request may still hold its slot
            # for a moment after its answer) is readable at once: replace it, so that three are held.
            for i, connection in enumerate(idle):
                if select.select([connection], [], [], 0)[0]:
                    connection.close()
                    idle[i] = api_sidecar.connect(5)
            return api_sidecar.request("GET", "/healthz")

        try:
            code, reply = wait_until(
                "all three connections accepted",
                lambda: (answer := fourth_request())[0] == 503 and answer,
            )
            assert code == 503
            assert reply["error"].startswith("connections:")
        finally:
            for connection in idle:
                connection.close()
        wait_until("a free connection", lambda: api_sidecar.request("GET", "/healthz")[0] == 200, 10)


class TestParsing:
    def test_begin_and_end_requests(self) -> None:
        begin = parse_begin(b'{"kind": "rollout", "iteration": 3, "hints": {"tokens": 1e3}}')
        assert begin.kind is PhaseKind.GENERATION
        assert begin.iteration == 3
        assert begin.hints == Workload(tokens=1000)
        assert parse_begin(b'{"kind": "train"}').iteration is None
        end = parse_end(
            b'{"kind": "training", "iteration": 0, "tokens": 8, "valid_tokens": 5, "sequences": 2}'
        )
        assert end.workload == Workload(tokens=8, valid_tokens=5, sequences=2)
        kv = parse_end(b'{"kind": "generation", "tokens": 8, "max_worker_kv_tokens": 4000000000000}')
        assert kv.workload == Workload(tokens=8, max_worker_kv_tokens=4 * 10**12)  # beyond the token limit
        assert parse_end(b'{"kind": "training", "tokens": null}').workload == Workload()

    @pytest.mark.parametrize(("endpoint", "body", "status", "field"), BAD_REQUESTS[:-2])
    def test_refusals_name_the_field(self, endpoint: str, body: bytes, status: int, field: str) -> None:
        with pytest.raises(ApiError) as caught:
            (parse_begin if endpoint == "begin" else parse_end)(body)
        assert caught.value.status == status
        assert caught.value.message.startswith(f"{field}:")
        assert json.loads(caught.value.body()) == {"error": caught.value.message}

    def test_a_large_body_is_413(self) -> None:
        with pytest.raises(ApiError) as caught:
            parse_begin(b" " * 20000)
        assert caught.value.status == 413


class TestAddresses:
    @pytest.mark.parametrize(
        ("text", "address"),
        [
            ("http://127.0.0.1:9479", SidecarAddress(host="127.0.0.1", port=9479)),
            ("http://127.0.0.1:9479/", SidecarAddress(host="127.0.0.1", port=9479)),
            ("localhost:80", SidecarAddress(host="localhost", port=80)),
            ("[::1]:9479", SidecarAddress(host="::1", port=9479)),
            ("unix:/run/eerl/sidecar.sock", SidecarAddress(path="/run/eerl/sidecar.sock")),
            ("unix:///run/eerl/sidecar.sock", SidecarAddress(path="/run/eerl/sidecar.sock")),
        ],
    )
    def test_parses(self, text: str, address: SidecarAddress) -> None:
        assert parse_address(text) == address
        assert parse_address(address.url) == address
        assert address.loopback

    @pytest.mark.parametrize(
        "text",
        [
            "",
            "https://127.0.0.1:9479",
            "http://127.0.0.1:9479/v1",
            "127.0.0.1",
            "unix:relative.sock",
            "h:99999",
            "http://u@h:1",
            "[::1",
        ],
    )
    def test_refuses(self, text: str) -> None:
        with pytest.raises(ConfigError):
            parse_address(text)

    def test_other_hosts_are_not_loopback(self) -> None:
        assert not parse_address("10.0.0.1:9479").loopback
        assert not parse_address("0.0.0.0:9479").loopback
        assert parse_address("127.0.0.1", default_port=9479).port == 9479


class TestConfig:
    def test_eerl_sidecar_wins_over_the_sockets(self) -> None:
        config = ClientConfig.from_env(
            {"EERL_SIDECAR": "127.0.0.1:9479", "EERL_SOCKET": "/run/x.sock", "EERL_JOB_ID": "j"}
        )
        assert (config.transport, config.sidecar_url, config.target) == (
            "sidecar",
            "http://127.0.0.1:9479",
            "http://127.0.0.1:9479",
        )
        assert config.job_id == "j"
        assert ClientConfig.from_env({"EERL_SIDECAR": "x", "EERL_DISABLE": "1"}).disabled

    def test_a_bad_sidecar_address_is_a_config_error(self) -> None:
        with pytest.raises(ConfigError, match="EERL_SIDECAR"):
            ClientConfig.from_env({"EERL_SIDECAR": "https://sidecar:9479"})
        with pytest.raises(ConfigError, match="sidecar_url"):
            ClientConfig(transport="sidecar")

    def test_connect_is_off_with_one_warning_for_a_bad_address(
        self, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        monkeypatch.setenv("EERL_SIDECAR", "ftp://nowhere")
        assert not eerl.connect().enabled
        assert "EERL_SIDECAR" in caplog.text
