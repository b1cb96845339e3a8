"""Admin pins (:mod:`eerld.clocks.pins`): a pin read as untrusted input, its clocks checked against the GPU's,
its expiry, and the store that keeps pins in the state directory across restarts."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from eerld.clocks.pins import (
    MAX_MEM_CLOCK_MHZ,
    MAX_REASON_CHARS,
    MAX_SM_CLOCK_MHZ,
    MAX_UNIX_S,
    MAX_UUID_CHARS,
    PINS_FILE,
    Pin,
    PinStore,
    parse_pin,
    pin_problem,
)
from eerld.errors import ConfigError, Unavailable
from tests.security.test_failsafes import fill, tmpfs

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a full disk is a tmpfs mount, which needs root")


def pin_json(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "uuid": "GPU-a",
        "sm_clock_mhz": 900,
        "mem_clock_mhz": 0,
        "reason": "r",
        "created_at_unix_s": 1.0,
        "expires_at_unix_s": 0.0,
    }
    base.update(fields)
    return base


def a_pin(uuid: str = "GPU-a", sm_clock_mhz: int = 900, **fields: Any) -> Pin:
    values: dict[str, Any] = {
        "mem_clock_mhz": 0,
        "reason": "maintenance",
        "created_at_unix_s": 1.7e9,
        "expires_at_unix_s": 0.0,
    }
    values.update(fields)
    return Pin(uuid=uuid, sm_clock_mhz=sm_clock_mhz, **values)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A private state directory, as the daemon requires."""
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    return path


def pins_on_disk(state: Path) -> list[str]:
    return [p["uuid"] for p in json.loads((state / PINS_FILE).read_text())["pins"]]


def set_aside_files(state: Path) -> list[str]:
    return sorted(p.name for p in state.iterdir() if p.name.startswith(f"{PINS_FILE}.corrupt-"))


