"""The vocabulary of a session: phase kinds, execution modes, GPU roles and token workloads."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeVar

from eerl.errors import ConfigError
from eerl.v1 import eerl_pb2


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


# Their wire values, derived from the generated enums by name (``PhaseKind.TRAINING`` →
# ``PHASE_KIND_TRAINING``), so a member the proto lacks fails at import rather than at the first RPC.
KIND_TO_PB: dict[PhaseKind, eerl_pb2.PhaseKind.ValueType] = {
    kind: eerl_pb2.PhaseKind.Value(f"PHASE_KIND_{kind.name}") for kind in PhaseKind
}
KIND_FROM_PB: dict[eerl_pb2.PhaseKind.ValueType, PhaseKind] = {v: k for k, v in KIND_TO_PB.items()}
MODE_TO_PB: dict[ExecutionMode, eerl_pb2.ExecutionMode.ValueType] = {
    mode: eerl_pb2.ExecutionMode.Value(f"EXECUTION_MODE_{mode.name}") for mode in ExecutionMode
}
ROLE_TO_PB: dict[GpuRole, eerl_pb2.GpuRole.ValueType] = {
    role: eerl_pb2.GpuRole.Value(f"GPU_ROLE_{role.name}") for role in GpuRole
}

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
    """The token workload of one phase, as the worker knows it. Zero means unknown.

    ``tokens``: tokens the phase processed (generated tokens for generation; prompt + response tokens
    trained on for training). ``valid_tokens``: response tokens of the responses trained on (the figure
    of merit's denominator). ``sequences``: responses. ``max_response_tokens``: the longest response.
    ``prompt_tokens``: prompt tokens.
    """

    tokens: int = 0
    valid_tokens: int = 0
    sequences: int = 0
    max_response_tokens: int = 0
    prompt_tokens: int = 0
