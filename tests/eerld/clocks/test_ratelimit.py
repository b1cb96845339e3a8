"""The per-GPU clock-change rate limit (:mod:`eerld.clocks.ratelimit`): a token bucket, time passed in."""

from __future__ import annotations

import math

import pytest

from eerld.clocks.ratelimit import DEFAULT_BURST, DEFAULT_MAX_CHANGES_PER_S, ClockChangeLimiter


def allowed(limiter: ClockChangeLimiter, key: object, now_s: float, tries: int) -> int:
    return sum(limiter.allow(key, now_s) for _ in range(tries))


class TestBucket:
    def test_a_burst_is_let_through_then_every_change_is_refused_and_counted(self) -> None:
        limiter = ClockChangeLimiter(rate_per_s=10.0, burst=5)
        assert [limiter.allow(0, 0.0) for _ in range(7)] == [True] * 5 + [False] * 2
        assert limiter.denied == 2

    def test_the_bucket_refills_at_the_rate_with_the_time_given(self) -> None:
        limiter = ClockChangeLimiter(rate_per_s=2.0, burst=4)
        assert allowed(limiter, 0, 100.0, 10) == 4
        assert not limiter.allow(0, 100.25)  # half a token
        assert limiter.allow(0, 100.5)  # one token in 0.5 s
        assert not limiter.allow(0, 100.5)
        assert allowed(limiter, 0, 101.5, 10) == 2

    def test_the_bucket_never_holds_more_than_the_burst_however_long_it_waited(self) -> None:
        limiter = ClockChangeLimiter(rate_per_s=10.0, burst=3)
        limiter.allow(0, 0.0)
        assert allowed(limiter, 0, 1e6, 10) == 3

    def test_time_going_backwards_adds_no_token(self) -> None:
        limiter = ClockChangeLimiter(rate_per_s=1.0, burst=2)
        assert allowed(limiter, 0, 50.0, 2) == 2
        assert not limiter.allow(0, 10.0)
        assert not limiter.allow(0, 50.5)  # the clock stepping back did not move the bucket's time back
        assert limiter.allow(0, 51.0)

    def test_each_key_has_its_own_bucket(self) -> None:
        limiter = ClockChangeLimiter(rate_per_s=1.0, burst=3)
        assert allowed(limiter, 0, 0.0, 10) == 3
        assert allowed(limiter, 1, 0.0, 10) == 3
        assert allowed(limiter, "socket-a", 0.0, 10) == 3
        assert limiter.denied == 21

    def test_the_defaults_are_ten_a_second_and_a_burst_of_twenty(self) -> None:
        limiter = ClockChangeLimiter()
        assert (limiter.rate_per_s, limiter.enabled) == (DEFAULT_MAX_CHANGES_PER_S, True)
        assert allowed(limiter, 0, 0.0, 100) == DEFAULT_BURST == 20
        assert allowed(limiter, 0, 1.0, 100) == 10


class TestAvailableAndTake:
    def test_available_takes_nothing(self) -> None:
        limiter = ClockChangeLimiter(rate_per_s=1.0, burst=1)
        assert all(limiter.available(0, 0.0) for _ in range(5))
        assert limiter.allow(0, 0.0)
        assert not limiter.available(0, 0.0)
        assert limiter.denied == 0

    def test_take_goes_into_debt_that_the_next_changes_wait_for(self) -> None:
        limiter = ClockChangeLimiter(rate_per_s=1.0, burst=2)
        for _ in range(3):
            limiter.take(0, 0.0)  # resets are never held back: 2 tokens, then 1 of debt
        assert not limiter.available(0, 0.0)
        assert not limiter.allow(0, 1.5)  # 1.5 s pays the debt and half a token
        assert limiter.allow(0, 2.0)

    def test_the_debt_is_at_most_one_burst(self) -> None:
        limiter = ClockChangeLimiter(rate_per_s=1.0, burst=2)
        for _ in range(100):
            limiter.take(0, 0.0)
        assert not limiter.available(0, 2.0)  # -2 + 2 < 1
        assert limiter.available(0, 3.0)  # not -98 + 3: the debt stopped at -burst


class TestDisabled:
    def test_a_rate_of_zero_allows_every_change_and_counts_no_refusal(self) -> None:
        limiter = ClockChangeLimiter(rate_per_s=0)
        assert not limiter.enabled
        for _ in range(100):
            limiter.take(0, 0.0)
        assert allowed(limiter, 0, 0.0, 1000) == 1000
        assert limiter.available(0, 0.0)
        assert limiter.denied == 0


class TestForget:
    def test_a_forgotten_key_starts_again_with_a_full_burst_and_the_others_keep_theirs(self) -> None:
        limiter = ClockChangeLimiter(rate_per_s=1.0, burst=2)
        assert allowed(limiter, 0, 0.0, 5) == 2
        assert allowed(limiter, 1, 0.0, 5) == 2
        limiter.forget(0)
        assert allowed(limiter, 0, 0.0, 5) == 2
        assert not limiter.allow(1, 0.0)

    def test_forgetting_a_key_never_seen_is_harmless(self) -> None:
        limiter = ClockChangeLimiter()
        limiter.forget("never")
        assert limiter.allow("never", 0.0)


class TestConstruction:
    @pytest.mark.parametrize("rate", [-1.0, math.nan, math.inf, -math.inf])
    def test_a_rate_that_is_not_a_non_negative_finite_number_is_refused(self, rate: float) -> None:
        with pytest.raises(ValueError, match="rate_per_s"):
            ClockChangeLimiter(rate_per_s=rate)

    @pytest.mark.parametrize("burst", [0, -1])
    def test_a_burst_below_one_is_refused(self, burst: int) -> None:
        with pytest.raises(ValueError, match="burst"):
            ClockChangeLimiter(burst=burst)
