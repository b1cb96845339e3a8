"""``make dist``: the sdist and wheel of each distribution, with the project's URLs when it has a home.

The URLs are not in the pyproject files because the project has no public home yet, and naming an
invented one would send people to an address that does not exist. The day it has one, the release is
built with them::

    make dist PROJECT_URLS="Homepage=https://example.org/eerl Source=https://example.org/eerl/src"

Each distribution is copied (its tracked files) to a staging directory, the ``[project.urls]`` table is
added to the copy's pyproject.toml, and the copy is built with the venv's pinned hatchling (no download):
an sdist, then the wheel from that sdist, so that the sdist is complete. The checkout is never edited.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = (ROOT / "client", ROOT, ROOT / "sim")
_IGNORED = shutil.ignore_patterns(
    ".git", ".venv", ".venv-fw", "dist", "build", "__pycache__", "*.pyc", ".*cache"
)


def parse_url(text: str) -> tuple[str, str]:
    """``NAME=URL`` → (name, url); an http(s) URL only (PyPI shows them as links)."""
    name, sep, url = text.partition("=")
    if not sep or not name.strip() or not url.startswith(("https://", "http://")):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=https://…")
    return name.strip(), url.strip()


def with_urls(pyproject: str, urls: Sequence[tuple[str, str]]) -> str:
    """The pyproject text with a ``[project.urls]`` table (unchanged when ``urls`` is empty)."""
    if not urls:
        return pyproject
    if "urls" in tomllib.loads(pyproject).get("project", {}):
        raise ValueError("pyproject.toml already has [project.urls]: set them in one place")
    lines = "".join(f'"{name}" = "{url}"\n' for name, url in urls)
    text = pyproject if pyproject.endswith("\n") else pyproject + "\n"
    updated = f"{text}\n[project.urls]\n{lines}"
    tomllib.loads(updated)  # a name or URL that breaks the TOML fails here, not in the build
    return updated


def stage(source: Path, into: Path, urls: Sequence[tuple[str, str]]) -> Path:
    """A copy of the distribution at ``source`` (its git-tracked files where it is a checkout)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", "."], cwd=source, capture_output=True, check=False
    )  # fmt: skip
    if listed.returncode == 0 and listed.stdout:
        for name in filter(None, listed.stdout.decode().split("\0")):
            path = source / name
            if path.is_file():
                (into / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, into / name)
    else:
        shutil.copytree(source, into, ignore=_IGNORED, dirs_exist_ok=True)
    pyproject = into / "pyproject.toml"
    pyproject.write_text(with_urls(pyproject.read_text(encoding="utf-8"), urls), encoding="utf-8")
    return into


def build(outdir: Path, urls: Sequence[tuple[str, str]]) -> list[Path]:
    """Every distribution's sdist and wheel in ``outdir``; the artifacts."""
    outdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="eerl-dist-") as tmp:
        for index, source in enumerate(DISTRIBUTIONS):
            staged = stage(source, Path(tmp) / str(index), urls)
            subprocess.run(
                [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(outdir), str(staged)],
                check=True,
            )  # fmt: skip
    return sorted(p for p in outdir.iterdir() if p.suffix in (".whl", ".gz"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/dist.py", description=__doc__.split("\n")[0])
    parser.add_argument("--outdir", type=Path, default=ROOT / "dist")
    parser.add_argument("--url", type=parse_url, action="append", default=[], metavar="NAME=URL")
    args = parser.parse_args(argv)
    try:
        artifacts = build(args.outdir, args.url)
    except (ValueError, subprocess.CalledProcessError) as e:
        print(f"scripts/dist.py: {e}", file=sys.stderr)
        return 1
    if not args.url:
        print(
            "dist: built without project URLs (none is public yet); when there is one: "
            'make dist PROJECT_URLS="Homepage=https://… Source=https://…"'
        )
    print("dist:", " ".join(p.name for p in artifacts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
