"""The vocabulary of a session: phase kinds, execution modes, GPU roles, token workloads, controller states.

The one definition of these nouns: the client, the pure controller (:mod:`eerl.control`) and the daemon
(eerld) all import them from here, so a phase kind is the same type on every side. Their wire values are
in :mod:`eerl.wire.enums`; this module imports no protobuf.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import TypeVar

from eerl.errors import ConfigError


class PhaseKind(enum.StrEnum):
    """The two phases of an RL iteration."""

    GENERATION = "generation"
    TRAINING = "training"

    @classmethod
    def parse(cls, value: str | PhaseKind) -> PhaseKind:
        """Accepts the kind or a common alias ("gen", "rollout", "train", "update")."""
        if isinstance(value, PhaseKind):
            return value
        try:
            return _KIND_ALIASES[value.strip().lower()]
        except (KeyError, AttributeError):
            raise ConfigError(f"phase kind: {value!r} is not 'generation' or 'training'") from None


_KIND_ALIASES = {
    "generation": PhaseKind.GENERATION,
    "gen": PhaseKind.GENERATION,
    "generate": PhaseKind.GENERATION,
    "rollout": PhaseKind.GENERATION,
    "training": PhaseKind.TRAINING,
    "train": PhaseKind.TRAINING,
    "update": PhaseKind.TRAINING,
    "update_actor": PhaseKind.TRAINING,
}


class ExecutionMode(enum.StrEnum):
    """Generation and training alternate on the same GPUs (sync) or run at once on two pools (async)."""

    SYNC = "sync"
    ASYNC = "async"


class GpuRole(enum.StrEnum):
    """Which phases run on the GPUs of a session."""

    BOTH = "both"
    GENERATION = "generation"
    TRAINING = "training"

    def kinds(self) -> tuple[PhaseKind, ...]:
        """The phase kinds a session with this role runs."""
        if self is GpuRole.GENERATION:
            return (PhaseKind.GENERATION,)
        if self is GpuRole.TRAINING:
            return (PhaseKind.TRAINING,)
        return (PhaseKind.GENERATION, PhaseKind.TRAINING)


class ControllerState(enum.StrEnum):
    """What a clock controller is doing for one phase kind."""

    BASELINE = "baseline"
    EXPLORING = "exploring"
    COMMITTED = "committed"
    RETUNING = "retuning"
    FIXED = "fixed"
    OFF = "off"
    PINNED = "pinned"
    """An admin pin holds one of the session's GPUs: the controller waits (eerld decides the phase)."""


_E = TypeVar("_E", bound=enum.StrEnum)


def parse_enum(enum_type: type[_E], value: str | _E, name: str) -> _E:
    """``enum_type(value)`` with a :class:`ConfigError` that names the argument and the choices."""
    try:
        return enum_type(value)
    except ValueError:
        choices = ", ".join(member.value for member in enum_type)
        raise ConfigError(f"{name}: {value!r} is not one of {choices}") from None


@dataclass(frozen=True, slots=True)
class Workload:
    """The token workload of one phase: what makes two phases comparable. Zero means unknown.

    ``tokens``: tokens the phase processed (generated tokens for generation; prompt + response tokens
    trained on for training). ``valid_tokens``: response tokens of the responses trained on (the figure
    of merit's denominator). ``sequences``: responses. ``max_response_tokens``: the longest response
    (decode steps). ``prompt_tokens``: prompt tokens (prefill). ``max_worker_kv_tokens``: for generation,
    the busiest generation worker's decode reads in KV-cache tokens — Σ over its responses of length² / 2
    plus, for each of its decode steps (its longest response), the model's weights counted as the KV-cache
    tokens that cost as much to read (``eerl.integrations.decode_reads``); the phase ends with
    that worker, which the totals cannot tell (reports combine by maximum: each worker reports its own).
    """

    tokens: int = 0
    valid_tokens: int = 0
    sequences: int = 0
    max_response_tokens: int = 0
    prompt_tokens: int = 0
    max_worker_kv_tokens: int = 0


WORKLOAD_FIELDS: tuple[str, ...] = tuple(field.name for field in fields(Workload))
"""The fields of :class:`Workload`, in order (each also an ``eerl.v1.Workload`` field of that name)."""


def savings_fraction(saved_j: float, baseline_j: float) -> float:
    """Energy saved as a fraction of the energy the default governor would have used (``baseline_j``); 0 when
    there is no baseline yet. The one definition of "savings" that every report of a phase's or a run's
    estimated savings (``estimated_savings_fraction``) carries."""
    return saved_j / baseline_j if baseline_j > 0 else 0.0
