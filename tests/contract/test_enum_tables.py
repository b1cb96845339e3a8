"""The one table between the session nouns and the proto enums: complete, reversible, UNSPECIFIED-free."""

from __future__ import annotations

import enum

import pytest
from eerl.directives import DirectivePurpose, DirectiveVerdict
from eerl.phases import ControllerState, ExecutionMode, GpuRole, PhaseKind
from eerl.v1 import eerl_pb2
from eerl.wire import enums

TABLES = [
    (PhaseKind, eerl_pb2.PhaseKind, enums.KIND_TO_PB, enums.KIND_FROM_PB),
    (ExecutionMode, eerl_pb2.ExecutionMode, enums.MODE_TO_PB, enums.MODE_FROM_PB),
    (GpuRole, eerl_pb2.GpuRole, enums.ROLE_TO_PB, enums.ROLE_FROM_PB),
    (ControllerState, eerl_pb2.ControllerState, enums.STATE_TO_PB, enums.STATE_FROM_PB),
    (DirectivePurpose, eerl_pb2.DirectivePurpose, enums.PURPOSE_TO_PB, enums.PURPOSE_FROM_PB),
    (DirectiveVerdict, eerl_pb2.DirectiveVerdict, enums.VERDICT_TO_PB, enums.VERDICT_FROM_PB),
]


@pytest.mark.parametrize(
    ("noun", "wire", "to_pb", "from_pb"), TABLES, ids=["kind", "mode", "role", "state", "purpose", "verdict"]
)
class TestEnumTables:
    def test_every_member_has_the_wire_value_of_its_name(self, noun, wire, to_pb, from_pb) -> None:
        """Each member maps to the proto value whose name ends in the member's name."""
        assert set(to_pb) == set(noun)
        assert all(wire.Name(to_pb[m]).endswith(f"_{m.name}") for m in noun)

    def test_every_wire_value_but_unspecified_has_a_member(self, noun, wire, to_pb, from_pb) -> None:
        """The proto has no value the nouns lack, and UNSPECIFIED is the caller's to interpret."""
        named = {v for v in wire.values() if not wire.Name(v).endswith("_UNSPECIFIED")}
        assert set(from_pb) == named

    def test_the_reverse_table_undoes_the_forward_one(self, noun, wire, to_pb, from_pb) -> None:
        """Sending and receiving a member gives the same member back."""
        members: list[enum.StrEnum] = list(noun)
        assert [from_pb[to_pb[m]] for m in members] == members
