"""The lock ledger (:mod:`eerld.clocks.ledger`) as untrusted input: wrong types, a corrupt file, a full
disk."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from eerld.clocks.ledger import LEDGER_FILE, Ledger, LedgerEntry
from eerld.errors import ConfigError
from tests.security.test_failsafes import fill, tmpfs

WRONG = {
    "locked null": ({"locked": None}, "locked"),
    "locked an object": ({"locked": {"0": 1}}, "locked"),
    "entry a number": ({"locked": [5]}, "locked[0]"),
    "index a string": ({"locked": [{"index": "x"}]}, "locked[0].index"),
    "index a bool": ({"locked": [{"index": True}]}, "locked[0].index"),
    "index negative": ({"locked": [{"index": -1}]}, "locked[0].index"),
    "index a float": ({"locked": [{"index": 1.0}]}, "locked[0].index"),
    "uuid a number": ({"locked": [{"index": 0, "uuid": 5}]}, "locked[0].uuid"),
    "owner a list": ({"locked": [{"index": 0, "owner": []}]}, "locked[0].owner"),
    "another version": ({"version": 2, "locked": []}, "version"),
    "a list": ([], "expected a JSON object"),
}


def entry(index: int) -> LedgerEntry:
    return LedgerEntry(index, f"GPU-{index}", "session")


def on_disk(state: Path) -> list[int]:
    return sorted(e["index"] for e in json.loads((state / LEDGER_FILE).read_text())["locked"])


class TestReading:
    @pytest.mark.parametrize(("document", "field"), WRONG.values(), ids=WRONG.keys())
    def test_a_ledger_of_the_wrong_shape_is_marked_corrupt_naming_the_file_and_the_field(
        self, tmp_path: Path, document: object, field: str
    ) -> None:
        (tmp_path / LEDGER_FILE).write_text(json.dumps(document))
        ledger = Ledger(tmp_path)
        assert str(tmp_path / LEDGER_FILE) in ledger.corrupt
        assert field in ledger.corrupt
        with pytest.raises(ConfigError, match="set the ledger aside"):
            ledger.entries()

    @pytest.mark.parametrize("raw", [b"not json", b"", b"\xff\xfe", b"[" * 100_000])
    def test_bytes_that_are_not_json_are_a_corrupt_ledger_not_a_crash(
        self, tmp_path: Path, raw: bytes
    ) -> None:
        (tmp_path / LEDGER_FILE).write_bytes(raw)
        assert "not valid JSON" in Ledger(tmp_path).corrupt

    def test_a_symlink_in_place_of_the_ledger_is_not_followed(self, tmp_path: Path) -> None:
        elsewhere = tmp_path / "elsewhere.json"
        elsewhere.write_text(json.dumps({"locked": [{"index": 3}]}))
        (tmp_path / LEDGER_FILE).symlink_to(elsewhere)
        assert "symlink" in Ledger(tmp_path).corrupt

    def test_a_sound_ledger_is_read_back(self, tmp_path: Path) -> None:
        Ledger(tmp_path).add(entry(2))
        assert Ledger(tmp_path).entries() == {2: entry(2)}

    def test_a_state_directory_another_user_owns_is_refused(self, tmp_path: Path) -> None:
        os.chown(tmp_path, 65534, 65534)
        with pytest.raises(ConfigError, match="owned by"):
            Ledger(tmp_path)


class TestSetAside:
    def test_a_corrupt_ledger_refuses_changes_until_set_aside_then_starts_empty(self, tmp_path: Path) -> None:
        (tmp_path / LEDGER_FILE).write_text('{"locked": null}')
        ledger = Ledger(tmp_path)
        with pytest.raises(ConfigError):
            ledger.add(entry(0))
        moved = ledger.set_aside()
        assert moved is not None
        assert moved.name.startswith(f"{LEDGER_FILE}.corrupt-")
        assert moved.read_text() == '{"locked": null}'
        assert ledger.corrupt == ""
        ledger.add(entry(0))
        assert on_disk(tmp_path) == [0]

    def test_a_sound_ledger_is_not_set_aside(self, tmp_path: Path) -> None:
        ledger = Ledger(tmp_path)
        ledger.add(entry(1))
        assert ledger.set_aside() is None
        assert on_disk(tmp_path) == [1]

    def test_replace_lists_exactly_the_entries_given_even_over_a_corrupt_file(self, tmp_path: Path) -> None:
        (tmp_path / LEDGER_FILE).write_text("not json")
        ledger = Ledger(tmp_path)
        ledger.replace([entry(3)])
        assert ledger.entries() == {3: entry(3)}
        assert on_disk(tmp_path) == [3]


class TestFullDisk:
    """The record on disk is the truth; memory follows it only once it is written."""

    def test_an_add_that_cannot_be_written_lists_nothing_and_a_retry_writes_again(
        self, sock_dir: Path
    ) -> None:
        with tmpfs(sock_dir / "state") as state:
            ledger = Ledger(state)
            filler = fill(state)
            for _ in range(2):
                with pytest.raises(OSError):
                    ledger.add(entry(0))
                assert ledger.entries() == {}
            assert sorted(p.name for p in state.iterdir()) == ["filler"]
            filler.unlink()
            ledger.add(entry(0))
            assert on_disk(state) == [0]

    def test_a_remove_that_cannot_be_written_keeps_the_gpu_listed_and_is_retried(
        self, sock_dir: Path
    ) -> None:
        with tmpfs(sock_dir / "state") as state:
            ledger = Ledger(state)
            ledger.add(entry(0))
            ledger.add(entry(1))
            filler = fill(state)
            with pytest.raises(OSError):
                ledger.remove(0)
            assert on_disk(state) == [0, 1]
            assert not ledger.retry_removals()
            filler.unlink()
            assert ledger.retry_removals()
            assert on_disk(state) == [1]
            assert Ledger(state).entries() == {1: entry(1)}

    def test_a_gpu_locked_again_before_its_removal_was_written_stays_listed(self, sock_dir: Path) -> None:
        with tmpfs(sock_dir / "state") as state:
            ledger = Ledger(state)
            ledger.add(entry(0))
            filler = fill(state)
            with pytest.raises(OSError):
                ledger.remove(0)
            ledger.add(entry(0))  # locked again: listed on disk already, so no write is needed
            filler.unlink()
            ledger.add(entry(1))
            assert ledger.retry_removals()
            assert on_disk(state) == [0, 1]

    def test_the_next_write_also_drops_a_pending_removal(self, sock_dir: Path) -> None:
        with tmpfs(sock_dir / "state") as state:
            ledger = Ledger(state)
            ledger.add(entry(0))
            filler = fill(state)
            with pytest.raises(OSError):
                ledger.remove(0)
            filler.unlink()
            ledger.add(entry(2))
            assert on_disk(state) == [2]
