"""The one table between the session nouns (:mod:`eerl.phases`, :mod:`eerl.directives`) and their wire values
(``eerl.v1``).

Part of the shared wire vocabulary (:mod:`eerl.wire`): used by the client's sender, eerld's codec and
eerlctl. Each table is derived from the generated enums by name (``PhaseKind.TRAINING`` →
``PHASE_KIND_TRAINING``), so a member the proto lacks fails at import rather than at the first RPC; each
``*_FROM_PB`` is its ``*_TO_PB`` reversed (``UNSPECIFIED`` is in neither: what it means is the caller's to
say).
"""

from __future__ import annotations

from eerl.directives import DirectivePurpose, DirectiveVerdict
from eerl.phases import WORKLOAD_FIELDS, ControllerState, ExecutionMode, GpuRole, PhaseKind, Workload
from eerl.v1 import eerl_pb2

KIND_TO_PB: dict[PhaseKind, eerl_pb2.PhaseKind.ValueType] = {
    kind: eerl_pb2.PhaseKind.Value(f"PHASE_KIND_{kind.name}") for kind in PhaseKind
}
KIND_FROM_PB: dict[eerl_pb2.PhaseKind.ValueType, PhaseKind] = {v: k for k, v in KIND_TO_PB.items()}
MODE_TO_PB: dict[ExecutionMode, eerl_pb2.ExecutionMode.ValueType] = {
    mode: eerl_pb2.ExecutionMode.Value(f"EXECUTION_MODE_{mode.name}") for mode in ExecutionMode
}
MODE_FROM_PB: dict[eerl_pb2.ExecutionMode.ValueType, ExecutionMode] = {v: k for k, v in MODE_TO_PB.items()}
ROLE_TO_PB: dict[GpuRole, eerl_pb2.GpuRole.ValueType] = {
    role: eerl_pb2.GpuRole.Value(f"GPU_ROLE_{role.name}") for role in GpuRole
}
ROLE_FROM_PB: dict[eerl_pb2.GpuRole.ValueType, GpuRole] = {v: k for k, v in ROLE_TO_PB.items()}
STATE_TO_PB: dict[ControllerState, eerl_pb2.ControllerState.ValueType] = {
    state: eerl_pb2.ControllerState.Value(f"CONTROLLER_STATE_{state.name}") for state in ControllerState
}
STATE_FROM_PB: dict[eerl_pb2.ControllerState.ValueType, ControllerState] = {
    v: k for k, v in STATE_TO_PB.items()
}
PURPOSE_TO_PB: dict[DirectivePurpose, eerl_pb2.DirectivePurpose.ValueType] = {
    purpose: eerl_pb2.DirectivePurpose.Value(f"DIRECTIVE_PURPOSE_{purpose.name}")
    for purpose in DirectivePurpose
}
PURPOSE_FROM_PB: dict[eerl_pb2.DirectivePurpose.ValueType, DirectivePurpose] = {
    v: k for k, v in PURPOSE_TO_PB.items()
}
VERDICT_TO_PB: dict[DirectiveVerdict, eerl_pb2.DirectiveVerdict.ValueType] = {
    verdict: eerl_pb2.DirectiveVerdict.Value(f"DIRECTIVE_VERDICT_{verdict.name}")
    for verdict in DirectiveVerdict
}
VERDICT_FROM_PB: dict[eerl_pb2.DirectiveVerdict.ValueType, DirectiveVerdict] = {
    v: k for k, v in VERDICT_TO_PB.items()
}

_UNSENT = set(WORKLOAD_FIELDS) - set(eerl_pb2.Workload.DESCRIPTOR.fields_by_name)
if _UNSENT:  # a field the proto lacks fails here, at import, not at the first phase
    raise ImportError(f"eerl.v1.Workload has no field {sorted(_UNSENT)}: run make proto")


def workload_to_pb(workload: Workload) -> eerl_pb2.Workload:
    """A workload on the wire, its counts as they are (check them first:
    :func:`eerl.wire.limits.check_workload`)."""
    return eerl_pb2.Workload(**{name: getattr(workload, name) for name in WORKLOAD_FIELDS})


def workload_from_pb(message: eerl_pb2.Workload) -> Workload:
    """A workload off the wire, unchecked (eerld's codec checks each field against its limit)."""
    return Workload(**{name: getattr(message, name) for name in WORKLOAD_FIELDS})
