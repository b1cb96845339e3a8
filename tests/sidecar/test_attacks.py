"""The sidecar's API attacked by another local user (``nobody``, a real process over the real sockets).

The sidecar steers its job's GPUs (it picks among the clocks the controller tries on them) and shows the job's
energy, so it belongs to the job's user (docs/security.md, "The sidecar"). Each attack here was made on the
sidecar of 2026-12-04 (``8d164c6``), whose default API was ``http://127.0.0.1:9479`` with no owner: there the
neighbour read the job's status, steered its phases, pushed its iteration counter and made 27–31 of the job's
100 events answer 503 by holding 40 connections; a socket planted at the job's path took its events.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from eerl.link.sidecar import SidecarHttp, SidecarUnreachable
from eerl.sidecar._address import parse_address

from tests.sidecar.conftest import SidecarProcess, SimEerld, sidecar_for, wait_until

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
STATUS = b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n"


def post(edge: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return b"POST /v1/phases/%s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
        edge.encode(),
        len(data),
        data,
    )


STEERING = [
    post("begin", {"kind": "generation", "iteration": 10**9}),  # jump the job's counter ahead
    post("end", {"kind": "generation", "iteration": 10**9, "tokens": 10**11}),  # made-up work
]


class Attacker:
    """A running ``tests.sidecar._http_attacker`` (``nobody``): its first report, then its last."""

    def __init__(self, proc: subprocess.Popen[str], report: dict[str, Any]) -> None:
        self.proc = proc
        self.report = report
        self.final: dict[str, Any] = {}


@contextmanager
def attacker(**spec: Any) -> Iterator[Attacker]:
    """Runs :mod:`tests.sidecar._http_attacker` as ``nobody`` with ``spec``; it holds its connections and its
    socket until the block ends, then :attr:`Attacker.final` says what it received. ``requests``: bytes."""
    if "requests" in spec:
        spec["requests"] = [r.decode("latin-1") for r in spec["requests"]]
    with subprocess.Popen(
        [sys.executable, "-m", "tests.sidecar._http_attacker"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        line = ""
        try:
            proc.stdin.write(json.dumps(spec) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            if not line:
                proc.wait(timeout=30)
                raise AssertionError(f"the attacker failed ({proc.returncode}): {proc.stderr.read()[-2000:]}")
            running = Attacker(proc, json.loads(line))
            assert running.report["euid"] == NOBODY
            yield running
        finally:
            proc.stdin.close()
            last = proc.stdout.readline() if line else ""
            proc.wait(timeout=60)
        running.final = json.loads(last) if last else {}


def owner_state(sidecar: SidecarProcess) -> tuple[Any, ...]:
    """What an attack could change on the sidecar."""
    status = sidecar.status()
    open_phases = [(p["kind"], p["iteration"]) for p in status["open_phases"]]
    return (open_phases, status["phases"], status["client"]["sent_events"])


def hundred_events(sidecar: SidecarProcess, first_iteration: int = 0) -> list[int]:
    """The job's 100 events (50 generation phases), on one kept-alive connection; their status codes."""
    client = SidecarHttp(parse_address(sidecar.url), 10, token=sidecar.token)
    codes: list[int] = []
    try:
        for i in range(first_iteration, first_iteration + 50):
            for edge, body in (
                ("begin", {"kind": "generation", "iteration": i}),
                ("end", {"kind": "generation", "iteration": i, "tokens": 100, "sequences": 1}),
            ):
                try:
                    codes.append(client.request("POST", f"/v1/phases/{edge}", body)[0])
                except SidecarUnreachable:
                    codes.append(0)  # no answer at all
    finally:
        client.close()
    return codes


