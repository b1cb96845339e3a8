"""The one link to the daemon (eerl.link): what a failure means, the gRPC, in-memory and sidecar links, and
the job-mode NodeLink over the in-memory daemon."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from eerl import ClientConfig
from eerl._answers import PhaseAnswer
from eerl.directives import Directive, DirectivePurpose, DirectiveVerdict
from eerl.job.node import NodeLink
from eerl.link import CONNECTION_LOST, SESSION_LOST, Code, GrpcLink, LinkError
from eerl.link._grpc import link_error
from eerl.link.memory import MemoryDaemon
from eerl.link.opening import claim_tickets, open_session
from eerl.link.sidecar import _begin_reply, _end_reply
from eerl.phases import ControllerState, PhaseKind
from eerl.v1 import eerl_pb2

from .conftest import wait_until

GEN = PhaseKind.GENERATION


class _RpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class TestWhatAFailureMeans:
    def test_a_lost_connection_is_unavailable_or_cancelled_only(self) -> None:
        assert {Code.UNAVAILABLE, Code.CANCELLED} == CONNECTION_LOST

    def test_not_found_means_the_daemon_forgot_the_session_not_a_lost_connection(self) -> None:
        assert Code.NOT_FOUND in SESSION_LOST
        assert Code.NOT_FOUND not in CONNECTION_LOST
        assert LinkError(Code.NOT_FOUND).session_lost
        assert not LinkError(Code.NOT_FOUND).connection_lost

    def test_a_refusal_of_one_request_is_neither(self) -> None:
        for code in (Code.INVALID_ARGUMENT, Code.FAILED_PRECONDITION, Code.DEADLINE_EXCEEDED):
            error = LinkError(code)
            assert not error.connection_lost
            assert not error.session_lost

    def test_every_grpc_code_maps_to_the_code_of_its_name(self) -> None:
        for status in grpc.StatusCode:
            if status is grpc.StatusCode.OK:
                continue
            error = link_error(_RpcError(status, "why"))
            assert error.code.name == status.name
            assert error.describe() == f"{status.name}: why"

    def test_a_failure_without_details_is_named_by_its_code(self) -> None:
        assert link_error(_RpcError(grpc.StatusCode.UNAVAILABLE, "")).describe() == "UNAVAILABLE"


class TestGrpcLink:
    def test_an_absent_daemon_is_a_lost_connection(self, tmp_path: Path) -> None:
        link = GrpcLink(ClientConfig.uds(tmp_path / "none.sock"))
        try:
            with pytest.raises(LinkError) as caught:
                link.open_session(eerl_pb2.OpenSessionRequest(job_id="j"), 0.5)
        finally:
            link.close()
        assert caught.value.connection_lost


class TestMemoryDaemon:
    def test_a_session_opens_takes_phases_and_closes(self) -> None:
        daemon = MemoryDaemon(gpus=2)
        link = daemon.connect()
        reply = link.open_session(eerl_pb2.OpenSessionRequest(job_id="j"), 1.0)
        assert len(reply.gpus) == 2
        begin = link.begin_phase(eerl_pb2.BeginPhaseRequest(session_id=reply.session_id, iteration=3), 1.0)
        assert begin is not None
        assert begin.target_sm_clock_mhz == daemon.sm_clock_mhz
        end = link.end_phase(eerl_pb2.EndPhaseRequest(session_id=reply.session_id, iteration=3), 1.0)
        assert end is not None
        assert end.gpus == 2
        link.close_session(reply.session_id, 1.0)
        assert daemon.sessions == []
        assert [call.name for call in daemon.rpcs()] == [
            "OpenSession",
            "BeginPhase",
            "EndPhase",
            "CloseSession",
        ]

    def test_after_a_restart_a_session_is_not_found(self) -> None:
        daemon = MemoryDaemon()
        link = daemon.connect()
        session_id = link.open_session(eerl_pb2.OpenSessionRequest(), 1.0).session_id
        daemon.restart()
        with pytest.raises(LinkError) as caught:
            link.heartbeat(session_id, 1.0)
        assert caught.value.code is Code.NOT_FOUND

    def test_a_down_daemon_refuses_every_call_as_unavailable(self) -> None:
        daemon = MemoryDaemon()
        daemon.down = True
        with pytest.raises(LinkError) as caught:
            daemon.connect().open_session(eerl_pb2.OpenSessionRequest(), 1.0)
        assert caught.value.connection_lost

    def test_queued_failures_come_in_order_then_calls_succeed(self) -> None:
        daemon = MemoryDaemon()
        daemon.fail("IssueClaimTicket", Code.PERMISSION_DENIED, "no", times=2)
        link = daemon.connect("/run/other.sock")
        for _ in range(2):
            with pytest.raises(LinkError):
                link.issue_claim_ticket(1.0)
        assert link.issue_claim_ticket(1.0) == "ticket:/run/other.sock"

    def test_the_attach_stream_confirms_then_ends_with_the_link(self) -> None:
        daemon = MemoryDaemon()
        link = daemon.connect()
        session_id = link.open_session(eerl_pb2.OpenSessionRequest(), 1.0).session_id
        stream = iter(link.attach(session_id))
        assert next(stream).message == "attached"
        link.close()  # a dead client: the daemon ends its session
        assert daemon.sessions == []
        with pytest.raises(StopIteration):
            next(stream)

    def test_cancelling_the_stream_ends_the_session(self) -> None:
        daemon = MemoryDaemon()
        link = daemon.connect()
        session_id = link.open_session(eerl_pb2.OpenSessionRequest(), 1.0).session_id
        stream = link.attach(session_id)
        stream.cancel()
        assert daemon.sessions == []
        with pytest.raises(LinkError) as caught:
            list(stream)
        assert caught.value.code is Code.CANCELLED

    def test_a_daemon_without_attach_answers_unimplemented_when_read(self) -> None:
        daemon = MemoryDaemon(offer_attach=False)
        link = daemon.connect()
        session_id = link.open_session(eerl_pb2.OpenSessionRequest(), 1.0).session_id
        with pytest.raises(LinkError) as caught:
            list(link.attach(session_id))
        assert caught.value.code is Code.UNIMPLEMENTED


class TestOpening:
    def test_each_other_socket_is_asked_for_a_ticket_on_a_link_of_its_own(self) -> None:
        daemon = MemoryDaemon()
        daemon.fail("IssueClaimTicket", Code.UNAVAILABLE, "gone")
        tickets = claim_tickets(daemon.connect, ["/a.sock", "/b.sock"], 1.0)
        assert tickets.tickets == ("ticket:/b.sock",)
        assert tickets.missing == (("/a.sock", "UNAVAILABLE: gone"),)
        assert daemon.links_opened == 2

    def test_a_session_that_cannot_open_leaves_its_link_closed(self) -> None:
        daemon = MemoryDaemon()
        daemon.fail("OpenSession", Code.PERMISSION_DENIED, "not yours")
        links = []

        def connect(path: str | None) -> object:
            link = daemon.connect(path)
            links.append(link)
            return link

        with pytest.raises(LinkError):
            open_session(connect, eerl_pb2.OpenSessionRequest(), 1.0)  # type: ignore[arg-type]
        assert [link.closed for link in links] == [True]


class TestSidecarAnswers:
    def test_a_begin_the_daemon_answered_reads_as_the_daemons_reply(self) -> None:
        reply = _begin_reply(
            {
                "answered": True,
                "sm_clock_mhz": 1410,
                "state": "exploring",
                "resynced": True,
                "gpus": [{"index": 1, "uuid": "GPU-1", "sm_clock_mhz": 1400, "source": "admin_pin"}],
            }
        )
        assert reply is not None
        answer = PhaseAnswer.from_begin(reply)
        assert (answer.sm_clock_mhz, answer.state, answer.resynced) == (1410, ControllerState.EXPLORING, True)
        (clock,) = answer.clocks
        assert (clock.index, clock.uuid, clock.sm_clock_mhz, clock.source) == (1, "GPU-1", 1400, "admin_pin")

    def test_an_answer_the_daemon_had_not_given_is_none(self) -> None:
        assert _begin_reply({"answered": False, "sm_clock_mhz": None}) is None
        assert _end_reply({"metered": False}) is None

    def test_an_end_reads_back_in_joules(self) -> None:
        reply = _end_reply({"metered": True, "energy_j": 12.5, "duration_s": 0.5, "gpus": 2, "state": None})
        assert reply is not None
        answer = PhaseAnswer.from_end(reply)
        assert (answer.energy_j, answer.duration_s, answer.gpus, answer.state) == (12.5, 0.5, 2, None)


def _directive(iteration: int) -> Directive:
    return Directive(
        incarnation=1,
        epoch=1,
        iteration=iteration,
        kind=GEN,
        sm_clock_mhz=1410,
        purpose=DirectivePurpose.COMMITTED,
    )


def _node_link(daemon: MemoryDaemon) -> NodeLink:
    return NodeLink(
        ClientConfig.uds("/nonexistent/eerld.sock"),
        job_id="job",
        node_rank=0,
        incarnation=1,
        gpus=[0],
        timeout_s=1.0,
        reopen_initial_s=0.0,
        reopen_max_s=0.0,
        connect=daemon.connect,
    )


class TestNodeLinkReopens:
    def test_a_phase_begins_and_ends_under_the_first_epoch(self) -> None:
        daemon = MemoryDaemon()
        with _node_link(daemon) as link:
            begun = link.begin(_directive(0), GEN, 0)
            assert (begun.reached, begun.verdict, begun.session_epoch) == (True, DirectiveVerdict.ACCEPTED, 1)
            report = link.end(GEN, 0)
            assert (report.verdict, report.gpus) == (DirectiveVerdict.ACCEPTED, 1)
        assert daemon.sessions == []
        assert daemon.links_opened == 1  # one connection for the session

    @pytest.mark.parametrize("code", [Code.NOT_FOUND, Code.PERMISSION_DENIED, Code.UNAVAILABLE])
    def test_a_session_the_daemon_forgot_or_a_lost_connection_reopens_at_the_next_begin(
        self, code: Code
    ) -> None:
        daemon = MemoryDaemon()
        with _node_link(daemon) as link:
            assert link.begin(_directive(0), GEN, 0).reached
            daemon.fail("EndPhase", code)
            assert link.end(GEN, 0).verdict is DirectiveVerdict.MISSING
            assert not link.connected
            begun = link.begin(_directive(1), GEN, 1)
            assert (begun.reached, begun.session_epoch) == (True, 2)

    def test_a_daemon_restart_reopens_with_a_new_epoch(self) -> None:
        daemon = MemoryDaemon()
        with _node_link(daemon) as link:
            assert link.begin(_directive(0), GEN, 0).reached
            daemon.restart()  # its stream ends; the next call would answer NOT_FOUND
            assert wait_until(lambda: not link.connected)
            assert link.begin(_directive(1), GEN, 1).session_epoch == 2

    def test_one_refused_call_keeps_the_session(self) -> None:
        daemon = MemoryDaemon()
        with _node_link(daemon) as link:
            assert link.begin(_directive(0), GEN, 0).reached
            daemon.fail("EndPhase", Code.FAILED_PRECONDITION)
            link.end(GEN, 0)
            assert link.connected
            assert link.begin(_directive(1), GEN, 1).session_epoch == 1
