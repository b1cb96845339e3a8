"""The committed gRPC code is what `make proto` makes from proto/, and the contract keeps its rules."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from eerl.v1 import eerl_pb2

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "proto" / "eerl" / "v1" / "eerl.proto"


class TestGeneratedCode:
    def test_committed_code_matches_the_proto(self) -> None:
        """Regenerating from proto/ with the pinned tools gives byte-identical committed files."""
        result = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr

    def test_a_changed_proto_is_detected_as_stale(self, tmp_path: Path) -> None:
        """The freshness check fails when the proto and the committed code disagree."""
        spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
        assert spec is not None
        assert spec.loader is not None
        gen_protos = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(gen_protos)
        original = gen_protos.PROTO_ROOT
        copy = tmp_path / "proto" / "eerl" / "v1"
        copy.mkdir(parents=True)
        (copy / "eerl.proto").write_text(
            PROTO.read_text().replace(
                "message Policy {", "message Policy {\n  // added by the test\n  uint32 extra_field = 99;"
            )
        )
        gen_protos.PROTO_ROOT = tmp_path / "proto"
        try:
            assert gen_protos.main(["--check"]) == 1
        finally:
            gen_protos.PROTO_ROOT = original


class TestContractRules:
    def test_every_enum_starts_with_unspecified_zero(self) -> None:
        """Each enum's first value is NAME_UNSPECIFIED = 0, so a missing value is never a valid choice."""
        text = PROTO.read_text()
        for name, body in re.findall(r"enum (\w+) \{(.*?)\}", text, flags=re.S):
            first = re.search(r"(\w+)\s*=\s*(\d+);", body)
            assert first is not None
            assert first.group(2) == "0", name
            assert first.group(1).endswith("_UNSPECIFIED"), name

    def test_every_field_is_commented(self) -> None:
        """Every message field has a comment line just above it."""
        lines = PROTO.read_text().splitlines()
        field = re.compile(r"^\s+(optional |repeated )?[\w.]+ \w+ = \d+;")
        for number, line in enumerate(lines):
            if field.match(line) and "oneof" not in line:
                assert lines[number - 1].strip().startswith("//"), f"line {number + 1}: {line.strip()}"

    def test_both_services_offer_every_rpc_of_the_design(self) -> None:
        """PhaseService and AdminService expose the RPCs design.md names."""
        services = eerl_pb2.DESCRIPTOR.services_by_name
        assert set(services["PhaseService"].methods_by_name) >= {
            "OpenSession",
            "BeginPhase",
            "EndPhase",
            "Heartbeat",
            "CloseSession",
        }
        assert set(services["AdminService"].methods_by_name) == {
            "Status",
            "Pin",
            "Unpin",
            "ListSessions",
            "GetDecisions",
            "ResetAll",
            "Grant",
            "Revoke",
            "ListGrants",
            "Drain",
            "Report",
            "Undrain",
        }
