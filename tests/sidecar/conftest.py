"""Fixtures for the sidecar tests: eerld on the sim backend and ``eerl-sidecar``, each a real process."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from eerl.link.sidecar import SidecarHttp
from eerl.sidecar._address import parse_address
from eerl.v1 import eerl_pb2

from soak.daemon import DaemonProcess, stop_process
from tests.conftest import short_socket_dir

JOB_SH = Path(__file__).with_name("job.sh")
START_TIMEOUT_S = 30.0
GENERATION_MHZ = 1200
TRAINING_MHZ = 1500


def wait_until(what: str, check: Callable[[], Any], timeout_s: float = START_TIMEOUT_S) -> Any:
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        result = check()
        if result:
            return result
        time.sleep(0.02)
    pytest.fail(f"{what}: not within {timeout_s:g} s")


@dataclass
class SimEerld(DaemonProcess):
    """``eerld --backend sim`` in its own process (:class:`soak.daemon.DaemonProcess`): two GPUs in real time,
    the fixed controller (1200 / 1500 MHz), no metrics endpoint (several daemons at once in
    test_multinode.py)."""

    gpus: int = 2
    sim_speedup: float = 1.0
    fixed_clocks: str = f"generation={GENERATION_MHZ},training={TRAINING_MHZ}"

    def session_of(self, job_id: str) -> eerl_pb2.SessionInfo | None:
        for session in self.status(timeout_s=5).sessions:
            if session.job_id == job_id:
                return session
        return None

    def metered(self, job_id: str) -> dict[str, int]:
        """Phases metered per kind for the session of ``job_id`` (empty if it has none)."""
        session = self.session_of(job_id)
        if session is None:
            return {}
        return {eerl_pb2.PhaseKind.Name(p.kind): p.phases for p in session.phases}

    def locks(self) -> list[int | None]:
        """Each GPU's SM clock lock (None: the default governor)."""
        return [
            gpu.locked_sm_clock_mhz if gpu.HasField("locked_sm_clock_mhz") else None
            for gpu in self.status(timeout_s=5).gpus
        ]


@pytest.fixture(scope="module")
def eerld_sim() -> Iterator[SimEerld]:
    """One sim eerld for a test module (each test uses its own job id)."""
    with short_socket_dir("eerl-sc-") as directory, SimEerld(directory) as daemon:
        yield daemon


class SidecarProcess:
    """``python -m eerl.sidecar.server ...`` (what ``eerl-sidecar`` runs), started and read to its URL.

    Its requests go through the product's client (:class:`SidecarHttp`: a Unix socket's owner checked, a TCP
    sidecar's secret sent from ``--token-file`` when the args name one).
    """

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        command = [sys.executable, "-m", "eerl.sidecar.server", *args]
        environment = {**os.environ, **(env or {})}
        for name in ("EERL_SIDECAR", "EERL_SIDECAR_TOKEN", "EERL_SIDECAR_TOKEN_FILE", "XDG_RUNTIME_DIR"):
            if env is None or name not in env:
                environment.pop(name, None)
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by the fixture
        self.process: subprocess.Popen[bytes] = subprocess.Popen(
            command, env=environment, stdout=subprocess.PIPE, stderr=self.log
        )
        self.url = self._read_url()
        self.token: str | None = None
        self.token_file: Path | None = None
        if "--token-file" in args:
            self.token_file = Path(args[args.index("--token-file") + 1])
            self.token = self.token_file.read_text().strip()
        self._http: SidecarHttp | None = None

    def _read_url(self) -> str:
        assert self.process.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(self.process.stdout, selectors.EVENT_READ)
        line = b""
        deadline_s = time.monotonic() + START_TIMEOUT_S
        while not line.endswith(b"\n") and time.monotonic() < deadline_s:
            if selector.select(timeout=0.1):
                chunk = os.read(self.process.stdout.fileno(), 1)
                if not chunk:
                    break
                line += chunk
        selector.close()
        text = line.decode().strip()
        if not text.startswith("eerl-sidecar: listening on "):
            self.kill()
            pytest.fail(f"the sidecar did not start ({text!r}):\n{self.stderr()[-3000:]}")
        return text.removeprefix("eerl-sidecar: listening on ")

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, Any]]:
        """One request on a connection of its own (the answer's status and JSON)."""
        client = SidecarHttp(parse_address(self.url), 10, token=self.token)
        try:
            return client.request(method, path, body)
        finally:
            client.close()

    def connect(self, timeout_s: float = 10) -> socket.socket:
        """A raw connection to the sidecar (its Unix socket or TCP port), for requests written by hand."""
        address = parse_address(self.url)
        if address.path:
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            raw.settimeout(timeout_s)
            raw.connect(address.path)
            return raw
        return socket.create_connection((address.host, address.port), timeout=timeout_s)

    def post(self, path: str, value: object) -> tuple[int, dict[str, Any]]:
        return self.request("POST", path, json.dumps(value).encode())

    def status(self) -> dict[str, Any]:
        code, body = self.request("GET", "/v1/status")
        assert code == 200
        return body

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._close()

    def stop(self) -> None:
        stop_process(self.process)
        self._close()

    def _close(self) -> None:
        if self.process.stdout is not None and not self.process.stdout.closed:
            self.process.stdout.close()


