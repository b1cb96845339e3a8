"""Async slack: a pool's time budget from its peer pool's recent phases."""

from __future__ import annotations

import numpy as np
import pytest
from eerl.control.slack import PAIRING_HISTORY, PeerOverrun, PeerSlack


class TestPeerSlack:
    def test_the_peers_time_is_the_second_shortest_of_its_last_five_phases(self) -> None:
        """One slow peer phase moves nothing, one fast one moves it only to the next shortest; older phases
        drop out."""
        slack = PeerSlack(active=True)
        for duration_s in (100.0, 100.0, 10.0, 12.0, 11.0, 50.0, 13.0):
            slack.observe_peer(duration_s)
        assert slack.peer_duration_s() == 11.0
        slack.observe_peer(2.0)  # 12, 11, 50, 13, 2
        assert slack.peer_duration_s() == 11.0

    @pytest.mark.parametrize("threshold", [0.90, 0.95, 0.98])
    def test_a_pool_stretched_to_its_peer_keeps_the_iterations_throughput(self, threshold: float) -> None:
        """Two pools of about one length, the peer's phase varying from batch to batch (15-20 s, this pool
        16 s): the iterations, each as long as the slower pool, keep the threshold. Stretched to the peer's
        median, this pool gated every iteration whose peer phase was shorter (0.968 at 0.98)."""
        rng = np.random.default_rng(5)
        slack = PeerSlack(active=True)
        default_s = actual_s = 0.0
        for index, peer_s in enumerate(rng.uniform(15.0, 20.0, size=400)):
            if index >= 5:
                own_s = 16.0 * slack.time_cap(16.0, threshold, 0.0)
                default_s += max(16.0, peer_s)
                actual_s += max(own_s, peer_s)
            slack.observe_peer(float(peer_s))
        assert default_s / actual_s >= threshold - 0.001

    def test_a_peer_phase_that_took_no_time_is_ignored(self) -> None:
        """Before any real peer phase there is no peer time."""
        slack = PeerSlack(active=True)
        slack.observe_peer(0.0)
        assert slack.peer_duration_s() is None

    def test_a_waiting_pool_may_slow_down_to_its_peers_time_less_its_noise(self) -> None:
        """A 10 s pool whose peer takes 20 s may take up to 20 s less 2 %: the peer's time already holds
        the peer's own slowdown, so the threshold does not stretch it again."""
        slack = PeerSlack(active=True)
        slack.observe_peer(20.0)
        assert slack.time_cap(10.0, 0.95, 0.02) == pytest.approx(20.0 * 0.98 / 10.0)
        assert slack.reference_s(0.95, 0.02) == pytest.approx(20.0 * 0.98 * 0.95)

    def test_without_a_slower_peer_the_threshold_alone_is_the_budget(self) -> None:
        """A pool that gates the iteration (or has no peer yet) spends the threshold only."""
        slack = PeerSlack(active=True)
        assert slack.time_cap(10.0, 0.95, 0.02) == pytest.approx(1 / 0.95)
        assert slack.reference_s(0.95, 0.02) is None
        slack.observe_peer(5.0)
        assert slack.time_cap(10.0, 0.95, 0.02) == pytest.approx(1 / 0.95)

    @pytest.mark.parametrize("threshold", [0.90, 0.95, 0.98])
    def test_two_pools_of_one_length_do_not_stretch_each_other_round_after_round(
        self, threshold: float
    ) -> None:
        """Two 10 s pools, each taking all the time its budget allows (a curve that keeps saving): the
        iteration settles at the default over the threshold. Budgets of the peer's time over the threshold
        grew by 1 / threshold a round (10 s at 0.95 became 36 s in 25 rounds)."""
        first, second = PeerSlack(active=True), PeerSlack(active=True)
        default_s = 10.0
        for _ in range(25):
            first_s = default_s * first.time_cap(default_s, threshold, 0.02)
            second_s = default_s * second.time_cap(default_s, threshold, 0.02)
            first.observe_peer(second_s)
            second.observe_peer(first_s)
        assert max(first_s, second_s) == pytest.approx(default_s / threshold)


class TestPeerOverrun:
    def test_a_peer_that_ran_longer_is_the_iterations_time_in_either_order(self) -> None:
        """The iteration lasted as long as the slower pool: the peer's excess over this pool's phase, paired
        by iteration whichever reported first; a peer that ran shorter adds nothing."""
        overrun = PeerOverrun()
        assert overrun.own(7, 10.0) == 0.0
        assert overrun.peer(7, 10.6) == pytest.approx(0.6)
        assert overrun.peer(8, 10.9) == 0.0
        assert overrun.own(8, 10.0) == pytest.approx(0.9)
        assert overrun.own(9, 10.0) == 0.0
        assert overrun.peer(9, 9.0) == 0.0

    def test_each_iteration_pairs_once_and_unpaired_phases_are_forgotten(self) -> None:
        """A pair counts once; a phase whose partner never comes is dropped after a few iterations."""
        overrun = PeerOverrun()
        overrun.own(1, 10.0)
        assert overrun.peer(1, 12.0) == pytest.approx(2.0)
        assert overrun.peer(1, 12.0) == 0.0  # nothing of this pool's left to pair with
        overrun.own(2, 10.0)
        for iteration in range(3, 3 + PAIRING_HISTORY):
            overrun.own(iteration, 10.0)
        assert overrun.peer(2, 15.0) == 0.0
        assert overrun.peer(3 + PAIRING_HISTORY - 1, 15.0) == pytest.approx(5.0)
