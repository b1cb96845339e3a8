"""tests/frameworks: the hooks against the real, installed releases of verl, OpenRLHF, TRL and SkyRL, and
against the source of NeMo-RL and slime at one commit each (not on the package index: sources/).

Each framework's tests run in an environment of their own (``make test-frameworks`` builds one per pinned
release under .venv-fw/ and runs ``pytest -m frameworks`` there with ``EERL_FRAMEWORK`` set; the source-only
frameworks run in the main venv with ``EERL_FRAMEWORK_COMMIT`` too): a module here is collected only when
``EERL_FRAMEWORK`` names its framework, so the main suite never imports them, and in its own environment a
missing framework is an import error, never a skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from eerl._tally import WorkloadTally
from eerl.phases import ControllerState, PhaseKind

FRAMEWORK = os.environ.get("EERL_FRAMEWORK", "")
_MODULES = {
    "test_verl.py": "verl",
    "test_openrlhf.py": "openrlhf",
    "test_trl.py": "trl",
    "test_skyrl.py": "skyrl",
    "test_nemo_rl.py": "nemo_rl",
    "test_slime.py": "slime",
}
SOURCES = Path(__file__).parent / "sources"
"""Excerpts of the frameworks that are not on the package index (NeMo-RL, slime), cut by sources/vendor.py."""


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    framework = _MODULES.get(collection_path.name)
    if framework is None:
        return None
    return framework != FRAMEWORK


def pytest_configure(config: pytest.Config) -> None:
    """The frameworks warn about themselves at import (Ray's deprecated state API, megatron missing, …):
    not ours to fail on. The hooks' own warning stays an error unless a test expects it."""
    if FRAMEWORK:
        for line in (
            "ignore::DeprecationWarning",
            "ignore::FutureWarning",
            "ignore::UserWarning",
            "error::eerl.integrations.HookWarning",
        ):
            config.addinivalue_line("filterwarnings", line)


def pytest_report_header(config: pytest.Config) -> list[str]:
    if not FRAMEWORK:
        return []
    commit = os.environ.get("EERL_FRAMEWORK_COMMIT")
    if commit:
        return [f"eerl frameworks: testing {FRAMEWORK} source at commit {commit} (stand-ins shaped from it)"]
    versions = ", ".join(f"{name} {_version(name)}" for name in (FRAMEWORK, "torch", "transformers", "ray"))
    return [f"eerl frameworks: testing {versions}"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/frameworks" in str(item.path):
            item.add_marker(pytest.mark.frameworks)
    # verl's v1 trainer first shipped in 0.9: on 0.8 its tests are deselected (not skipped), and
    # test_v1_is_absent_before_0_9 checks that it is indeed absent.
    if FRAMEWORK == "verl" and not _at_least(_version("verl"), (0, 9)):
        kept = [item for item in items if "TestV1Trainer" not in item.nodeid]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept
    # TRL 1.15's GRPO loss needs Triton, which CPU torch lacks: its end-to-end runs are deselected, and
    # test_before_1_16_grpos_loss_needs_triton_so_the_end_to_end_run_is_16_only checks that reason.
    if FRAMEWORK == "trl" and not _at_least(_version("trl"), (1, 16)):
        kept = [item for item in items if "test_end_to_end" not in item.nodeid]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


def _at_least(version: str, minimum: tuple[int, int]) -> bool:
    try:
        return tuple(int(part) for part in version.split(".")[:2]) >= minimum
    except ValueError:
        return False


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


@pytest.fixture(scope="session")
def framework_version() -> str:
    """The installed release of the framework under test; it must be the one the Makefile pinned. For a
    framework tested against its source (``EERL_FRAMEWORK_COMMIT``), that commit."""
    commit = os.environ.get("EERL_FRAMEWORK_COMMIT")
    if commit:
        return commit
    version = _version(FRAMEWORK)
    expected = os.environ.get("EERL_FRAMEWORK_VERSION")
    if expected:
        assert version == expected, f"{FRAMEWORK} {version} installed, the Makefile pinned {expected}"
    return version


class Recorded(WorkloadTally):
    """One recorded phase: the client's own tally of what the hook reported (kind, iteration, workload)."""

    def __init__(self, kind: PhaseKind, iteration: int | None) -> None:
        super().__init__()
        self.kind = kind
        self.iteration = iteration

    def __enter__(self) -> Recorded:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class Recorder:
    """A PhaseSource that records each phase (kind, iteration, workload) in the order they began."""

    def __init__(self) -> None:
        self.phases: list[Recorded] = []

    def phase(self, kind: Any, iteration: int | None = None, **kwargs: Any) -> Recorded:
        recorded = Recorded(PhaseKind.parse(kind), iteration)
        self.phases.append(recorded)
        return recorded

    def kinds(self) -> list[tuple[PhaseKind, int | None]]:
        return [(p.kind, p.iteration) for p in self.phases]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def source_excerpt(framework: str, commit: str, path: str, name: str) -> str:
    """The excerpt of ``name`` in ``path`` of ``framework`` at ``commit`` (sources/vendor.py cut it); its
    header must name that commit."""
    excerpt = SOURCES / f"{framework}-{commit[:12]}__{path.replace('/', '__')}__{name}.py.txt"
    text = excerpt.read_text()
    header, _, body = text.partition("\n")
    assert f"@{commit}:{path} " in header, f"{excerpt.name} is not of {commit}"
    return body


GENERATION_MHZ, TRAINING_MHZ = 1200, 1500
"""The clocks the metering daemon's fixed controller sets for each phase kind."""


@pytest.fixture
def metering_daemon(sock_dir: Path) -> Iterator[Any]:
    """The real eerld on the sim backend (two GPUs), its fixed controller setting 1200 MHz for generation
    and 1500 MHz for training: a simulated job through a hook must be metered there, tokens and clock."""
    from tests.client.conftest import SimDaemon  # noqa: PLC0415 - the daemon loads only for these tests

    clocks = {PhaseKind.GENERATION: GENERATION_MHZ, PhaseKind.TRAINING: TRAINING_MHZ}
    daemon = SimDaemon(sock_dir, controller="fixed", fixed_clocks_mhz=clocks).start()
    yield daemon
    daemon.stop()


class SimWork:
    """GPU work on the committing daemon's simulated H100s: a stand-in runs a phase's work here, so its time
    and energy depend on the clock the daemon set, as a real rollout's and update's do."""

    KINDS = (PhaseKind.GENERATION, PhaseKind.TRAINING)

    GENERATION = (10.0, 0.3)
    """Compute (MHz·s) and memory-bound seconds of one rollout: memory-bound, as decoding is (a lower clock
    costs it little time and saves energy)."""
    TRAINING = (300.0, 0.02)
    """The same for one update: compute-bound (a lower clock costs it time; the controller may well keep
    the default)."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def run(self, kind: PhaseKind, gpus: tuple[int, ...] = (0,), share: float = 1.0) -> None:
        compute_mhz_s, memory_s = self.GENERATION if kind is PhaseKind.GENERATION else self.TRAINING
        for gpu in gpus:
            self.device.run_segments(gpu, [compute_mhz_s * share], [memory_s * share], 1.0)


@pytest.fixture
def committing_daemon(sock_dir: Path) -> Iterator[tuple[Any, SimWork]]:
    """The real eerld with its own controller (``eerl``) on two simulated H100s at 5× real time, and the
    work to run on them: a stand-in's phases take the time the clock gives them, so the controller explores
    and commits a clock per phase kind within a few dozen iterations."""
    from eerl_sim.gpu import create_sim_backend  # noqa: PLC0415 - the simulator loads only for these tests
    from eerl_sim.profiles import builtin_profile  # noqa: PLC0415

    from tests.client.conftest import SimDaemon  # noqa: PLC0415

    backend = create_sim_backend(builtin_profile("h100-sxm"), 2, speedup=2.0)
    daemon = SimDaemon(sock_dir, controller="eerl", backend=backend).start()
    yield daemon, SimWork(backend.device)
    daemon.stop()


def assert_commits(records: Sequence[Any]) -> dict[PhaseKind, int | None]:
    """The daemon's controller committed for both kinds, for a good part of the job (at least ten phases
    each; it may retune now and then). Returns the clock each kind committed at most often: usually a
    locked one for generation (memory-bound work) and the default governor (None) for training, but under
    load (a lock that lands late in a short phase) the choice varies, so the clock is not asserted."""
    clocks: dict[PhaseKind, int | None] = {}
    for kind in SimWork.KINDS:
        kind_records = [r for r in records if r.kind is kind]
        committed = [r.sm_clock_mhz for r in kind_records if r.state is ControllerState.COMMITTED]
        states = [(r.iteration, r.state.value, r.sm_clock_mhz) for r in kind_records]
        assert len(committed) >= 10, f"{kind.value}: {len(committed)} committed phases: {states}"
        clocks[kind] = max(set(committed), key=committed.count)
    return clocks