@pytest.fixture
def start_sidecar() -> Iterator[Callable[..., SidecarProcess]]:
    """Starts sidecars, each with ``TMPDIR`` a short directory of the test's (where a sidecar without
    ``--listen`` makes its private directory); a TCP ``--listen`` without ``-- command`` gets a
    ``--token-file`` there. Stops (SIGTERM) whatever is still running at the end."""
    started: list[SidecarProcess] = []
    with short_socket_dir("eerl-sct-") as tmp:

        def start(*args: str, env: dict[str, str] | None = None) -> SidecarProcess:
            flags = list(args)
            listen = flags[flags.index("--listen") + 1] if "--listen" in flags else "unix:"
            if not listen.startswith("unix:") and "--token-file" not in flags and "--" not in flags:
                flags += ["--token-file", str(tmp / f"token-{len(started)}")]
            sidecar = SidecarProcess(flags, {"TMPDIR": str(tmp), **(env or {})})
            started.append(sidecar)
            return sidecar

        yield start
        for sidecar in started:
            sidecar.stop()
            sidecar.log.close()


def sidecar_for(
    start: Callable[..., SidecarProcess],
    socket_path: Path,
    job_id: str,
    *extra: str,
    gpus: str = "0,1",
    listen: str | None = None,
    env: dict[str, str] | None = None,
) -> SidecarProcess:
    """A sidecar (started by ``start``, the :func:`start_sidecar` fixture) holding ``job_id``'s session on
    ``gpus`` of the daemon at ``socket_path``, listening on ``listen`` (None: the default, a private Unix
    socket under the fixture's own ``TMPDIR``); ``extra`` flags after those."""
    args = ["--job-id", job_id, "--gpus", gpus, "--socket", str(socket_path)]
    if listen is not None:
        args += ["--listen", listen]
    return start(*args, *extra, env=env)


@pytest.fixture
def curl() -> str:
    """The curl job.sh calls; without one the test fails saying so (it never skips)."""
    path = shutil.which("curl")
    if path is None:
        pytest.fail("tests/sidecar/job.sh needs curl on PATH (apt-get install curl)")
    return path


def start_job(url: str, *, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Starts tests/sidecar/job.sh with ``EERL_SIDECAR=url``; read it with ``communicate``."""
    environment = {**os.environ, "EERL_SIDECAR": url, **(env or {})}
    return subprocess.Popen(
        ["bash", str(JOB_SH)], env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def run_job(url: str, *, env: dict[str, str] | None = None) -> tuple[list[Call], bool, int]:
    """Runs job.sh to its end: its calls, whether it finished, its exit status."""
    proc = start_job(url, env=env)
    out, _ = proc.communicate(timeout=120)
    calls, finished = parse_job_output(out)
    return calls, finished, proc.returncode


@dataclass(frozen=True)
class Call:
    """One line of job.sh's output."""

    edge: str
    kind: str
    iteration: int
    code: int
    seconds: float
    answer: dict[str, Any]


def parse_job_output(text: str) -> tuple[list[Call], bool]:
    """The calls job.sh made, and whether it reached its end."""
    calls: list[Call] = []
    finished = False
    for line in text.splitlines():
        if line.startswith("done "):
            finished = True
            continue
        edge, kind, iteration, code, seconds, *rest = line.split(" ", 5)
        answer_text = rest[0] if rest else ""
        answer = json.loads(answer_text) if answer_text.strip() else {}
        calls.append(Call(edge, kind, int(iteration), int(code), float(seconds), answer))
    return calls, finished
