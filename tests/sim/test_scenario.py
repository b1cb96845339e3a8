"""Scenario files: the built-in ones load, and a bad one is rejected with file, key and problem."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from eerl.phases import ExecutionMode, PhaseKind
from eerl_sim.scenario import builtin_scenario_names, load_scenario, scenario_fields

from eerld.errors import ConfigError

WriteScenario = Callable[..., Path]

EXPECTED_BUILTINS = {
    "sync-h100",
    "sync-gb200",
    "async-h100",
    "drift-h100",
    "step-h100",
    "noisy-h100",
    "verl-h100",
    "decode-heavy-h100",
    "sync-a100",
}


class TestBuiltins:
    def test_every_expected_scenario_is_shipped(self) -> None:
        assert set(builtin_scenario_names()) >= EXPECTED_BUILTINS

    @pytest.mark.parametrize("name", sorted(EXPECTED_BUILTINS))
    def test_each_builtin_loads_under_its_own_name(self, name: str) -> None:
        assert load_scenario(name).name == name

    @pytest.mark.parametrize("name", sorted(EXPECTED_BUILTINS))
    def test_each_builtin_spells_out_every_key_of_the_spec(self, name: str) -> None:
        text = (Path(load_scenario(name).source)).read_text()
        for section, keys in scenario_fields().items():
            for key in keys:
                if section == "workload.async" or key == "steps":
                    continue  # optional sections appear at least as comments
                assert f"\n{key} =" in text or f"\n# {key} =" in text, f"{name}: {section}.{key}"

    def test_a_path_loads_as_well_as_a_name(self, sync_h100) -> None:  # type: ignore[no-untyped-def]
        assert load_scenario(Path(sync_h100.source)) == sync_h100

    def test_an_unknown_name_lists_the_builtins(self) -> None:
        with pytest.raises(ConfigError, match="sync-h100"):
            load_scenario("no-such-scenario")

    def test_the_reference_scenario_has_the_spec_values(self, sync_h100) -> None:  # type: ignore[no-untyped-def]
        assert sync_h100.gpu.name == "h100-sxm"
        assert sync_h100.workload.mode is ExecutionMode.SYNC
        assert sync_h100.workload.generation.responses == 2048
        assert sync_h100.workload.generation.response_max_tokens == 8192
        assert sync_h100.workload.training.micro_batches == 16

    def test_async_pools_are_read(self, async_h100) -> None:  # type: ignore[no-untyped-def]
        assert async_h100.workload.async_ is not None
        assert async_h100.workload.pool_gpus(PhaseKind.GENERATION) == 4
        assert async_h100.workload.pool_gpus(PhaseKind.TRAINING) == 4
        assert async_h100.workload.staleness == 1

    def test_gpu_fields_may_be_overridden(self, write_scenario: WriteScenario) -> None:
        path = write_scenario({"# power_limit_w = 650           # e.g.": "power_limit_w = 650"})
        assert load_scenario(path).gpu.power_limit_w == 650


class TestRejection:
    @pytest.mark.parametrize(
        ("replacements", "append", "key", "problem"),
        [
            (
                {"response_sigma = 0.8": "response_sigma = -0.1"},
                "",
                "workload.generation.response_sigma",
                "must be in",
            ),
            ({"prompts = 256": "prompts = 256.5"}, "", "workload.generation.prompts", "integer"),
            ({"prompts = 256": 'prompts = "many"'}, "", "workload.generation.prompts", "integer"),
            (
                {"micro_batches = 16": "micro_batches = 0"},
                "",
                "workload.training.micro_batches",
                "must be in",
            ),
            (
                {"valid_fraction_mean = 0.7": "valid_fraction_mean = 1.5"},
                "",
                "workload.training.valid_fraction_mean",
                "[0, 1]",
            ),
            ({"seed = 1": "seed = 1\nseeds = 2"}, "", "workload.seeds", "unknown key"),
            (
                {"prompt_tokens = 512": "prompt_tokens = 512\nprompt_token = 5"},
                "",
                "workload.generation.prompt_token",
                "unknown key",
            ),
            ({"optimizer_s = 1.5": "# gone"}, "", "workload.training.optimizer_s", "missing"),
            ({'mode = "sync"': 'mode = "fast"'}, "", "workload.mode", "sync"),
            ({'profile = "h100-sxm"': 'profile = "a100"'}, "", "gpu.profile", "h100-sxm"),
            (
                {"# power_limit_w = 650           # e.g.": "power_limit_w = true"},
                "",
                "gpu.power_limit_w",
                "number",
            ),
            ({"# power_limit_w = 650           # e.g.": "watts = 5"}, "", "gpu.watts", "unknown key"),
            (
                {"response_growth_per_iteration = 0.0": "response_growth_per_iteration = 5.0"},
                "",
                "workload.drift.response_growth_per_iteration",
                "must be in",
            ),
            (
                {},
                "\n[[workload.drift.steps]]\nat_iteration = 3\nresponse_median = 9\n",
                "workload.drift.steps[0].response_median",
                "unknown key",
            ),
            (
                {},
                "\n[[workload.drift.steps]]\nat_iteration = -3\nprompts = 9\n",
                "workload.drift.steps[0].at_iteration",
                "must be in",
            ),
            (
                {},
                "\n[[workload.drift.steps]]\nprompts = 9\n",
                "workload.drift.steps[0].at_iteration",
                "missing",
            ),
            (
                {},
                "\n[workload.async]\ngeneration_gpus = [0]\ntraining_gpus = [1]\nstaleness = 1\n",
                "workload.async",
                'mode = "async"',
            ),
        ],
    )
    def test_the_message_names_the_file_the_key_and_the_problem(
        self, write_scenario: WriteScenario, replacements: dict[str, str], append: str, key: str, problem: str
    ) -> None:
        path = write_scenario(replacements, append)
        with pytest.raises(ConfigError) as caught:
            load_scenario(path)
        message = str(caught.value)
        assert str(path) in message
        assert f"'{key}'" in message
        assert problem in message

    @pytest.mark.parametrize(
        ("pools", "problem"),
        [
            ("generation_gpus = [0, 1]\ntraining_gpus = [1, 2]", "overlaps"),
            ("generation_gpus = [0, 9]\ntraining_gpus = [1, 2]", "indices must be in"),
            ("generation_gpus = []\ntraining_gpus = [1, 2]", "non-empty"),
        ],
    )
    def test_async_pools_must_be_disjoint_lists_of_existing_gpus(
        self, write_scenario: WriteScenario, pools: str, problem: str
    ) -> None:
        path = write_scenario(
            {'mode = "sync"': 'mode = "async"'}, f"\n[workload.async]\n{pools}\nstaleness = 1\n"
        )
        with pytest.raises(ConfigError, match=problem):
            load_scenario(path)

    def test_async_mode_without_pools_is_rejected(self, write_scenario: WriteScenario) -> None:
        path = write_scenario({'mode = "sync"': 'mode = "async"'})
        with pytest.raises(ConfigError, match=r"'workload\.async' is missing"):
            load_scenario(path)

    def test_invalid_toml_names_the_file(self, tmp_path: Path) -> None:
        path = tmp_path / "broken.toml"
        path.write_text("name = \n")
        with pytest.raises(ConfigError, match=r"broken\.toml: invalid TOML"):
            load_scenario(path)

    def test_a_missing_file_names_the_file(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match=r"absent\.toml"):
            load_scenario(tmp_path / "absent.toml")


class TestDrift:
    def test_the_median_grows_geometrically_per_iteration(self) -> None:
        drift = load_scenario("drift-h100").workload
        growth = drift.drift.response_growth_per_iteration
        start = drift.at_iteration(0).generation.response_median_tokens
        assert drift.at_iteration(100).generation.response_median_tokens == pytest.approx(
            start * (1 + growth) ** 100
        )
        assert 2.0 <= drift.at_iteration(299).generation.response_median_tokens / start <= 3.0

    def test_a_step_changes_the_workload_from_its_iteration_on(self) -> None:
        step = load_scenario("step-h100").workload
        assert step.at_iteration(149).generation.response_median_tokens == 1200
        assert step.at_iteration(150).generation.response_median_tokens == 4000
        assert step.at_iteration(299).generation.response_median_tokens == 4000

    def test_a_step_may_change_a_training_field(self, write_scenario: WriteScenario) -> None:
        path = write_scenario(
            append="\n[[workload.drift.steps]]\nat_iteration = 10\nvalid_fraction_mean = 0.4\n"
        )
        workload = load_scenario(path).workload
        assert workload.at_iteration(9).training.valid_fraction_mean == 0.7
        assert workload.at_iteration(10).training.valid_fraction_mean == 0.4

    def test_growth_restarts_from_a_step_that_sets_the_median(self, write_scenario: WriteScenario) -> None:
        path = write_scenario(
            {"response_growth_per_iteration = 0.0": "response_growth_per_iteration = 0.01"},
            "\n[[workload.drift.steps]]\nat_iteration = 10\nresponse_median_tokens = 500\n",
        )
        workload = load_scenario(path).workload
        assert workload.at_iteration(10).generation.response_median_tokens == pytest.approx(500)
        assert workload.at_iteration(12).generation.response_median_tokens == pytest.approx(500 * 1.01**2)
