"""Claim tickets attacked by unprivileged users: a job-bound grant's ticket used for another job, and a
flood of tickets from one socket that pushes another job's outstanding ticket out of the book.

A ticket proves that its holder could connect to a grant's socket; it must carry everything that grant
admits and nothing more (its GPUs *and* its job), and one issuer's tickets must never displace another's.
Attackers and victims are real processes of different uids over the grants' real sockets (``run_as``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eerld.errors import PermissionDenied
from eerld.grants import MAX_TICKETS, TICKET_TTL_S, Grant, GrantKind, TicketBook
from eerld.testing import DaemonHandle, FakeGpuBackend, ManualClock, running_daemon
from tests.security.conftest import NOBODY_UID, call, run_as
from tests.security.test_claims import VICTIM_UID, grant, holders, open_call

ISSUE = call("PhaseService", "IssueClaimTicket")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def node(reachable_dir: Path, clock: ManualClock) -> Iterator[DaemonHandle]:
    """A multi-tenant daemon of 16 fake GPUs whose time (ticket expiry, open rate) moves when told."""
    fake = FakeGpuBackend(16, clock=clock)
    with running_daemon(reachable_dir, backend=fake, clock=clock, reaper=False, tenancy="multi") as handle:
        yield handle


def socket_of(reply: object) -> str:
    return f"unix:{reply.grant.socket_path}"  # type: ignore[attr-defined]


class TestAJobBoundGrantsTicket:
    def test_opens_no_session_of_another_job_and_stays_usable_by_its_own(self, node: DaemonHandle) -> None:
        """The grant admits job 'x' only; its ticket, shown on another socket of the same user under job
        'y', is refused (nothing claimed, the ticket not used up); under job 'x' it works."""
        bound = grant(node, "", [1], NOBODY_UID, job_id="x")
        other = grant(node, "other", [2], NOBODY_UID)
        ticket = run_as(socket_of(bound), [ISSUE])[0].response["ticket"]
        refused = run_as(socket_of(other), [open_call(2, 1, job_id="y", tickets=(ticket,))])[0]
        held_after_refusal = holders(node)
        own_job = run_as(socket_of(other), [open_call(2, 1, job_id="x", tickets=(ticket,))])[0]
        assert (refused.code, refused.details) == (
            "PERMISSION_DENIED",
            "claim_tickets: the ticket of job-x is for job 'x', not 'y'",
        )
        assert held_after_refusal == {}
        assert own_job.code == "OK"
        assert holders(node) == {1: "x", 2: "x"}

    def test_a_refused_ticket_among_good_ones_uses_up_none_of_them(self, node: DaemonHandle) -> None:
        bound = grant(node, "", [1], NOBODY_UID, job_id="x")
        free = grant(node, "free", [3], NOBODY_UID)
        other = grant(node, "other", [2], NOBODY_UID)
        tickets = [run_as(socket_of(g), [ISSUE])[0].response["ticket"] for g in (free, bound)]
        outcomes = run_as(
            socket_of(other),
            [
                open_call(2, 3, 1, job_id="y", tickets=tuple(tickets)),
                open_call(2, 3, job_id="y", tickets=(tickets[0],)),
            ],
        )
        assert [o.code for o in outcomes] == ["PERMISSION_DENIED", "OK"]
        assert holders(node) == {2: "y", 3: "y"}

    def test_an_open_refused_because_a_gpu_is_held_leaves_its_ticket_usable(self, node: DaemonHandle) -> None:
        """GPU 2 is held by a session of the other socket: an open that also claims it fails after the
        grant checks passed (FAILED_PRECONDITION), and its ticket still works once GPU 2 is free."""
        pair = grant(node, "pair", [1], NOBODY_UID)
        other = grant(node, "other", [2], NOBODY_UID)
        ticket = run_as(socket_of(pair), [ISSUE])[0].response["ticket"]
        holder = run_as(socket_of(other), [open_call(2)])[0]
        refused = run_as(socket_of(other), [open_call(2, 1, tickets=(ticket,))])[0]
        close = call("PhaseService", "CloseSession", {"sessionId": holder.response["sessionId"]})
        after = run_as(socket_of(other), [close, open_call(2, 1, tickets=(ticket,))])
        assert refused.code == "FAILED_PRECONDITION"
        assert [o.code for o in after] == ["OK", "OK"]
        assert sorted(holders(node)) == [1, 2]


class TestAFloodOfTickets:
    def test_one_socket_cannot_push_another_jobs_ticket_out_of_the_book(
        self, node: DaemonHandle, clock: ManualClock
    ) -> None:
        """The victim (two grants, GPUs 14 and 15) takes a ticket on one to open its session on the other;
        meanwhile the attacker's 12-GPU grant issues tickets as fast as its open-rate bound lets it (a burst
        of 32, then 12 a second), 272 within 20 s of the ticket's 30 s life. Before: the book (256, oldest
        out first) dropped the victim's ticket and its two-GPU claim failed. After: each socket holds at
        most its own quota, so the attacker's flood only ever evicts the attacker's tickets."""
        victim_a = grant(node, "victim-a", [14], VICTIM_UID)
        victim_b = grant(node, "victim-b", [15], VICTIM_UID)
        attacker = grant(node, "flood", list(range(12)), NOBODY_UID)
        ticket = run_as(socket_of(victim_b), [ISSUE], uid=VICTIM_UID, gid=VICTIM_UID)[0].response["ticket"]
        issued: list[str] = []
        for burst in (32, *[30] * 8):
            outcomes = run_as(socket_of(attacker), [ISSUE] * burst)
            assert {o.code for o in outcomes} == {"OK"}
            issued += [o.response["ticket"] for o in outcomes]
            clock.advance(2.5)
        assert len(issued) == 272 > MAX_TICKETS
        claim = run_as(
            socket_of(victim_a),
            [open_call(14, 15, job_id="v", tickets=(ticket,))],
            uid=VICTIM_UID,
            gid=VICTIM_UID,
        )[0]
        own_oldest = run_as(socket_of(attacker), [open_call(0, job_id="m", tickets=(issued[0],))])[0]
        assert (claim.code, claim.details) == ("OK", "")
        assert holders(node) == {14: "v", 15: "v"}
        assert own_oldest.code == "PERMISSION_DENIED"  # the attacker evicted its own tickets only


def book_grant(name: str, job_id: str = "") -> Grant:
    socket = Path(f"/run/eerld/grants/{name}.sock")
    return Grant(name, GrantKind.GRANT, socket, (f"GPU-{name}",), uid=1, job_id=job_id)


class TestTheTicketBook:
    """The book's bounds as pure logic (time is an argument)."""

    def test_a_socket_over_its_quota_loses_its_own_oldest_ticket_only(self) -> None:
        book = TicketBook(per_grant_limit=4, limit=64)
        victim = book.issue(book_grant("victim"), 0.0)
        flood = [book.issue(book_grant("flood"), 0.0) for _ in range(10)]
        assert [g.name for g in book.redeem([victim.ticket], "v", 1.0)] == ["victim"]
        with pytest.raises(PermissionDenied, match="unknown, used or expired"):
            book.redeem([flood[5].ticket], "m", 1.0)
        assert len(book.redeem([t.ticket for t in flood[6:]], "m", 1.0)) == 4

    def test_a_full_book_evicts_from_the_socket_that_holds_the_most(self) -> None:
        """Many sockets of one attacker together reach the global bound: the victim's lone ticket stays."""
        book = TicketBook(per_grant_limit=4, limit=10)
        victim = book.issue(book_grant("victim"), 0.0)
        for n in range(30):
            book.issue(book_grant(f"flood-{n % 5}"), 0.0)
        assert [g.name for g in book.redeem([victim.ticket], "v", 1.0)] == ["victim"]

    def test_tickets_expire_after_their_time(self) -> None:
        book = TicketBook()
        ticket = book.issue(book_grant("a"), 0.0)
        with pytest.raises(PermissionDenied, match="unknown, used or expired"):
            book.redeem([ticket.ticket], "j", TICKET_TTL_S)

    def test_a_ticket_of_a_job_bound_grant_admits_that_job_only_and_a_refusal_uses_nothing(self) -> None:
        book = TicketBook()
        bound, free = book.issue(book_grant("job-x", "x"), 0.0), book.issue(book_grant("free"), 0.0)
        with pytest.raises(PermissionDenied, match="the ticket of job-x is for job 'x', not 'y'"):
            book.redeem([free.ticket, bound.ticket], "y", 1.0)
        with pytest.raises(PermissionDenied, match="listed twice"):
            book.redeem([free.ticket, free.ticket], "x", 1.0)
        assert [g.name for g in book.redeem([free.ticket, bound.ticket], "x", 1.0)] == ["free", "job-x"]