class TestParsePin:
    def test_a_sound_pin_is_read(self) -> None:
        assert parse_pin(pin_json()) == Pin("GPU-a", 900, 0, "r", 1.0, 0.0)

    def test_only_the_uuid_and_the_sm_clock_are_required_the_rest_defaults(self) -> None:
        assert parse_pin({"uuid": "GPU-a", "sm_clock_mhz": 900}) == Pin("GPU-a", 900, 0, "", 0.0, 0.0)

    def test_integer_times_are_read_as_floats(self) -> None:
        pin = parse_pin(pin_json(created_at_unix_s=1_700_000_000, expires_at_unix_s=1_700_000_060))
        assert (pin.created_at_unix_s, pin.expires_at_unix_s) == (1.7e9, 1.70000006e9)
        assert isinstance(pin.created_at_unix_s, float)

    @pytest.mark.parametrize(
        "fields",
        [
            {"sm_clock_mhz": 1},
            {"sm_clock_mhz": MAX_SM_CLOCK_MHZ},
            {"mem_clock_mhz": MAX_MEM_CLOCK_MHZ},
            {"uuid": "G" * MAX_UUID_CHARS},
            {"reason": "r" * MAX_REASON_CHARS},
            {"reason": "drain for the élan firmware"},
            {"expires_at_unix_s": MAX_UNIX_S},
            {"created_at_unix_s": 0},
        ],
        ids=lambda f: next(iter(f)),
    )
    def test_values_at_the_edges_of_their_ranges_are_accepted(self, fields: dict[str, object]) -> None:
        pin = parse_pin(pin_json(**fields))
        [(name, value)] = fields.items()
        assert getattr(pin, name) == value

    @pytest.mark.parametrize(
        ("fields", "named"),
        [
            ({"sm_clock_mhz": "900"}, "sm_clock_mhz"),
            ({"sm_clock_mhz": 900.0}, "sm_clock_mhz"),
            ({"sm_clock_mhz": None}, "sm_clock_mhz"),
            ({"sm_clock_mhz": 0}, "sm_clock_mhz"),
            ({"sm_clock_mhz": MAX_SM_CLOCK_MHZ + 1}, "sm_clock_mhz"),
            ({"sm_clock_mhz": 10**9}, "sm_clock_mhz"),
            ({"sm_clock_mhz": True}, "sm_clock_mhz"),
            ({"mem_clock_mhz": -1}, "mem_clock_mhz"),
            ({"mem_clock_mhz": MAX_MEM_CLOCK_MHZ + 1}, "mem_clock_mhz"),
            ({"mem_clock_mhz": False}, "mem_clock_mhz"),
            ({"uuid": 7}, "uuid"),
            ({"uuid": ""}, "uuid"),
            ({"uuid": "G" * (MAX_UUID_CHARS + 1)}, "uuid"),
            ({"uuid": "GPU-\x00"}, "uuid"),
            ({"reason": "a\nb"}, "reason"),
            ({"reason": None}, "reason"),
            ({"reason": "r" * (MAX_REASON_CHARS + 1)}, "reason"),
            ({"expires_at_unix_s": float("nan")}, "expires_at_unix_s"),
            ({"expires_at_unix_s": float("inf")}, "expires_at_unix_s"),
            ({"expires_at_unix_s": -5}, "expires_at_unix_s"),
            ({"expires_at_unix_s": MAX_UNIX_S * 2}, "expires_at_unix_s"),
            ({"expires_at_unix_s": True}, "expires_at_unix_s"),
            ({"created_at_unix_s": "yesterday"}, "created_at_unix_s"),
            ({"created_at_unix_s": None}, "created_at_unix_s"),
        ],
    )
    def test_a_pin_of_the_wrong_type_or_an_absurd_value_is_refused_naming_the_field(
        self, fields: dict[str, object], named: str
    ) -> None:
        with pytest.raises(ValueError, match=named):
            parse_pin(pin_json(**fields))

    @pytest.mark.parametrize("missing", ["uuid", "sm_clock_mhz"])
    def test_a_pin_without_a_required_field_is_refused_naming_it(self, missing: str) -> None:
        item = pin_json()
        del item[missing]
        with pytest.raises(ValueError, match=missing):
            parse_pin(item)

    @pytest.mark.parametrize(("item", "kind"), [(None, "null"), ([], "list"), ("GPU-a", "str"), (5, "int")])
    def test_anything_but_an_object_is_refused_naming_what_it_is(self, item: object, kind: str) -> None:
        with pytest.raises(ValueError, match=f"expected an object, got {kind}"):
            parse_pin(item)

    def test_the_refusal_of_a_huge_value_does_not_echo_it_whole(self) -> None:
        with pytest.raises(ValueError, match="sm_clock_mhz") as e:
            parse_pin(pin_json(sm_clock_mhz="9" * 100_000))
        assert len(str(e.value)) < 200

    def test_an_integer_time_too_large_for_a_float_is_refused_naming_the_field(self) -> None:
        with pytest.raises(ValueError, match="expires_at_unix_s"):
            parse_pin(pin_json(expires_at_unix_s=10**400))


class TestPinProblem:
    SM = (1185, 1200, 1215)
    MEM = (1593, 2619)

    def test_a_pin_of_supported_clocks_has_no_problem(self) -> None:
        assert pin_problem(a_pin(sm_clock_mhz=1200), self.SM, self.MEM) == ""
        assert pin_problem(a_pin(sm_clock_mhz=1200, mem_clock_mhz=2619), self.SM, self.MEM) == ""

    def test_an_unsupported_sm_clock_is_named_with_the_nearest_supported_ones(self) -> None:
        problem = pin_problem(a_pin(sm_clock_mhz=1201), self.SM, self.MEM)
        assert problem.startswith("sm_clock_mhz: 1201 MHz is not supported by the GPU; ")
        assert "nearest supported: 1200, 1215 MHz" in problem

    def test_an_unsupported_memory_clock_is_named_with_every_supported_one(self) -> None:
        problem = pin_problem(a_pin(sm_clock_mhz=1200, mem_clock_mhz=5), self.SM, [2619, 1593])
        assert problem == "mem_clock_mhz: 5 MHz is not supported by the GPU; supported: 1593, 2619 MHz"

    def test_the_sm_clock_is_reported_first_when_both_are_unsupported(self) -> None:
        assert pin_problem(a_pin(sm_clock_mhz=1, mem_clock_mhz=5), self.SM, self.MEM).startswith(
            "sm_clock_mhz"
        )

    def test_no_memory_lock_needs_no_supported_memory_clock(self) -> None:
        assert pin_problem(a_pin(sm_clock_mhz=1200, mem_clock_mhz=0), self.SM, self.MEM) == ""

    def test_clocks_that_are_not_known_are_not_checked(self) -> None:
        assert pin_problem(a_pin(sm_clock_mhz=1201, mem_clock_mhz=5), [], []) == ""


