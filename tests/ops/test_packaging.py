"""The wheels as the image installs them: built from the checkout, installed into a fresh venv at the versions
of constraints.txt without a package index, and run away from the checkout.

``docker build`` needs a Docker engine, which CI does not have; this test runs the image's steps with pip
instead (pinned build backend, ``pip install --no-index --find-links``). The dependency wheels are taken
once per version of constraints.txt into pytest's cache (from pip's cache or the index); later runs are
offline.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from eerl_sim.bench.cli import MISSING_EXTRA_ERROR

from eerld.app import SIM_MISSING_ERROR

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "constraints.txt"
PIP = (sys.executable, "-m", "pip", "--disable-pip-version-check")


def pip(*args: str | Path) -> None:
    """Run the test venv's pip; fail with its output (and what to do) when it fails."""
    done = subprocess.run([*PIP, *map(str, args)], check=False, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(
            f"pip {' '.join(map(str, args))} failed ({done.returncode}); if a dependency is missing from the "
            "wheelhouse, constraints.txt does not pin it: run `make constraints`.\n"
            f"{done.stdout}\n{done.stderr}"
        )


@pytest.fixture(scope="module")
def wheelhouse(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of every pinned distribution, and nothing else: what the image's build stage collects."""
    digest = hashlib.sha256(CONSTRAINTS.read_bytes()).hexdigest()[:16]
    cache = getattr(request.config, "cache", None)
    if cache is None:  # -p no:cacheprovider
        house = tmp_path_factory.mktemp("wheelhouse")
    else:
        house = Path(cache.mkdir(f"wheelhouse-{digest}"))
        for old in house.parent.glob("wheelhouse-*"):
            if old != house:
                shutil.rmtree(old, ignore_errors=True)
    if not (house / "complete").exists():
        pins = [line for line in CONSTRAINTS.read_text().splitlines() if line and not line.startswith("#")]
        pip("wheel", "--quiet", "--no-deps", "--wheel-dir", house, *pins)
        (house / "complete").write_text(digest + "\n")
    return house


@dataclass(frozen=True)
class Installed:
    """A fresh venv holding the wheels, and a directory outside the checkout to run its commands in."""

    venv: Path
    away: Path
    find_links: tuple[str, ...]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """One of the venv's commands, from ``away``, with no PYTHONPATH and nothing of the checkout."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_"))}
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
        env["MPLCONFIGDIR"] = str(self.away / ".matplotlib")
        command = [str(self.venv / "bin" / args[0]), *args[1:]]
        return subprocess.run(command, cwd=self.away, env=env, check=False, capture_output=True, text=True)

    def install(self, requirement: str) -> None:
        """``pip install --no-index`` from the wheels only, at the pinned versions, as the image does."""
        pip(
            "--python", self.venv / "bin" / "python", "install", "--quiet", "--no-index", *self.find_links,
            "--constraint", CONSTRAINTS, requirement,
        )  # fmt: skip


@pytest.fixture(scope="module")
def installed(wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """eerl-client, eerld and eerl-sim built with the pinned backend; eerld installed alone, no extras."""
    work = tmp_path_factory.mktemp("packaging")
    wheels = work / "wheels"
    # Build isolation takes hatchling and its dependencies from the wheelhouse: the pinned backend, offline.
    pip("wheel", "--quiet", "--no-deps", "--no-index", "--find-links", wheelhouse, "--wheel-dir", wheels,
        ROOT / "client", ROOT, ROOT / "sim")  # fmt: skip
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(work / "venv")], check=True)
    away = work / "away"
    away.mkdir()
    result = Installed(work / "venv", away, ("--find-links", str(wheelhouse), "--find-links", str(wheels)))
    result.install("eerld")
    return result


class TestInstalledWheels:
    """In file order (pytest's): the daemon alone first; then eerl-sim, then its bench extra, added to it."""

    def test_the_code_comes_from_the_venv_not_the_checkout(self, installed: Installed) -> None:
        """eerld and eerl import from the fresh venv's site-packages."""
        done = installed.run("python", "-c", "import eerl, eerld; print(eerl.__file__, eerld.__file__)")
        assert done.returncode == 0, done.stderr
        for path in done.stdout.split():
            assert Path(path).is_relative_to(installed.venv), path

    @pytest.mark.parametrize("command", ["eerld", "eerlctl", "eerl-sidecar", "eerl"])
    def test_the_commands_start(self, installed: Installed, command: str) -> None:
        """eerld, eerlctl, eerl-sidecar and eerl print their usage with --help."""
        done = installed.run(command, "--help")
        assert (done.returncode, done.stderr) == (0, "")
        assert done.stdout.startswith(f"usage: {command}")

    def test_the_daemons_wheel_holds_neither_the_simulator_nor_the_checkouts_tools(
        self, installed: Installed
    ) -> None:
        """eerl_sim (simulator and bench), demo, perf and soak are not in the daemon's wheel."""
        probe = (
            "import importlib.util as u; "
            "print([n for n in ('eerl_sim', 'demo', 'perf', 'soak') if u.find_spec(n)])"
        )
        done = installed.run("python", "-c", probe)
        assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr
        assert not (installed.venv / "bin" / "eerl-bench").exists()

    def test_backend_sim_without_eerl_sim_says_what_to_install(self, installed: Installed) -> None:
        """``eerld --backend sim`` on the daemon's wheel alone: one line naming eerl-sim, exit code 2."""
        away = installed.away
        done = installed.run(
            "eerld", "--backend=sim", f"--socket={away / 'w.sock'}", f"--admin-socket={away / 'a.sock'}",
            f"--state-dir={away / 'state'}", "--metrics-address=off",
        )  # fmt: skip
        assert (done.returncode, done.stdout, done.stderr) == (2, "", f"Error: {SIM_MISSING_ERROR}\n")

    def test_eerl_sim_installs_the_sim_backend_and_eerl_bench(self, installed: Installed) -> None:
        """With eerl-sim, the sim backend loads from its wheel (no checkout's tools in it either)."""
        installed.install("eerl-sim")
        probe = (
            "import importlib.util as u, eerl_sim.gpu as s; print(s.create_daemon_backend.__module__, "
            "[n for n in ('demo', 'perf', 'soak') if u.find_spec(n)])"
        )
        done = installed.run("python", "-c", probe)
        assert (done.returncode, done.stdout.strip()) == (0, "eerl_sim.gpu.backend []"), done.stderr

    def test_bench_without_its_extra_says_which_to_install(self, installed: Installed) -> None:
        """Without the bench extra, eerl-bench prints one line naming the extra and exits 2, no traceback."""
        done = installed.run("eerl-bench", "controller", "--scenario", "sync-h100", "--iterations", "20")
        assert (done.returncode, done.stdout, done.stderr) == (2, "", MISSING_EXTRA_ERROR + "\n")

    def test_bench_with_its_extra_runs_a_packaged_scenario(self, installed: Installed) -> None:
        """With eerl-sim[bench], eerl-bench finds sync-h100 inside the installed package and runs it."""
        installed.install("eerl-sim[bench]")
        done = installed.run("eerl-bench", "controller", "--scenario", "sync-h100", "--iterations", "20")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("scenario sync-h100, 20 iterations")
