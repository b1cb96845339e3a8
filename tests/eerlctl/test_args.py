"""Parsing of eerlctl's GPU lists and durations."""

from __future__ import annotations

import pytest

from eerlctl.args import GpuSelection, parse_duration_s, parse_gpus, parse_sm_mhz
from eerld.errors import ValidationError


class TestParseGpus:
    def test_all_selects_every_gpu(self) -> None:
        """'all' (any case) selects every GPU."""
        assert parse_gpus("ALL") == GpuSelection(all=True)

    def test_indices_and_uuids_mix_in_order(self) -> None:
        """Slurm's comma-separated form works; order is kept."""
        assert parse_gpus("2, 0,GPU-abc") == GpuSelection(indices=(2, 0), uuids=("GPU-abc",))

    @pytest.mark.parametrize(("text", "twice"), [("0,0", "GPU 0 "), ("2, 0,GPU-abc,2", "GPU 2 "),
                                                 ("GPU-abc,GPU-abc", "GPU GPU-abc ")])  # fmt: skip
    def test_a_gpu_listed_twice_is_refused_naming_it(self, text: str, twice: str) -> None:
        """``--gpus 0,0`` is a mistake, not a request for GPU 0: refused, naming the GPU."""
        with pytest.raises(ValidationError, match=f"--gpus: {twice}is listed twice"):
            parse_gpus(text)

    def test_the_one_gpu_reference_rule_applies(self) -> None:
        """--gpus follows eerl.gpus.parse_gpu_ref: a UUID's prefix in any case, an index up to 1023."""
        assert parse_gpus("gpu-abc,1023") == GpuSelection(indices=(1023,), uuids=("gpu-abc",))

    @pytest.mark.parametrize("text", ["", "0,,1", "-1", "gpu0", "0;1", "1024", "GPU-", "\N{SUPERSCRIPT TWO}"])
    def test_anything_else_is_rejected_naming_the_flag(self, text: str) -> None:
        """A part that is neither an index nor a UUID is a ValidationError on --gpus."""
        with pytest.raises(ValidationError, match="--gpus"):
            parse_gpus(text)


class TestParseDuration:
    @pytest.mark.parametrize(
        ("text", "seconds"),
        [("90", 90.0), ("90s", 90.0), ("30m", 1800.0), ("2h", 7200.0), ("1h30m", 5400.0), ("1d", 86400.0)],
    )
    def test_units(self, text: str, seconds: float) -> None:
        """Plain seconds and s/m/h/d units, also combined."""
        assert parse_duration_s(text) == seconds

    @pytest.mark.parametrize("text", ["0", "0m", "soon", "30x", "m30", "-5", "1h 30m"])
    def test_zero_negative_or_malformed_is_rejected(self, text: str) -> None:
        """A duration must be positive and well formed."""
        with pytest.raises(ValidationError, match="--for"):
            parse_duration_s(text)

    @pytest.mark.parametrize("text", ["-5m", "-5", " -1h30m"])
    def test_a_negative_duration_says_so(self, text: str) -> None:
        """``-5m`` is named as negative, not as malformed."""
        with pytest.raises(ValidationError, match=r"--for: .* a duration cannot be negative"):
            parse_duration_s(text)


class TestParseClock:
    def test_a_positive_integer_is_accepted(self) -> None:
        """1410 is a clock in MHz."""
        assert parse_sm_mhz("1410") == 1410

    @pytest.mark.parametrize("text", ["0", "-1", "1.4GHz", ""])
    def test_anything_else_is_rejected(self, text: str) -> None:
        """Zero, negatives and units are rejected."""
        with pytest.raises(ValidationError, match="--sm-mhz"):
            parse_sm_mhz(text)
