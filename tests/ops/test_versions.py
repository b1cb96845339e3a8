"""Every console command answers ``--version`` with one line: its name and its distribution's version."""

from __future__ import annotations

import importlib
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECTS = (ROOT / "pyproject.toml", ROOT / "client" / "pyproject.toml", ROOT / "sim" / "pyproject.toml")


def _commands() -> list[tuple[str, str, str]]:
    """(command, entry point, distribution) for every [project.scripts] entry of the three distributions."""
    out = []
    for path in PYPROJECTS:
        project = tomllib.loads(path.read_text())["project"]
        out += [(name, target, project["name"]) for name, target in project["scripts"].items()]
    return out


COMMANDS = _commands()


def test_the_seven_commands_are_all_here() -> None:
    names = {name for name, _, _ in COMMANDS}
    assert names == {"eerld", "eerlctl", "eerl", "eerl-sidecar", "eerl-bench", "eerl-csi", "eerl-cdi"}


@pytest.mark.parametrize(("command", "target", "dist"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_version_prints_one_line_and_exits_0(
    command: str, target: str, dist: str, capsys: pytest.CaptureFixture[str]
) -> None:
    module, _, func = target.partition(":")
    main = getattr(importlib.import_module(module), func)
    try:
        code = main(["--version"])
    except SystemExit as e:  # argparse's version action exits
        code = e.code
    assert code in (0, None)
    captured = capsys.readouterr()
    assert captured.out == f"{command} {version(dist)}\n"
    assert captured.err == ""