class TestExpiry:
    def test_a_pin_with_no_expiry_never_runs_out(self) -> None:
        assert not a_pin(expires_at_unix_s=0.0).expired(MAX_UNIX_S)

    def test_a_pin_runs_out_at_its_expiry_time_not_before(self) -> None:
        pin = a_pin(expires_at_unix_s=1000.0)
        assert not pin.expired(999.9)
        assert pin.expired(1000.0)
        assert pin.expired(5000.0)


class TestPinStore:
    def test_a_new_store_has_no_pin_and_writes_no_file(self, state: Path) -> None:
        store = PinStore(state)
        assert store.all() == {}
        assert store.get("GPU-a") is None
        assert store.path == state / PINS_FILE
        assert not store.path.exists()

    def test_pins_put_are_read_back_by_a_new_store_on_the_same_directory(self, state: Path) -> None:
        a, b = a_pin("GPU-a", 900), a_pin("GPU-b", 1200, mem_clock_mhz=1593, expires_at_unix_s=1.8e9)
        PinStore(state).put_many([a, b])
        again = PinStore(state)
        assert again.all() == {"GPU-a": a, "GPU-b": b}
        assert again.get("GPU-b") == b
        assert stat.S_IMODE((state / PINS_FILE).stat().st_mode) == 0o600
        assert json.loads((state / PINS_FILE).read_text())["version"] == 1

    def test_a_pin_put_again_replaces_the_pin_of_its_gpu(self, state: Path) -> None:
        store = PinStore(state)
        store.put_many([a_pin("GPU-a", 900)])
        store.put_many([a_pin("GPU-a", 1200)])
        assert PinStore(state).all() == {"GPU-a": a_pin("GPU-a", 1200)}

    def test_all_is_a_copy(self, state: Path) -> None:
        store = PinStore(state)
        store.put_many([a_pin("GPU-a")])
        copy = store.all()
        assert isinstance(copy, dict)
        copy.clear()
        assert store.get("GPU-a") == a_pin("GPU-a")

    def test_remove_many_returns_the_pins_that_existed_and_a_new_store_no_longer_sees_them(
        self, state: Path
    ) -> None:
        a, b, c = a_pin("GPU-a"), a_pin("GPU-b"), a_pin("GPU-c")
        store = PinStore(state)
        store.put_many([a, b, c])
        assert store.remove_many(["GPU-a", "GPU-x", "GPU-c"]) == [a, c]
        assert store.all() == {"GPU-b": b}
        assert PinStore(state).all() == {"GPU-b": b}
        assert store.remove_many(["GPU-x"]) == []
        assert store.flush()

    def test_a_dropped_pin_is_left_out_of_the_file_by_the_next_flush(self, state: Path) -> None:
        good = pin_json(uuid="GPU-a")
        (state / PINS_FILE).write_text(json.dumps({"pins": [good, pin_json(uuid="GPU-b", sm_clock_mhz=0)]}))
        with capture_logs() as logs:
            store = PinStore(state)
        assert store.all() == {"GPU-a": parse_pin(good)}
        [dropped] = [e for e in logs if e["event"] == "pin_dropped"]
        assert dropped["pin"] == "pins[1]"
        assert "sm_clock_mhz" in dropped["problem"]
        assert dropped["path"] == str(state / PINS_FILE)
        assert pins_on_disk(state) == ["GPU-a", "GPU-b"]  # until the flush
        assert store.flush()
        assert pins_on_disk(state) == ["GPU-a"]

    @pytest.mark.parametrize(
        ("raw", "reason"),
        [
            (b"not json", "not valid JSON"),
            (b"\xff\xfe", "not valid JSON"),
            (b"[]", "expected a JSON object"),
            (b'{"pins": {"GPU-a": 900}}', "pins: expected a list, got dict"),
            (b'{"pins": null}', "pins: expected a list, got NoneType"),
        ],
        ids=["not json", "not utf-8", "a list", "pins an object", "pins null"],
    )
    def test_a_corrupt_pins_file_is_set_aside_with_its_reason_and_nothing_is_loaded(
        self, state: Path, raw: bytes, reason: str
    ) -> None:
        (state / PINS_FILE).write_bytes(raw)
        with capture_logs() as logs:
            store = PinStore(state)
        assert store.all() == {}
        assert not (state / PINS_FILE).exists()
        [moved] = set_aside_files(state)
        assert (state / moved).read_bytes() == raw
        [event] = [e for e in logs if e["event"] == "pins_set_aside"]
        assert reason in event["reason"]
        assert str(state / PINS_FILE) in event["reason"]
        assert event["moved_to"] == str(state / moved)

    def test_a_symlink_in_place_of_the_pins_file_is_not_followed_but_set_aside(self, state: Path) -> None:
        elsewhere = state.parent / "elsewhere.json"
        elsewhere.write_text(json.dumps({"pins": [pin_json()]}))
        (state / PINS_FILE).symlink_to(elsewhere)
        with capture_logs() as logs:
            store = PinStore(state)
        assert store.all() == {}
        [moved] = set_aside_files(state)
        assert (state / moved).is_symlink()
        assert json.loads(elsewhere.read_text()) == {"pins": [pin_json()]}  # the target is untouched
        [event] = [e for e in logs if e["event"] == "pins_set_aside"]
        assert "symlink" in event["reason"]

    def test_a_store_after_a_corrupt_file_starts_empty_and_writes_a_fresh_one(self, state: Path) -> None:
        (state / PINS_FILE).write_text("not json")
        store = PinStore(state)
        store.put_many([a_pin("GPU-a")])
        assert PinStore(state).all() == {"GPU-a": a_pin("GPU-a")}

    def test_a_state_directory_others_may_write_is_refused(self, state: Path) -> None:
        state.chmod(0o777)
        with pytest.raises(ConfigError, match="writable by group or others"):
            PinStore(state)


