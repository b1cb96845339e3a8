"""Scenario files: a GPU profile plus an RL workload, loaded from TOML and checked key by key.

A scenario is the whole input of a simulated run (see docs/simulator.md for the format). The loader is
strict on purpose: a typo in a benchmark scenario would otherwise silently benchmark the defaults, so any
unknown key, wrong type or out-of-range value raises one :class:`ConfigError` naming the file, the dotted
key and the problem.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from eerl.phases import ExecutionMode, PhaseKind

from eerl_sim.profiles import BUILTIN_PROFILES, GpuProfile, builtin_profile
from eerld.errors import ConfigError

SCENARIO_DIR = Path(str(resources.files("eerl_sim").joinpath("scenarios")))
"""Where a bare scenario name (``sync-h100``) is looked up: ``sim/eerl_sim/scenarios/``, package data that the
wheel installs with the code (eerld is installed as files, never zipped, so the resource is a directory)."""


@dataclass(frozen=True, slots=True)
class _Rule:
    """How one scalar key is checked: its type and its allowed range."""

    kind: type  # int or float
    minimum: float
    maximum: float = math.inf
    exclusive_minimum: bool = False

    def check(self, source: str, key: str, value: Any) -> int | float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            wanted = "an integer" if self.kind is int else "a number"
            raise ConfigError(f"{source}: '{key}' must be {wanted}, not {value!r}")
        if self.kind is int and not isinstance(value, int):
            raise ConfigError(f"{source}: '{key}' must be an integer, not {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{source}: '{key}' must be finite, got {value!r}")
        too_low = value <= self.minimum if self.exclusive_minimum else value < self.minimum
        if too_low or value > self.maximum:
            low = "(" if self.exclusive_minimum else "["
            high = "inf)" if math.isinf(self.maximum) else f"{self.maximum:g}]"
            raise ConfigError(f"{source}: '{key}' must be in {low}{self.minimum:g}, {high}, got {value!r}")
        return int(value) if self.kind is int else float(value)


_POSITIVE_INT = _Rule(int, 1)
_NON_NEGATIVE = _Rule(float, 0.0)
_POSITIVE = _Rule(float, 0.0, exclusive_minimum=True)
_FRACTION = _Rule(float, 0.0, 1.0)

_GENERATION_RULES: dict[str, _Rule] = {
    "prompts": _POSITIVE_INT,
    "samples_per_prompt": _POSITIVE_INT,
    "prompt_tokens": _POSITIVE_INT,
    "response_median_tokens": _Rule(float, 1.0),
    "response_sigma": _Rule(float, 0.0, 3.0),
    "response_max_tokens": _Rule(int, 1, 1_048_576),
    "decode_compute_mhz_s_per_seq": _NON_NEGATIVE,
    "decode_weight_s": _NON_NEGATIVE,
    "decode_kv_s_per_token": _NON_NEGATIVE,
    "prefill_compute_mhz_s_per_token": _NON_NEGATIVE,
}
_TRAINING_RULES: dict[str, _Rule] = {
    "train_compute_mhz_s_per_token": _NON_NEGATIVE,
    "train_memory_s_per_token": _NON_NEGATIVE,
    "micro_batches": _POSITIVE_INT,
    "optimizer_s": _NON_NEGATIVE,
    "weight_sync_s": _NON_NEGATIVE,
    "valid_fraction_mean": _FRACTION,
    "valid_fraction_sd": _Rule(float, 0.0, 1.0),
}
_WORKLOAD_RULES: dict[str, _Rule] = {
    "iterations": _Rule(int, 1, 1_000_000),
    "gpus": _Rule(int, 1, 1024),
    "seed": _Rule(int, 0, 2**63 - 1),
}
_NODES_RULES: dict[str, _Rule] = {
    "count": _Rule(int, 1, 4096),
    "gpus": _Rule(int, 1, 1024),
    "speed_sigma": _Rule(float, 0.0, 1.0),
    "straggle_probability": _FRACTION,
    "noise_phase_duration": _Rule(float, 0.0, 1.0),
    "noise_phase_power": _Rule(float, 0.0, 1.0),
}
_BETWEEN_RULES: dict[str, _Rule] = {
    "forward_passes": _Rule(int, 0, 64),
    "fixed_s": _Rule(float, 0.0, 86_400.0),
}
_STRAGGLE_FACTOR_RULE = _Rule(float, 1.0, 100.0)
_GROWTH_RULE = _Rule(float, -0.1, 0.1)
_AT_ITERATION_RULE = _Rule(int, 0)
_STALENESS_RULE = _Rule(int, 1, 1000)


@dataclass(frozen=True, slots=True)
class GenerationSpec:
    """``[workload.generation]``: rollout size, response-length law and decode cost coefficients."""

    prompts: int
    samples_per_prompt: int
    prompt_tokens: int
    response_median_tokens: float
    response_sigma: float
    response_max_tokens: int
    decode_compute_mhz_s_per_seq: float
    decode_weight_s: float
    decode_kv_s_per_token: float
    prefill_compute_mhz_s_per_token: float

    @property
    def responses(self) -> int:
        """Responses per iteration: prompts × samples per prompt."""
        return self.prompts * self.samples_per_prompt


@dataclass(frozen=True, slots=True)
class TrainingSpec:
    """``[workload.training]``: training cost coefficients and the valid-response fraction."""

    train_compute_mhz_s_per_token: float
    train_memory_s_per_token: float
    micro_batches: int
    optimizer_s: float
    weight_sync_s: float
    valid_fraction_mean: float
    valid_fraction_sd: float


@dataclass(frozen=True, slots=True)
class BetweenSpec:
    """``[workload.between]``: the work a trainer does between generation and training (sim-model "Work
    between the phases"): ``forward_passes`` passes over the training tokens (reference and old
    log-probabilities, values), each a third of a training step's cost per token, then ``fixed_s`` of
    memory-bound work (rewards, advantages, bookkeeping). It runs at whatever clock holds."""

    forward_passes: int = 0
    fixed_s: float = 0.0

    @property
    def empty(self) -> bool:
        """No work between the phases (the reference workload)."""
        return self.forward_passes == 0 and self.fixed_s == 0.0


@dataclass(frozen=True, slots=True)
class DriftStep:
    """One ``[[workload.drift.steps]]`` entry: from ``at_iteration`` on, these fields take these values."""

    at_iteration: int
    changes: tuple[tuple[str, float | int], ...]


@dataclass(frozen=True, slots=True)
class DriftSpec:
    """``[workload.drift]``: slow growth of the response median plus abrupt steps."""

    response_growth_per_iteration: float = 0.0
    steps: tuple[DriftStep, ...] = ()


@dataclass(frozen=True, slots=True)
class AsyncSpec:
    """``[workload.async]``: the two GPU pools and how stale the trained rollouts are."""

    generation_gpus: tuple[int, ...]
    training_gpus: tuple[int, ...]
    staleness: int


@dataclass(frozen=True, slots=True)
class NodesSpec:
    """``[workload.nodes]``: ``count`` nodes of ``gpus`` GPUs each run the same iteration (sim-model "Nodes").

    Node ``n`` draws a speed factor (log-normal, σ ``speed_sigma``) that multiplies every segment's duration
    on it; with probability ``straggle_probability`` per node and phase a phase on that node is slowed by a
    factor drawn uniformly from ``straggle_factor``; each phase on each GPU draws one log-normal factor for
    its duration and one for its power (σ ``noise_phase_duration``, ``noise_phase_power``).
    """

    count: int
    gpus: int
    speed_sigma: float = 0.02
    straggle_probability: float = 0.0
    straggle_factor: tuple[float, float] = (1.15, 1.4)
    noise_phase_duration: float = 0.01
    noise_phase_power: float = 0.01


@dataclass(frozen=True, slots=True)
class IterationWorkload:
    """The generation and training parameters in force at one iteration (drift applied)."""

    iteration: int
    generation: GenerationSpec
    training: TrainingSpec


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """``[workload]``: the RL job as the simulator runs it."""

    mode: ExecutionMode
    iterations: int
    gpus: int
    seed: int
    generation: GenerationSpec
    training: TrainingSpec
    drift: DriftSpec
    async_: AsyncSpec | None
    nodes: NodesSpec | None = None
    """Multi-node scenarios only: the nodes that each run this workload (``eerl-bench multinode``)."""
    between: BetweenSpec = BetweenSpec()
    """Work between generation and training (sync single-node scenarios only)."""

    def pool_gpus(self, kind: PhaseKind) -> int:
        """How many GPUs run phases of this kind (all of them in sync mode)."""
        if self.async_ is None:
            return self.gpus
        pool = self.async_.generation_gpus if kind is PhaseKind.GENERATION else self.async_.training_gpus
        return len(pool)

    @property
    def staleness(self) -> int:
        """Iterations between a rollout and the training step that uses it (0 in sync mode)."""
        return 0 if self.async_ is None else self.async_.staleness

    def at_iteration(self, iteration: int) -> IterationWorkload:
        """The workload of ``iteration`` with drift applied.

        Steps apply in file order from their ``at_iteration`` on. The median grows by
        ``(1 + response_growth_per_iteration)`` per iteration counted from the last step that set
        ``response_median_tokens`` (or from iteration 0), so a step's median is the value at that step.
        """
        generation_values: dict[str, Any] = {}
        training_values: dict[str, Any] = {}
        median_origin = 0
        for step in self.drift.steps:
            if step.at_iteration > iteration:
                continue
            for key, value in step.changes:
                if key in _GENERATION_RULES:
                    generation_values[key] = value
                    if key == "response_median_tokens":
                        median_origin = step.at_iteration
                else:
                    training_values[key] = value
        generation = replace(self.generation, **generation_values)
        growth = self.drift.response_growth_per_iteration
        if growth:
            grown = generation.response_median_tokens * (1.0 + growth) ** (iteration - median_origin)
            generation = replace(generation, response_median_tokens=max(1.0, grown))
        return IterationWorkload(iteration, generation, replace(self.training, **training_values))


@dataclass(frozen=True, slots=True)
class Scenario:
    """A GPU profile and an RL workload: everything a simulated run needs."""

    name: str
    description: str
    gpu: GpuProfile
    workload: WorkloadSpec
    source: str


def builtin_scenario_names(*, multinode: bool = False) -> tuple[str, ...]:
    """Names of the scenario files shipped in the package (sim/eerl_sim/scenarios), sorted: the single-node
    ones, or with ``multinode`` those with a ``[workload.nodes]`` table (``eerl-bench multinode``)."""
    names = []
    for path in SCENARIO_DIR.glob("*.toml"):
        workload = tomllib.loads(path.read_text(encoding="utf-8")).get("workload", {})
        if ("nodes" in workload) == multinode:
            names.append(path.stem)
    return tuple(sorted(names))


def resolve_scenario_path(path_or_name: str | Path) -> Path:
    """A bare name (no suffix, no separator) means the built-in NAME.toml; anything else is a path."""
    text = str(path_or_name)
    if isinstance(path_or_name, str) and "/" not in text and not text.endswith(".toml"):
        candidate = SCENARIO_DIR / f"{text}.toml"
        if not candidate.is_file():
            known = ", ".join(builtin_scenario_names())
            raise ConfigError(f"unknown scenario {text!r}; built-in scenarios: {known}")
        return candidate
    return Path(path_or_name)


def load_scenario(path_or_name: str | Path) -> Scenario:
    """Read and check a scenario file; ConfigError names the file, the key and the problem."""
    path = resolve_scenario_path(path_or_name)
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{source}: cannot read scenario file: {e.strerror or e}") from e
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source}: invalid TOML: {e}") from e
    return parse_scenario(data, source=source)


def parse_scenario(data: Mapping[str, Any], *, source: str = "<scenario>") -> Scenario:
    """Build a Scenario from an already-parsed TOML document (``source`` names it in errors)."""
    _reject_unknown(source, "", data, {"name", "description", "gpu", "workload"})
    name = _string(source, "name", data.get("name"), required=True)
    description = _string(source, "description", data.get("description", ""), required=False)
    gpu = _parse_gpu(source, _table(source, "gpu", data.get("gpu")))
    workload = _parse_workload(source, _table(source, "workload", data.get("workload")))
    return Scenario(name=name, description=description, gpu=gpu, workload=workload, source=source)


def _parse_gpu(source: str, table: Mapping[str, Any]) -> GpuProfile:
    if "profile" not in table:
        known = ", ".join(sorted(BUILTIN_PROFILES))
        raise ConfigError(f"{source}: 'gpu.profile' is missing (a built-in profile: {known})")
    profile_name = _string(source, "gpu.profile", table["profile"], required=True)
    try:
        profile = builtin_profile(profile_name)
    except ConfigError as e:
        raise ConfigError(f"{source}: 'gpu.profile': {e}") from None
    overrides = {k: v for k, v in table.items() if k != "profile"}
    if "name" in overrides:
        raise ConfigError(f"{source}: 'gpu.name' cannot be overridden; use 'gpu.profile'")
    return profile.with_overrides(overrides, source=source)


def _parse_workload(source: str, table: Mapping[str, Any]) -> WorkloadSpec:
    allowed = {"mode", "generation", "training", "drift", "async", "nodes", "between", *_WORKLOAD_RULES}
    _reject_unknown(source, "workload.", table, allowed)
    mode_text = _string(source, "workload.mode", table.get("mode"), required=True)
    try:
        mode = ExecutionMode(mode_text)
    except ValueError:
        raise ConfigError(
            f'{source}: \'workload.mode\' must be "sync" or "async", not {mode_text!r}'
        ) from None
    scalars = _scalars(source, "workload.", table, _WORKLOAD_RULES, required=True)
    generation = GenerationSpec(
        **_section(source, "workload.generation", table.get("generation"), _GENERATION_RULES)
    )
    training = TrainingSpec(**_section(source, "workload.training", table.get("training"), _TRAINING_RULES))
    drift = _parse_drift(source, table.get("drift", {}))
    async_spec: AsyncSpec | None = None
    if mode is ExecutionMode.ASYNC:
        async_spec = _parse_async(source, table.get("async"), int(scalars["gpus"]))
    elif "async" in table:
        raise ConfigError(f"{source}: 'workload.async' is only allowed with mode = \"async\"")
    nodes = None
    if "nodes" in table:
        if mode is not ExecutionMode.SYNC:
            raise ConfigError(f"{source}: 'workload.nodes' is only supported with mode = \"sync\"")
        nodes = _parse_nodes(source, table["nodes"], int(scalars["gpus"]))
    between = BetweenSpec()
    if "between" in table:
        if mode is not ExecutionMode.SYNC or nodes is not None:
            raise ConfigError(
                f"{source}: 'workload.between' is only supported with mode = \"sync\" on one node"
            )
        between_table = _table(source, "workload.between", table["between"])
        _reject_unknown(source, "workload.between.", between_table, set(_BETWEEN_RULES))
        between = BetweenSpec(
            **_scalars(source, "workload.between.", between_table, _BETWEEN_RULES, required=False)
        )
    return WorkloadSpec(
        mode=mode,
        iterations=int(scalars["iterations"]),
        gpus=int(scalars["gpus"]),
        seed=int(scalars["seed"]),
        generation=generation,
        training=training,
        drift=drift,
        async_=async_spec,
        nodes=nodes,
        between=between,
    )


def _parse_nodes(source: str, raw: Any, gpus: int) -> NodesSpec:
    table = _table(source, "workload.nodes", raw)
    _reject_unknown(source, "workload.nodes.", table, set(nodes_fields()))
    if "count" not in table:
        raise ConfigError(f"{source}: 'workload.nodes.count' is missing")
    values = _scalars(source, "workload.nodes.", table, _NODES_RULES, required=False)
    if values.setdefault("gpus", gpus) != gpus:
        raise ConfigError(
            f"{source}: 'workload.nodes.gpus' must equal workload.gpus ({gpus}): each node runs the workload"
        )
    if "straggle_factor" in table:  # otherwise NodesSpec's default
        values["straggle_factor"] = _parse_range(
            source, "workload.nodes.straggle_factor", table["straggle_factor"], _STRAGGLE_FACTOR_RULE
        )
    return NodesSpec(**values)


def _parse_range(source: str, dotted: str, raw: Any, rule: _Rule) -> tuple[float, float]:
    """A ``[low, high]`` pair of numbers, each within ``rule``."""
    if not isinstance(raw, list) or len(raw) != 2:
        raise ConfigError(f"{source}: '{dotted}' must be a list [low, high], not {raw!r}")
    low, high = (float(rule.check(source, dotted, value)) for value in raw)
    if low > high:
        raise ConfigError(f"{source}: '{dotted}' must be [low, high] with low <= high, got {raw!r}")
    return low, high


def _parse_drift(source: str, raw: Any) -> DriftSpec:
    table = _table(source, "workload.drift", raw)
    _reject_unknown(source, "workload.drift.", table, {"response_growth_per_iteration", "steps"})
    growth = _GROWTH_RULE.check(
        source,
        "workload.drift.response_growth_per_iteration",
        table.get("response_growth_per_iteration", 0.0),
    )
    raw_steps = table.get("steps", [])
    if not isinstance(raw_steps, list):
        raise ConfigError(
            f"{source}: 'workload.drift.steps' must be an array of tables ([[workload.drift.steps]])"
        )
    steps: list[DriftStep] = []
    changeable = {**_GENERATION_RULES, **_TRAINING_RULES}
    for index, raw_step in enumerate(raw_steps):
        prefix = f"workload.drift.steps[{index}]"
        step = _table(source, prefix, raw_step)
        if "at_iteration" not in step:
            raise ConfigError(f"{source}: '{prefix}.at_iteration' is missing")
        at_iteration = int(_AT_ITERATION_RULE.check(source, f"{prefix}.at_iteration", step["at_iteration"]))
        changes: list[tuple[str, float | int]] = []
        for key, value in step.items():
            if key == "at_iteration":
                continue
            if key not in changeable:
                raise ConfigError(
                    f"{source}: unknown key '{prefix}.{key}' (a step may change any field of "
                    "workload.generation or workload.training)"
                )
            changes.append((key, changeable[key].check(source, f"{prefix}.{key}", value)))
        if not changes:
            raise ConfigError(f"{source}: '{prefix}' changes nothing; give at least one workload field")
        steps.append(DriftStep(at_iteration, tuple(changes)))
    return DriftSpec(response_growth_per_iteration=float(growth), steps=tuple(steps))


def _parse_async(source: str, raw: Any, gpus: int) -> AsyncSpec:
    if raw is None:
        raise ConfigError(f"{source}: 'workload.async' is missing; mode = \"async\" needs it")
    table = _table(source, "workload.async", raw)
    _reject_unknown(source, "workload.async.", table, {"generation_gpus", "training_gpus", "staleness"})
    pools: dict[str, tuple[int, ...]] = {}
    for key in ("generation_gpus", "training_gpus"):
        dotted = f"workload.async.{key}"
        value = table.get(key)
        if value is None:
            raise ConfigError(f"{source}: '{dotted}' is missing")
        if not isinstance(value, list) or not value:
            raise ConfigError(f"{source}: '{dotted}' must be a non-empty list of GPU indices, not {value!r}")
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < gpus:
                raise ConfigError(f"{source}: '{dotted}' holds {item!r}; indices must be in [0, {gpus - 1}]")
        if len(set(value)) != len(value):
            raise ConfigError(f"{source}: '{dotted}' lists a GPU twice")
        pools[key] = tuple(value)
    if set(pools["generation_gpus"]) & set(pools["training_gpus"]):
        raise ConfigError(
            f"{source}: 'workload.async.training_gpus' overlaps generation_gpus; pools must be disjoint"
        )
    if "staleness" not in table:
        raise ConfigError(f"{source}: 'workload.async.staleness' is missing")
    staleness = int(_STALENESS_RULE.check(source, "workload.async.staleness", table["staleness"]))
    return AsyncSpec(pools["generation_gpus"], pools["training_gpus"], staleness)


def _section(source: str, dotted: str, raw: Any, rules: Mapping[str, _Rule]) -> dict[str, Any]:
    table = _table(source, dotted, raw)
    _reject_unknown(source, f"{dotted}.", table, set(rules))
    return _scalars(source, f"{dotted}.", table, rules, required=True)


def _scalars(
    source: str, prefix: str, table: Mapping[str, Any], rules: Mapping[str, _Rule], *, required: bool
) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, rule in rules.items():
        if key not in table:
            if required:
                raise ConfigError(f"{source}: '{prefix}{key}' is missing")
            continue
        values[key] = rule.check(source, f"{prefix}{key}", table[key])
    return values


def _table(source: str, dotted: str, raw: Any) -> Mapping[str, Any]:
    if raw is None:
        raise ConfigError(f"{source}: table '[{dotted}]' is missing")
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: '{dotted}' must be a table, not {raw!r}")
    return raw


def _reject_unknown(source: str, prefix: str, table: Mapping[str, Any], allowed: set[str]) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(f"{source}: unknown key '{prefix}{key}'")


def _string(source: str, key: str, value: Any, *, required: bool) -> str:
    if value is None and required:
        raise ConfigError(f"{source}: '{key}' is missing")
    if not isinstance(value, str):
        raise ConfigError(f"{source}: '{key}' must be a string, not {value!r}")
    return value


def scenario_fields() -> dict[str, tuple[str, ...]]:
    """The keys each section of a scenario file accepts (for docs and tests)."""
    return {
        "workload": ("mode", *_WORKLOAD_RULES),
        "workload.generation": tuple(f.name for f in fields(GenerationSpec)),
        "workload.training": tuple(f.name for f in fields(TrainingSpec)),
        "workload.drift": ("response_growth_per_iteration", "steps"),
        "workload.async": ("generation_gpus", "training_gpus", "staleness"),
        "workload.between": tuple(_BETWEEN_RULES),
    }


def nodes_fields() -> tuple[str, ...]:
    """The keys of ``[workload.nodes]`` (multi-node scenarios only; not part of :func:`scenario_fields`)."""
    return (*_NODES_RULES, "straggle_factor")
