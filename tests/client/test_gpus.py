"""Naming GPUs by index or UUID, and reading them from the environment."""

from __future__ import annotations

import pytest
from eerl import ConfigError, visible_gpus
from eerl.gpus import parse_gpu, parse_gpu_list


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
