"""The value rules of eerld's options (eerld/config/values.py), as properties over their whole input."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from eerl.phases import PhaseKind
from hypothesis import given
from hypothesis import strategies as st

from eerld.config.values import Choice, Float, Int, Or, fixed_clocks, host_port, path, true_or_false
from eerld.errors import ConfigError

LABEL = "--some-option"


class TestInt:
    @given(st.integers(-5, 105), st.booleans())
    def test_an_integer_is_taken_inside_its_bounds_from_a_flag_or_a_file_and_refused_outside(
        self, number: int, as_text: bool
    ) -> None:
        rule = Int(0, 100)
        raw: object = str(number) if as_text else number
        if 0 <= number <= 100:
            assert rule(raw, LABEL) == number
        else:
            with pytest.raises(ConfigError, match=f"^{LABEL}: must be between 0 and 100, got {number}$"):
                rule(raw, LABEL)

    @pytest.mark.parametrize("raw", [True, "1.5", "ten", 2.5])
    def test_a_boolean_or_a_non_integer_is_refused(self, raw: object) -> None:
        with pytest.raises(ConfigError, match=f"^{LABEL}: expected an integer"):
            Int(0, 100)(raw, LABEL)


class TestFloat:
    @given(st.floats(allow_nan=True, allow_infinity=True))
    def test_only_a_finite_number_inside_the_bounds_is_taken(self, number: float) -> None:
        rule = Float(0.5, 10.0)
        if math.isfinite(number) and 0.5 <= number <= 10.0:
            assert rule(str(number), LABEL) == number
        else:
            with pytest.raises(ConfigError, match=f"^{LABEL}: must be a finite number between 0.5 and 10"):
                rule(str(number), LABEL)


class TestChoice:
    @given(st.text(min_size=1).filter(str.strip))
    def test_a_word_is_taken_only_when_it_is_one_of_the_choices(self, word: str) -> None:
        rule = Choice(("lock", "application"))
        if word.strip() in rule.choices:
            assert rule(word, LABEL) == word.strip()
        else:
            with pytest.raises(ConfigError, match=f"^{LABEL}: expected one of lock, application, got "):
                rule(word, LABEL)

    def test_its_metavar_lists_the_choices(self) -> None:
        assert Choice(("multi", "single")).metavar == "multi|single"


class TestOr:
    def test_the_word_stands_for_its_value_and_anything_else_goes_to_the_rule(self) -> None:
        rule = Or("off", None, path)
        assert (rule("off", LABEL), rule(" off ", LABEL)) == (None, None)
        assert rule("/run/x", LABEL) == Path("/run/x")
        assert rule.metavar == "PATH|off"


class TestOthers:
    @pytest.mark.parametrize(
        ("raw", "ok"),
        [("127.0.0.1:9478", True), ("[::1]:80", True), ("node-1.example:0", True), ("nonsense", False),
         (":80", False), ("host:99999", False), ("bad host!:80", False)],
    )  # fmt: skip
    def test_host_port(self, raw: str, ok: bool) -> None:
        if ok:
            assert host_port(raw, LABEL) == raw
        else:
            with pytest.raises(ConfigError, match=f"^{LABEL}"):
                host_port(raw, LABEL)

    def test_fixed_clocks_come_from_a_flag_or_a_toml_table(self) -> None:
        expected = {PhaseKind.GENERATION: 1200, PhaseKind.TRAINING: 1500}
        assert fixed_clocks("generation=1200, training=1500", LABEL) == expected
        assert fixed_clocks({"generation": 1200, "training": 1500}, LABEL) == expected

    @pytest.mark.parametrize("raw", ["true", 1, None])
    def test_a_flag_is_true_or_false_only(self, raw: object) -> None:
        with pytest.raises(ConfigError, match=f"^{LABEL}: expected true or false"):
            true_or_false(raw, LABEL)
