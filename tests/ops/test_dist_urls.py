"""scripts/dist.py's URL table: added to a staged copy's pyproject only, refused when malformed or twice."""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("eerl_dist_script", ROOT / "scripts" / "dist.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


dist = _load()


def test_no_urls_leaves_the_pyproject_as_it_is() -> None:
    text = (ROOT / "client" / "pyproject.toml").read_text()
    assert dist.with_urls(text, []) == text
    assert "urls" not in tomllib.loads(text)["project"], "the checkout names no URL (no public home yet)"


def test_urls_become_the_project_urls_table() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    urls = [("Homepage", "https://example.org/eerl"), ("Issues", "https://example.org/eerl/issues")]
    project = tomllib.loads(dist.with_urls(text, urls))["project"]
    assert project["urls"] == dict(urls)
    assert project["name"] == "eerld"


def test_urls_set_twice_are_refused() -> None:
    text = dist.with_urls('[project]\nname = "x"\n', [("Homepage", "https://a.example")])
    with pytest.raises(ValueError, match="already has"):
        dist.with_urls(text, [("Source", "https://b.example")])


@pytest.mark.parametrize(
    "bad", ["Homepage", "=https://a.example", "Homepage=ftp://a.example", "Home=a.example"]
)
def test_a_malformed_url_argument_is_refused(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected NAME=https"):
        dist.parse_url(bad)


def test_the_staged_copy_gets_the_urls_and_the_checkout_does_not(tmp_path: Path) -> None:
    before = (ROOT / "sim" / "pyproject.toml").read_text()
    staged = dist.stage(ROOT / "sim", tmp_path / "sim", [("Homepage", "https://example.org/eerl")])
    assert tomllib.loads((staged / "pyproject.toml").read_text())["project"]["urls"] == {
        "Homepage": "https://example.org/eerl"
    }
    assert (staged / "eerl_sim" / "physics.py").is_file()
    assert not list(staged.rglob("__pycache__"))
    assert (ROOT / "sim" / "pyproject.toml").read_text() == before