class TestTheDefaultAddress:
    def test_is_a_unix_socket_of_the_job_s_user_in_a_directory_nobody_else_may_enter(
        self, eerld_sim: SimEerld, start_sidecar: Callable[..., SidecarProcess]
    ) -> None:
        sidecar = sidecar_for(start_sidecar, eerld_sim.socket_path, "default-owner")
        path = Path(parse_address(sidecar.url).path)
        assert path.name == "sidecar-default-owner.sock"
        directory = os.lstat(path.parent)
        assert stat.S_ISDIR(directory.st_mode)
        assert (stat.S_IMODE(directory.st_mode), directory.st_uid) == (0o700, os.geteuid())
        sock = os.lstat(path)
        assert stat.S_ISSOCK(sock.st_mode)
        assert (stat.S_IMODE(sock.st_mode), sock.st_uid) == (0o600, os.geteuid())

    def test_another_user_can_neither_read_nor_steer_nor_crowd_out_the_job(
        self, eerld_sim: SimEerld, start_sidecar: Callable[..., SidecarProcess]
    ) -> None:
        # Before: on 127.0.0.1:9479 bob read alice's status, committed her GPUs by made-up phases, jumped her
        # iteration counter, and 27-31 of her 100 events got a 503 while he held 40 connections.
        sidecar = sidecar_for(start_sidecar, eerld_sim.socket_path, "default-victim")
        wait_until("the sidecar's session", lambda: sidecar.status()["connected"])
        before = owner_state(sidecar)
        with attacker(target=sidecar.url, requests=[STATUS, HEALTHZ, *STEERING]) as refused:
            assert refused.report["results"] == ["PermissionError"] * 4
        with attacker(target=sidecar.url, hold=40) as crowd:  # not even one connection held
            assert (crowd.report["held"], crowd.report["hold_errors"]) == (0, ["PermissionError"])
            assert hundred_events(sidecar) == [200] * 100
        assert owner_state(sidecar)[0] == before[0]  # nothing the refused attacker sent got in
        assert eerld_sim.metered("default-victim")["PHASE_KIND_GENERATION"] == 50


class TestTheServersOwnCheck:
    def test_a_peer_of_another_user_is_refused_by_its_kernel_credentials_even_where_the_mode_lets_it_in(
        self, eerld_sim: SimEerld, start_sidecar: Callable[..., SidecarProcess], sock_dir: Path
    ) -> None:
        # The socket's mode is only the first wall: chmod 0666 after the start (an operator's mistake, a
        # shared volume) lets nobody connect, and the sidecar still turns the peer away by its uid.
        sock_dir.chmod(0o755)
        path = sock_dir / "private.sock"
        sidecar = sidecar_for(start_sidecar, eerld_sim.socket_path, "peer-check", listen=f"unix:{path}")
        path.chmod(0o666)
        before = owner_state(sidecar)
        with attacker(target=sidecar.url, requests=[STATUS, *STEERING]) as refused:
            assert refused.report["results"] == [403, 403, 403]
        assert owner_state(sidecar) == before
        assert sidecar.status()["refused_requests"] == 0

    def test_a_socket_shared_by_its_mode_on_purpose_admits_the_users_it_names(
        self, eerld_sim: SimEerld, start_sidecar: Callable[..., SidecarProcess], sock_dir: Path
    ) -> None:
        # The control: --socket-mode 0666 is the owner's own choice, and the same request gets in.
        sock_dir.chmod(0o755)
        path = sock_dir / "shared.sock"
        sidecar = sidecar_for(
            start_sidecar, eerld_sim.socket_path, "shared", "--socket-mode", "0666", listen=f"unix:{path}"
        )
        with attacker(target=sidecar.url, requests=[HEALTHZ]) as admitted:
            assert admitted.report["results"] == [200]


