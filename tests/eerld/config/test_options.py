"""eerld's options, each declared once (eerld/config/options.py): what the parser, the file and the docs make.

The behaviour of single options (precedence, the error of each bad value, exit code 2) is tested where it is
used: tests/eerld/api/test_server.py (TestConfig), test_job_mode.py, test_lease_cap.py, tests/ops.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from eerld.config import Config, build_parser, load_config, validate
from eerld.config.load import file_keys, shown_default
from eerld.config.options import CONFIG_FILE, Option, options
from eerld.config.values import true_or_false
from eerld.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "gen_options_doc.py"
OPTIONS = dict(options())


def _shown_as_a_value(name: str, spec: Option) -> bool:
    default = shown_default(name, spec)
    return (
        spec.flag is not None and spec.rule is not true_or_false and default != "none" and " " not in default
    )


SHOWN = [(name, spec) for name, spec in OPTIONS.items() if _shown_as_a_value(name, spec)]
"""The options with a flag that takes a value, and a default that --help and the docs show as one."""


def gen_options_doc() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_options_doc", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TestDeclarations:
    def test_every_option_is_set_by_a_flag_or_a_file_key_and_no_two_share_one(self) -> None:
        flags = [s.flag for s in OPTIONS.values() if s.flag] + [CONFIG_FILE.flag]
        keys = [s.key for s in OPTIONS.values() if s.key]
        assert all(s.flag or s.key for s in OPTIONS.values())
        assert len(flags) == len(set(flags))
        assert len(keys) == len(set(keys))

    def test_the_only_fields_without_an_option_are_set_by_code(self) -> None:
        set_by_code = {"pod_resources_optional", "max_workers", "sim_home"}
        assert set(Config.__dataclass_fields__) - set(OPTIONS) == set_by_code

    def test_the_parser_has_exactly_the_declared_flags(self) -> None:
        # --help and --version are actions (print, exit), not config values: no declaration, no file key
        actions = {"-h", "--help", "--version"}
        parsed = {o for action in build_parser()._actions for o in action.option_strings} - actions
        assert parsed == {s.flag for s in (*OPTIONS.values(), CONFIG_FILE) if s.flag}

    def test_the_config_file_accepts_exactly_the_declared_keys(self) -> None:
        assert file_keys() == {s.key: name for name, s in OPTIONS.items() if s.key}
        assert "version" not in file_keys()


class TestDefaults:
    @pytest.mark.parametrize(("name", "spec"), SHOWN, ids=[name for name, _ in SHOWN])
    def test_the_default_help_and_docs_show_is_the_default_one_gets(self, name: str, spec: Option) -> None:
        assert spec.flag is not None
        config = load_config([spec.flag, shown_default(name, spec)])
        assert getattr(config, name) == getattr(Config(), name)
        assert config == Config()

    def test_no_value_at_all_is_the_production_default(self) -> None:
        assert validate({}) == Config()


class TestRules:
    @pytest.mark.parametrize("name", list(OPTIONS))
    def test_a_value_of_the_wrong_type_is_one_config_error_naming_the_option(self, name: str) -> None:
        spec = OPTIONS[name]
        with pytest.raises(ConfigError, match=f"^{spec.label}[ :]"):
            validate({name: object()})

    @pytest.mark.parametrize(("name", "spec"), SHOWN, ids=[name for name, _ in SHOWN])
    def test_a_flag_and_its_file_key_give_the_same_value(
        self, name: str, spec: Option, tmp_path: Path
    ) -> None:
        value = shown_default(name, spec)
        assert spec.key is not None
        path = tmp_path / "eerld.toml"
        path.write_text(f"{spec.key} = {_toml(value)}\n")
        path.chmod(0o644)
        assert spec.flag is not None
        from_file = load_config(["--config", str(path)])
        assert getattr(from_file, name) == getattr(load_config([spec.flag, value]), name)


def _toml(text: str) -> str:
    try:
        float(text)
    except ValueError:
        return f'"{text}"'
    return text


class TestDocs:
    def test_the_table_in_docs_operations_md_is_fresh(self) -> None:
        """docs/operations.md's command line and options are what scripts/gen_options_doc.py writes."""
        result = subprocess.run(
            [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stderr

    def test_a_page_whose_table_differs_from_the_declarations_is_stale(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        script = gen_options_doc()
        page = (ROOT / "docs" / "operations.md").read_text()
        stale = tmp_path / "operations.md"
        row = "| `--backend` | `backend` | `nvml` |"
        assert row in page
        stale.write_text(page.replace(row, "| `--backend` | `backend` | `sim` |"))
        monkeypatch.setattr(script, "DOC", stale)
        assert script.main(["--check"]) == 1
        assert script.main([]) == 0
        assert stale.read_text() == page

    def test_every_option_has_one_row(self) -> None:
        table = gen_options_doc().generated()
        for spec in (*OPTIONS.values(), CONFIG_FILE):
            cells = f"| {f'`{spec.flag}`' if spec.flag else '—'} | {f'`{spec.key}`' if spec.key else '—'} |"
            assert table.count(cells) == 1, cells
