"""``make dist``'s artifacts: each distribution's sdist, its wheel built from that sdist, complete metadata
for a package index, and ``twine check --strict`` passing (what PyPI would refuse or render badly fails)."""

from __future__ import annotations

import email
import subprocess
import sys
import tarfile
import zipfile
from email.message import Message
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTIONS = {"eerl_client": ROOT / "client", "eerld": ROOT, "eerl_sim": ROOT / "sim"}


URLS = {"Homepage": "https://example.org/eerl", "Source": "https://example.org/eerl/src"}
"""What a release names once the project has a public home (``make dist PROJECT_URLS=…``)."""


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What ``make dist PROJECT_URLS=…`` builds, into a temporary directory (the venv's pinned hatchling,
    no download)."""
    out = tmp_path_factory.mktemp("dist")
    urls = [f"--url={name}={url}" for name, url in URLS.items()]
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "dist.py"), "--outdir", str(out), *urls],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(archive.read(name))


def test_twine_check_strict_passes_on_every_artifact(dist: Path) -> None:
    artifacts = sorted(dist.iterdir())
    assert len(artifacts) == 6  # an sdist and a wheel of each
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, artifacts)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 6


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_the_metadata_is_complete_for_a_package_index(dist: Path, name: str) -> None:
    """A license (expression and file), classifiers, keywords, the Python it was tested on, and a
    description written for the index: markdown, and not the repository's README (which opens with
    ``make demo``, meaningless to someone who ran ``pip install``)."""
    meta = _metadata(next(dist.glob(f"{name}-*.whl")))
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["License-File"] == "LICENSE"
    assert "Programming Language :: Python :: 3.11" in meta.get_all("Classifier", [])
    assert "Operating System :: POSIX :: Linux" in meta.get_all("Classifier", [])
    assert meta["Keywords"]
    assert meta["Description-Content-Type"] == "text/markdown"
    description = meta.get_payload()
    assert isinstance(description, str)
    assert "make demo" not in description.split("\n\n", 2)[1]
    assert "pip install" in description
    assert sorted(meta.get_all("Project-URL", [])) == sorted(f"{name}, {url}" for name, url in URLS.items())


def test_the_daemon_s_sdist_holds_the_daemon_not_the_other_distributions_or_the_tests(dist: Path) -> None:
    with tarfile.open(next(dist.glob("eerld-*.tar.gz"))) as archive:
        tops = {Path(n).parts[1] for n in archive.getnames() if len(Path(n).parts) > 1}
    assert {"eerld", "eerlctl", "proto", "docs", "LICENSE", "pyproject.toml"} <= tops
    assert not tops & {"client", "sim", "tests", "demo", "perf", "soak", ".venv"}


MEASURED = {
    "eerl_sim/measured/" + name
    for name in (
        "__init__.py",
        "NOTICE.md",
        "LICENSE",
        "gpt3-175b+a100_sxm_bf16.csv",
        "bloom+a100_sxm_bf16.csv",
        "gpt3-175b+a40_bf16.csv",
        "bloom+a40_bf16.csv",
    )
}


def test_the_simulator_ships_the_measured_sweeps_with_their_attribution_and_license(dist: Path) -> None:
    """``eerl-bench calibration`` runs from the wheel: the data, its NOTICE and its license are in it, and in
    the sdist the wheel is built from."""
    with zipfile.ZipFile(next(dist.glob("eerl_sim-*.whl"))) as wheel:
        assert set(wheel.namelist()) >= MEASURED
    with tarfile.open(next(dist.glob("eerl_sim-*.tar.gz"))) as sdist:
        names = {"/".join(Path(n).parts[1:]) for n in sdist.getnames()}
    assert names >= MEASURED


def test_the_manifests_name_the_image_make_image_builds_and_no_registry_that_does_not_exist() -> None:
    """``make image`` tags ``eerld:<version>``; the manifests name exactly that (the docs say how to push it),
    never a public registry that holds no eerld image."""
    version = next(
        line.split('"')[1]
        for line in (ROOT / "pyproject.toml").read_text().splitlines()
        if line.startswith("version")
    )
    images = [
        line.split("image:", 1)[1].split("#")[0].strip()
        for path in (ROOT / "deploy" / "kubernetes").glob("*.yaml")
        for line in path.read_text().splitlines()
        if "image:" in line and "eerld" in line
    ]
    assert images
    assert set(images) == {f"eerld:{version}"}
    every = "".join(p.read_text() for p in (ROOT / "deploy").rglob("*.yaml"))
    assert "ghcr.io" not in every