class TestTcpDemandsASecret:
    def test_without_the_secret_another_user_reads_nothing_and_steers_nothing(
        self, eerld_sim: SimEerld, start_sidecar: Callable[..., SidecarProcess]
    ) -> None:
        sidecar = sidecar_for(start_sidecar, eerld_sim.socket_path, "tcp-victim", listen="127.0.0.1:0")
        assert sidecar.token is not None
        wait_until("the sidecar's session", lambda: sidecar.status()["connected"])
        token_file = sidecar.token_file
        assert token_file is not None
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        before = owner_state(sidecar)
        wrong = b"GET /v1/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer guess\r\n\r\n"
        target = sidecar.url.removeprefix("http://")
        with attacker(target=target, requests=[STATUS, wrong, *STEERING, HEALTHZ]) as refused:
            assert refused.report["results"] == [401, 401, 401, 401, 200]  # /healthz alone is open
        assert owner_state(sidecar) == before
        assert hundred_events(sidecar) == [200] * 100

    def test_a_flood_of_slow_connections_from_another_user_never_turns_the_job_away(
        self, eerld_sim: SimEerld, start_sidecar: Callable[..., SidecarProcess]
    ) -> None:
        # Before: 40 held connections (the bound was 16) gave 27-31 of 100 events a 503. Now strangers have a
        # table of their own whose oldest makes room for a newcomer, so the attacker holds 600 (more than the
        # table) and opens one again each time one is closed.
        sidecar = sidecar_for(start_sidecar, eerld_sim.socket_path, "tcp-flood", listen="127.0.0.1:0")
        wait_until("the sidecar's session", lambda: sidecar.status()["connected"])
        target = sidecar.url.removeprefix("http://")
        with attacker(target=target, hold=600, keep_holding=True) as flood:
            assert flood.report["held"] == 600, flood.report
            codes = hundred_events(sidecar)
        assert codes == [200] * 100
        assert flood.final["reopened"] > 0  # the sidecar did close the attacker's connections
        assert eerld_sim.metered("tcp-flood")["PHASE_KIND_GENERATION"] == 50