@needs_root
class TestPinStoreOnAFullDisk:
    def test_a_pin_that_cannot_be_written_is_refused_and_changes_nothing(self, sock_dir: Path) -> None:
        with tmpfs(sock_dir / "state") as state:
            store = PinStore(state)
            store.put_many([a_pin("GPU-a")])
            filler = fill(state)
            with pytest.raises(Unavailable, match="cannot record the pin"):
                store.put_many([a_pin("GPU-a", 1200), a_pin("GPU-b")])
            assert store.all() == {"GPU-a": a_pin("GPU-a")}
            assert PinStore(state).all() == {"GPU-a": a_pin("GPU-a")}
            filler.unlink()
            store.put_many([a_pin("GPU-b")])
            assert sorted(PinStore(state).all()) == ["GPU-a", "GPU-b"]

    def test_a_removal_that_cannot_be_written_takes_effect_and_flush_writes_it_once_there_is_room(
        self, sock_dir: Path
    ) -> None:
        with tmpfs(sock_dir / "state") as state:
            store = PinStore(state)
            store.put_many([a_pin("GPU-a"), a_pin("GPU-b")])
            filler = fill(state)
            with capture_logs() as logs:
                assert store.remove_many(["GPU-a"]) == [a_pin("GPU-a")]
                assert store.get("GPU-a") is None  # the safe direction: the GPU goes back to its default
                assert pins_on_disk(state) == ["GPU-a", "GPU-b"]
                assert not store.flush()
            assert [e["event"] for e in logs] == ["pins_write_failed", "pins_write_failed"]
            filler.unlink()
            assert store.flush()
            assert PinStore(state).all() == {"GPU-b": a_pin("GPU-b")}
