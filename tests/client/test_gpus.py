"""Naming GPUs by index or UUID, and reading them from the environment."""

from __future__ import annotations

import pytest
from eerl import ConfigError, visible_gpus
from eerl.errors import ValidationError
from eerl.gpus import MAX_GPU_INDEX, MAX_GPU_UUID_CHARS, parse_gpu, parse_gpu_list, parse_gpu_ref


class TestParseGpuRef:
    """The one GPU reference rule, which the client, eerlctl and eerld share."""

    @pytest.mark.parametrize(
        ("value", "expected"),
        [
            (0, 0),
            (MAX_GPU_INDEX, MAX_GPU_INDEX),
            ("3", 3),
            (" 2 ", 2),
            ("007", 7),
            ("GPU-5f1c-aa", "GPU-5f1c-aa"),
            ("MIG-1c2d", "MIG-1c2d"),
            ("gpu-5f1c", "gpu-5f1c"),
            (" GPU-5f1c ", "GPU-5f1c"),
        ],
    )
    def test_an_index_becomes_an_int_and_a_uuid_passes_through_as_written(
        self, value: int | str, expected: int | str
    ) -> None:
        """Digits name an index; GPU-/MIG- (any case) name a UUID, kept as written but for outer spaces."""
        assert parse_gpu_ref(value) == expected

    @pytest.mark.parametrize(
        ("value", "problem"),
        [
            (True, "not a GPU index or UUID"),
            (1.0, "not a GPU index or UUID"),
            (None, "not a GPU index or UUID"),
            (-1, "negative"),
            (MAX_GPU_INDEX + 1, "out of range"),
            (str(MAX_GPU_INDEX + 1), "out of range"),
            ("-1", "neither a GPU index nor a UUID"),
            ("", "neither a GPU index nor a UUID"),
            ("cuda:0", "neither a GPU index nor a UUID"),
            ("0x1", "neither a GPU index nor a UUID"),
            ("\N{SUPERSCRIPT TWO}", "neither a GPU index nor a UUID"),
            ("GPU-", "neither a GPU index nor a UUID"),
            ("GPU-a b", "spaces or control characters"),
            ("GPU-a\x00", "spaces or control characters"),
            ("GPU-" + "a" * MAX_GPU_UUID_CHARS, "too long"),
        ],
    )
    def test_anything_else_is_refused_naming_the_field(self, value: object, problem: str) -> None:
        """A refusal is a ValidationError on the caller's field, saying why."""
        with pytest.raises(ValidationError, match=problem) as caught:
            parse_gpu_ref(value, field="gpus[3]")
        assert caught.value.field == "gpus[3]"


class TestParseGpu:
    @pytest.mark.parametrize(
        ("value", "expected"),
        [(0, 0), ("3", 3), (" 2 ", 2), ("GPU-5f1c-aa", "GPU-5f1c-aa"), ("MIG-1c2d", "MIG-1c2d")],
    )
    def test_indices_become_ints_and_uuids_pass_through(self, value: int | str, expected: int | str) -> None:
        assert parse_gpu(value) == expected

    @pytest.mark.parametrize("value", [-1, "cuda:0", "GPU-", True, "0x1"])
    def test_anything_else_is_an_error_naming_the_source(self, value: int | str) -> None:
        with pytest.raises(ConfigError, match="EERL_GPUS"):
            parse_gpu(value, source="EERL_GPUS")

    def test_a_list_keeps_order_and_drops_repeats(self) -> None:
        assert parse_gpu_list("2,0,2,GPU-a1,GPU-a1", source="x") == (2, 0, "GPU-a1")


class TestVisibleGpus:
    def test_cuda_visible_devices_indices(self) -> None:
        assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}) == (0, 1)

    def test_cuda_visible_devices_uuids_as_in_a_container(self) -> None:
        env = {"CUDA_VISIBLE_DEVICES": "GPU-1111-aaaa,GPU-2222-bbbb"}
        assert visible_gpus(env) == ("GPU-1111-aaaa", "GPU-2222-bbbb")

    @pytest.mark.parametrize("value", ["", "-1", "NoDevFiles"])
    def test_no_devices_means_none(self, value: str) -> None:
        assert visible_gpus({"CUDA_VISIBLE_DEVICES": value}) == ()

    def test_nvidia_visible_devices_uuids_count_when_cuda_is_unset(self) -> None:
        assert visible_gpus({"NVIDIA_VISIBLE_DEVICES": "GPU-1111,GPU-2222"}) == ("GPU-1111", "GPU-2222")

    def test_nvidia_visible_devices_all_names_nothing(self) -> None:
        assert visible_gpus({"NVIDIA_VISIBLE_DEVICES": "all"}) == ()

    def test_cuda_visible_devices_wins_over_nvidia_visible_devices(self) -> None:
        assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1", "NVIDIA_VISIBLE_DEVICES": "GPU-2222"}) == (1,)
