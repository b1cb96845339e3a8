"""What the client sends: every workload and iteration the daemon accepts and protobuf can encode."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from eerl import Workload
from eerl.phases import WORKLOAD_FIELDS
from eerl.v1 import eerl_pb2
from eerl.wire.limits import (
    MAX_ITERATION,
    MAX_KV_TOKENS,
    MAX_SEQUENCES,
    MAX_TOKENS,
    Problem,
    check_iteration,
    check_workload,
    to_count,
)
from hypothesis import example, given
from hypothesis import strategies as st

FIELDS = WORKLOAD_FIELDS
LIMITS = {"sequences": MAX_SEQUENCES, "max_worker_kv_tokens": MAX_KV_TOKENS}

anything = st.one_of(
    st.integers(min_value=-(10**15), max_value=10**15),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
    st.binary(max_size=3),
    st.fractions(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(np.int64),
    st.floats(width=32).map(np.float32),
    st.lists(st.integers(), max_size=2),
)
workloads = st.builds(Workload, *(anything for _ in FIELDS))
plain_workloads = st.builds(Workload, *(st.integers(min_value=0, max_value=10**6) for _ in FIELDS))


class TestToCount:
    @pytest.mark.parametrize(
        ("value", "count"),
        [
            (7, 7),
            (-3, -3),
            (np.int64(12), 12),
            (np.uint8(255), 255),
            (4.0, 4),
            (np.float64(9.0), 9),
            (Fraction(6, 2), 3),
        ],
    )
    def test_a_whole_number_of_any_numeric_type_is_its_int(self, value: object, count: int) -> None:
        assert to_count(value) == count
        assert type(to_count(value)) is int

    @pytest.mark.parametrize(
        "value", [2.5, math.nan, math.inf, -math.inf, True, False, "12", b"1", None, [1], np.array([1, 2])]
    )
    def test_anything_else_is_none(self, value: object) -> None:
        assert to_count(value) is None

    def test_a_pytorch_integer_scalar_is_its_int(self) -> None:
        torch = pytest.importorskip("torch")
        assert to_count(torch.tensor([1, 1, 0]).sum()) == 2
        assert to_count(torch.tensor(0.5)) is None

    @given(anything)
    def test_it_never_raises_and_answers_an_int_or_none(self, value: object) -> None:
        count = to_count(value)
        assert count is None or type(count) is int


class TestCheckWorkload:
    @given(workloads)
    @example(Workload(tokens=-5))
    @example(Workload(tokens=10, valid_tokens=20))
    @example(Workload(tokens=10**13, valid_tokens=3))
    @example(Workload(sequences=MAX_SEQUENCES + 1))
    def test_whatever_was_reported_the_result_is_encodable_and_within_the_daemons_limits(
        self, workload: Workload
    ) -> None:
        checked = check_workload(workload).workload
        eerl_pb2.Workload(**{name: getattr(checked, name) for name in FIELDS})  # raises if not encodable
        for name in FIELDS:
            value = getattr(checked, name)
            assert type(value) is int
            assert 0 <= value <= LIMITS.get(name, MAX_TOKENS)
        assert checked.valid_tokens <= checked.tokens

    @given(plain_workloads.filter(lambda w: w.valid_tokens <= w.tokens))
    def test_a_valid_workload_passes_unchanged_with_nothing_to_report(self, workload: Workload) -> None:
        checked = check_workload(workload)
        assert (checked.workload, checked.clamped, checked.dropped, checked.findings) == (workload, 0, 0, ())

    @given(workloads)
    def test_every_value_changed_is_counted_once_as_clamped_or_dropped(self, workload: Workload) -> None:
        checked = check_workload(workload)
        assert checked.clamped + checked.dropped == len(checked.findings)

    def test_a_negative_count_is_clamped_to_zero(self) -> None:
        checked = check_workload(Workload(tokens=-5, sequences=2))
        assert (checked.workload, checked.clamped, checked.dropped) == (Workload(sequences=2), 1, 0)
        assert [(f.problem, f.what) for f in checked.findings] == [(Problem.NEGATIVE, "tokens=-5")]

    def test_a_count_above_the_daemons_limit_is_dropped(self) -> None:
        checked = check_workload(
            Workload(tokens=MAX_TOKENS + 1, sequences=MAX_SEQUENCES + 1, prompt_tokens=3)
        )
        assert (checked.workload, checked.clamped, checked.dropped) == (Workload(prompt_tokens=3), 0, 2)
        assert {f.problem for f in checked.findings} == {Problem.ABOVE_LIMIT}

    def test_the_limits_themselves_are_accepted(self) -> None:
        at_limit = Workload(MAX_TOKENS, MAX_TOKENS, MAX_SEQUENCES, MAX_TOKENS, MAX_TOKENS)
        assert check_workload(at_limit).workload == at_limit

    def test_more_valid_tokens_than_tokens_are_clamped_to_tokens(self) -> None:
        checked = check_workload(Workload(tokens=10, valid_tokens=20))
        assert (checked.workload, checked.clamped) == (Workload(tokens=10, valid_tokens=10), 1)
        assert checked.findings[0].problem is Problem.VALID_ABOVE_TOKENS

    def test_valid_tokens_follow_tokens_that_were_dropped(self) -> None:
        checked = check_workload(Workload(tokens=10**13, valid_tokens=3))
        assert (checked.workload, checked.clamped, checked.dropped) == (Workload(), 1, 1)

    def test_whole_numbers_of_other_types_are_converted_silently_and_the_rest_dropped(self) -> None:
        checked = check_workload(Workload(np.int64(30), 12.0, "4", math.nan, True))  # type: ignore[arg-type]
        assert checked.workload == Workload(tokens=30, valid_tokens=12)
        assert (checked.clamped, checked.dropped) == (0, 3)
        assert {f.problem for f in checked.findings} == {Problem.NOT_A_NUMBER}
        assert checked.findings[0].what == "sequences of type str"


class TestCheckIteration:
    @given(st.integers(min_value=0, max_value=MAX_ITERATION))
    def test_an_iteration_in_range_is_kept(self, iteration: int) -> None:
        assert check_iteration(iteration) == iteration

    @given(st.one_of(st.integers(max_value=-1), st.integers(min_value=MAX_ITERATION + 1)))
    def test_an_iteration_out_of_range_drops_the_event(self, iteration: int) -> None:
        assert check_iteration(iteration) is None

    @pytest.mark.parametrize(("value", "expected"), [(np.int32(4), 4), (3.0, 3), (2.5, None), ("1", None)])
    def test_an_iteration_of_another_type_is_converted_or_drops_the_event(
        self, value: object, expected: int | None
    ) -> None:
        assert check_iteration(value) == expected