class TestAPlantedSocket:
    @pytest.fixture
    def planted(self, sock_dir: Path) -> Iterator[tuple[Path, Attacker]]:
        """``nobody`` listening first at the path a recipe names, in a world-writable sticky directory."""
        sock_dir.chmod(0o1777)
        path = sock_dir / "eerl-job.sock"
        with attacker(listen=str(path)) as bob:
            assert bob.report["listening"]
            yield path, bob

    def test_the_job_s_sidecar_refuses_the_path_and_says_who_took_it(
        self, planted: tuple[Path, Attacker]
    ) -> None:
        path, _ = planted
        done = subprocess.run(
            [sys.executable, "-m", "eerl.sidecar.server", "--job-id", "j", "--gpus", "0", "--socket",
             "/nonexistent", "--listen", f"unix:{path}"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 1
        assert f"is a socket of uid {NOBODY}, not yours: another user took the path first" in done.stderr
        assert stat.S_ISSOCK(os.lstat(path).st_mode)  # bob's socket: not removed, not used

    def test_eerl_phase_sends_nothing_to_another_user_s_socket_and_says_so(
        self, planted: tuple[Path, Attacker]
    ) -> None:
        # Before: alice's `eerl phase` calls went to bob, who answered "locked": eerl was silently off.
        path, bob = planted
        env = {**os.environ, "EERL_SIDECAR": f"unix:{path}"}
        begin = [sys.executable, "-m", "eerl.cli", "phase", "begin", "generation", "--iteration", "0"]
        results = [
            subprocess.run(
                [*begin, *strict],
                env=env, capture_output=True, text=True, timeout=60, check=False,
            )
            for strict in ([], ["--strict"])
        ]  # fmt: skip
        assert [r.returncode for r in results] == [0, 1]  # fail-open, unless told to be strict
        for result in results:
            assert f"is served by uid {NOBODY}, not by this job's user" in result.stderr
            assert result.stderr.count("\n") == 1
        bob.proc.stdin.close()  # type: ignore[union-attr]
        bob.final = json.loads(bob.proc.stdout.readline())  # type: ignore[union-attr]
        assert bob.final["received"] == []

    def test_the_python_client_sends_nothing_there_and_warns_once(
        self, planted: tuple[Path, Attacker]
    ) -> None:
        path, bob = planted
        script = (
            "import dataclasses, json, eerl\n"
            "s = eerl.connect(job_id='alice')\n"
            "for i in range(5):\n"
            "    with s.phase('generation', i):\n"
            "        pass\n"
            "s.flush(2)\n"
            "print(json.dumps(dataclasses.asdict(s.stats())))\n"
            "s.close()\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "EERL_SIDECAR": f"unix:{path}"},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["sent_events"] == 0
        assert done.stderr.count(f"is served by uid {NOBODY}") == 1
        bob.proc.stdin.close()  # type: ignore[union-attr]
        bob.final = json.loads(bob.proc.stdout.readline())  # type: ignore[union-attr]
        assert bob.final["received"] == []

    def test_a_private_directory_taken_first_is_refused_and_the_prolog_s_job_directory_cannot_be(
        self, eerld_sim: SimEerld, start_sidecar: Callable[..., SidecarProcess], sock_dir: Path
    ) -> None:
        # bob makes <tmp>/eerl-<alice's uid> before alice's first sidecar: it is his, so it is not used.
        sock_dir.chmod(0o1777)
        taken = sock_dir / f"eerl-{os.geteuid()}"
        with attacker(mkdir=[str(taken)]) as bob:
            assert bob.report["made"] == [str(taken)]
        env = {**os.environ, "TMPDIR": str(sock_dir), "EERL_JOB_ID": "slurm-7"}
        env.pop("XDG_RUNTIME_DIR", None)
        env["EERL_JOBS_DIR"] = str(sock_dir / "jobs")
        done = subprocess.run(
            [sys.executable, "-m", "eerl.sidecar.server", "--gpus", "0", "--socket", "/nonexistent"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 1
        assert f"belongs to uid {NOBODY}, not to you" in done.stderr
        # The Slurm prolog (root) makes $EERL_JOBS_DIR/<job id>, the job's user's, in root's directory:
        # nobody else can make it first, and the sidecar and `eerl phase` find it there by the job id.
        jobs = sock_dir / "jobs"
        jobs.mkdir(mode=0o755)
        (jobs / "slurm-7").mkdir(mode=0o700)
        sidecar = start_sidecar(
            "--gpus",
            "0",
            "--socket",
            str(eerld_sim.socket_path),
            env={k: env[k] for k in ("TMPDIR", "EERL_JOB_ID", "EERL_JOBS_DIR")},
        )
        assert sidecar.url == f"unix:{jobs / 'slurm-7' / 'sidecar.sock'}"
        found = subprocess.run(
            [sys.executable, "-m", "eerl.cli", "status", "--json", "--strict"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert found.returncode == 0, found.stderr
        assert json.loads(found.stdout)["job_id"] == "slurm-7"


class TestMalformedAndSlowRequests:
    def test_junk_oversized_and_stalled_requests_get_an_answer_or_a_close_and_change_nothing(
        self, eerld_sim: SimEerld, start_sidecar: Callable[..., SidecarProcess]
    ) -> None:
        sidecar = sidecar_for(start_sidecar, eerld_sim.socket_path, "junk", listen="127.0.0.1:0")
        wait_until("the sidecar's session", lambda: sidecar.status()["connected"])
        assert sidecar.post("/v1/phases/begin", {"kind": "generation", "iteration": 4})[0] == 200
        before = owner_state(sidecar)
        junk = [
            b"GET / NOT-HTTP\r\n\r\n",
            b"\x00\xff / HTTP/1.1\r\n\r\n",
            b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",  # a head beyond 16 KiB
            b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: b\r\n" % i for i in range(100)) + b"\r\n",
            b"POST /v1/phases/begin HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n",
            b"POST /v1/phases/begin HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
            b"POST /v1/phases/begin HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"DELETE /v1/status HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b'POST /v1/phases/end HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"kind"',  # stalls
        ]
        target = sidecar.url.removeprefix("http://")
        with attacker(target=target, requests=junk) as attack:
            # The stalled body is cut off at the head timeout (5 s): a close with no answer, no slot held.
            assert attack.report["results"] == [400, 400, 431, 431, 413, 400, 411, 501, 400, "no reply"]
        assert owner_state(sidecar) == before
        code, ended = sidecar.post("/v1/phases/end", {"kind": "generation", "iteration": 4, "tokens": 7})
        assert (code, ended["metered"]) == (200, True)
