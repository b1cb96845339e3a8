"""Deployment files: the systemd unit, Slurm scripts, Dockerfile and its constraints."""

from __future__ import annotations

import grp
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from eerld.config import load_config
from tests.ops.conftest import require_tool

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd/eerld.service"
SLURM = ROOT / "deploy/slurm"


def unit_lines() -> list[tuple[str, str]]:
    pairs = []
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";")):
            key, value = line.split("=", 1)
            pairs.append((key.strip(), value.strip()))
    return pairs


MAX_EXPOSURE = 2.5
SANDBOX_PROBE = """
import ctypes, errno, json, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
RW, RWX = mmap.PROT_READ | mmap.PROT_WRITE, mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC
def attempt(call):
    try:
        call()
    except OSError as e:
        return errno.errorcode[e.errno]
    return "ok"
def mprotect_rwx():
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=RW)
    if libc.mprotect(ctypes.addressof(ctypes.c_char.from_buffer(page)), mmap.PAGESIZE, RWX) != 0:
        raise OSError(ctypes.get_errno(), "mprotect")
print(json.dumps({
    "mmap rw": attempt(lambda: mmap.mmap(-1, mmap.PAGESIZE, prot=RW)),
    "mmap rwx": attempt(lambda: mmap.mmap(-1, mmap.PAGESIZE, prot=RWX)),
    "mprotect rwx": attempt(mprotect_rwx),
    "chroot": attempt(lambda: os.chroot("/")),
}))
"""
"""Tries what the unit allows and forbids; prints each outcome (``ok`` or the errno's name) as JSON."""


def exposure(unit_text: str) -> float:
    """The overall exposure ``systemd-analyze security --offline=yes`` gives the unit (lower is better)."""
    analyze = require_tool("systemd-analyze", "systemd")
    with tempfile.TemporaryDirectory() as tmp:
        unit = Path(tmp) / "eerld.service"
        unit.write_text(unit_text)
        done = subprocess.run(
            [analyze, "security", "--offline=yes", "--no-pager", str(unit)],
            check=False,
            capture_output=True,
            text=True,
        )
    found = re.search(r"Overall exposure level for eerld.service: (\d+\.\d+)", done.stdout + done.stderr)
    assert found, done.stdout + done.stderr
    return float(found.group(1))


class TestSystemdUnit:
    def test_systemd_analyze_verify_is_clean(self, tmp_path: Path) -> None:
        """systemd-analyze verify reports nothing (ExecStart pointed at a real executable)."""
        analyze = require_tool("systemd-analyze", "systemd")
        fake_eerld = tmp_path / "eerld"
        fake_eerld.write_text("#!/bin/sh\nexit 0\n")
        fake_eerld.chmod(0o755)
        unit = tmp_path / "eerld.service"
        unit.write_text(UNIT.read_text().replace("/usr/local/bin/eerld", str(fake_eerld)))
        done = subprocess.run([analyze, "verify", str(unit)], check=False, capture_output=True, text=True)
        assert (done.returncode, done.stdout + done.stderr) == (0, "")

    def test_verify_would_catch_a_bad_directive(self, tmp_path: Path) -> None:
        """The verify check is real: an unknown key makes it speak."""
        analyze = require_tool("systemd-analyze", "systemd")
        unit = tmp_path / "eerld.service"
        unit.write_text(
            UNIT.read_text().replace("/usr/local/bin/eerld", "/bin/true") + "\n[Service]\nBogus=1\n"
        )
        done = subprocess.run([analyze, "verify", str(unit)], check=False, capture_output=True, text=True)
        assert "Bogus" in done.stderr

    def test_clocks_are_reset_after_every_stop(self) -> None:
        """ExecStopPost runs eerld --reset-clocks, and a failed daemon is restarted."""
        lines = dict(unit_lines())
        assert "--reset-clocks" in lines["ExecStopPost"]
        assert lines["Restart"] == "on-failure"

    def test_the_commands_are_valid_eerld_invocations(self) -> None:
        """eerld's configuration parser accepts ExecStart's and ExecStopPost's flags, on the unit's paths."""
        lines = dict(unit_lines())
        serve = load_config(lines["ExecStart"].split()[1:])
        reset = load_config(lines["ExecStopPost"].split()[1:])
        assert (str(serve.socket_path), str(serve.admin_socket_path)) == (
            "/run/eerld/eerld.sock",
            "/run/eerld/admin.sock",
        )
        assert serve.state_dir == reset.state_dir
        assert str(serve.state_dir) == "/var/lib/" + lines["StateDirectory"]
        assert reset.reset_clocks
        assert (serve.tenancy, str(serve.grant_dir)) == (
            "multi",
            "/run/" + lines["RuntimeDirectory"] + "/grants",
        )

    def test_directories_and_hardening(self) -> None:
        """Runtime and state directories, and the hardening the issue lists, are all set."""
        lines = dict(unit_lines())
        assert (lines["RuntimeDirectory"], lines["StateDirectory"]) == ("eerld", "eerld")
        assert (lines["NoNewPrivileges"], lines["ProtectSystem"], lines["ProtectHome"]) == (
            "yes",
            "strict",
            "yes",
        )
        assert lines["PrivateTmp"] == "yes"
        assert set(lines["CapabilityBoundingSet"].split()) == {"CAP_SYS_ADMIN", "CAP_CHOWN"}

    def test_exposure_score_is_at_most_2_5(self) -> None:
        """``systemd-analyze security --offline=yes`` rates the unit 2.5 or better (it was 4.2)."""
        assert exposure(UNIT.read_text()) <= MAX_EXPOSURE

    def test_the_exposure_check_is_real(self) -> None:
        """Without the system-call filter, ProtectProc= and MemoryDenyWriteExecute= the score is worse."""
        dropped = ("SystemCallFilter", "ProtectProc", "MemoryDenyWriteExecute", "IPAddress")
        weaker = "\n".join(line for line in UNIT.read_text().splitlines() if not line.startswith(dropped))
        assert exposure(weaker) > exposure(UNIT.read_text()) + 1.0

    def test_the_hardening_keeps_what_nvml_and_the_sockets_need(self) -> None:
        """NVML's devices stay visible (no PrivateDevices=, no ProcSubset=); chown is put back after the
        privileged group is denied (sockets handed to groups and grant users); IP only on loopback."""
        pairs = unit_lines()
        lines = dict(pairs)
        filters = [v for k, v in pairs if k == "SystemCallFilter"]
        assert "PrivateDevices" not in lines
        assert "ProcSubset" not in lines
        assert filters[0] == "@system-service"
        assert "~@privileged" in filters[1].split()
        assert filters[-1] == "@chown"
        assert lines["SystemCallErrorNumber"] == "EPERM"
        assert (lines["IPAddressDeny"], lines["IPAddressAllow"]) == ("any", "localhost")
        assert (lines["ProtectProc"], lines["MemoryDenyWriteExecute"]) == ("invisible", "yes")

    def test_eerld_serves_grants_pins_and_stops_under_the_units_system_call_filter(
        self, sock_dir: Path
    ) -> None:
        """eerld (sim backend) under the unit's seccomp filter and W^X rule (tests/ops/unit_sandbox.py):
        it serves, hands a grant's socket to its user (chown), takes a pin, stops cleanly on SIGTERM, and
        ``--reset-clocks`` (ExecStopPost) runs too. The filter is real: chroot is refused under it."""
        bin_dir = Path(sys.executable).parent
        sandbox = [sys.executable, "-m", "tests.ops.unit_sandbox", str(UNIT), "--"]
        state = sock_dir / "state"
        flags = ["--backend", "sim", "--sim-gpus", "2", "--state-dir", str(state)]
        serve = [*flags, "--socket", str(sock_dir / "w.sock"), "--admin-socket", str(sock_dir / "a.sock"),
                 "--grant-dir", str(sock_dir / "grants"), "--metrics-address", "127.0.0.1:0",
                 "--socket-group", grp.getgrgid(0).gr_name, "--controller", "off"]  # fmt: skip
        daemon = subprocess.Popen(
            [*sandbox, str(bin_dir / "eerld"), *serve],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        ctl = [str(bin_dir / "eerlctl"), "--socket", str(sock_dir / "a.sock")]
        try:
            for _ in range(100):
                if subprocess.run([*ctl, "health"], capture_output=True, check=False).returncode == 0:
                    break
                time.sleep(0.1)
            grant = subprocess.run(
                [*ctl, "grant", "--gpus", "1", "--uid", "65534", "--job-id", "9"],
                capture_output=True,
                check=False,
            )
            pin = subprocess.run(
                [*ctl, "pin", "--gpus", "0", "--sm-mhz", "1005"], capture_output=True, check=False
            )
            owner = (sock_dir / "grants" / "job-9.sock").stat().st_uid
        finally:
            daemon.send_signal(signal.SIGTERM)
            out, _ = daemon.communicate(timeout=30)
        reset = subprocess.run(
            [*sandbox, str(bin_dir / "eerld"), *flags, "--reset-clocks"],
            cwd=ROOT,
            capture_output=True,
            check=False,
        )
        chroot = subprocess.run(
            [*sandbox, sys.executable, "-c", "import os; os.chroot('/')"],
            cwd=ROOT,
            capture_output=True,
            check=False,
        )
        assert (grant.returncode, pin.returncode, owner) == (0, 0, 65534), (grant.stderr, pin.stderr)
        assert daemon.returncode == 0, out.decode()[-2000:]
        assert b"daemon_stop" in out
        assert reset.returncode == 0, reset.stderr.decode()[-2000:]
        assert b"PermissionError" in chroot.stderr

    def test_the_sandbox_refuses_what_the_unit_forbids(self) -> None:
        """The filter test above rests on tests/ops/unit_sandbox.py: under it a mapping made or turned
        writable and executable (MemoryDenyWriteExecute=yes: mmap, mprotect) is refused with EACCES and
        chroot (~@privileged) with EPERM, while a writable mapping is not; the same probe without it is
        refused nothing (root), so each refusal is the sandbox's."""
        sandbox = [sys.executable, "-m", "tests.ops.unit_sandbox", str(UNIT), "--"]
        probe = [sys.executable, "-c", SANDBOX_PROBE]

        def outcomes(command: list[str]) -> dict[str, str]:
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
            assert done.returncode == 0, done.stderr[-2000:]
            found: dict[str, str] = json.loads(done.stdout)
            return found

        assert outcomes(probe) == dict.fromkeys(("mmap rw", "mmap rwx", "mprotect rwx", "chroot"), "ok")
        assert outcomes([*sandbox, *probe]) == {
            "mmap rw": "ok",
            "mmap rwx": "EACCES",
            "mprotect rwx": "EACCES",
            "chroot": "EPERM",
        }

    def test_only_nvidia_devices_are_allowed(self) -> None:
        """DevicePolicy=closed with DeviceAllow entries for the NVIDIA devices only."""
        pairs = unit_lines()
        assert ("DevicePolicy", "closed") in pairs
        allowed = [v for k, v in pairs if k == "DeviceAllow"]
        assert allowed
        assert all("nvidia" in v for v in allowed)


@pytest.fixture
def fake_tools(tmp_path: Path) -> Path:
    """eerlctl and eerld stand-ins that log their arguments; eerlctl fails when FAIL_EERLCTL is set."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(tmp_path / "admin.sock"))  # a socket file: "eerld is running"
    sock.close()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, fail in (("eerlctl", '[ -n "${FAIL_EERLCTL:-}" ] && exit 1'), ("eerld", "")):
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\necho "{name} $*" >> "{tmp_path}/calls"\n{fail}\nexit 0\n')
        tool.chmod(0o755)
    return bin_dir


def run_slurm(
    script: str, fake_tools: Path, *, daemon_running: bool = True, **env: str
) -> tuple[int, list[str]]:
    socket_path = fake_tools.parent / ("admin.sock" if daemon_running else "absent.sock")
    environ = {
        "PATH": f"{fake_tools}:/usr/bin:/bin",
        "SLURM_JOB_ID": "1234",
        "EERLCTL_SOCKET": str(socket_path),
        "EERL_JOBS_DIR": str(fake_tools.parent / "jobs"),
        **env,
    }
    done = subprocess.run(
        ["bash", str(SLURM / script)], env=environ, check=False, capture_output=True, text=True
    )
    calls = fake_tools.parent / "calls"
    return done.returncode, calls.read_text().splitlines() if calls.exists() else []


class TestSlurm:
    @pytest.mark.parametrize("script", ["prolog.sh", "epilog.sh", "reset-gpus.sh"])
    def test_scripts_parse_and_are_shellcheck_clean(self, script: str) -> None:
        """bash -n and shellcheck accept every script."""
        subprocess.run(["bash", "-n", str(SLURM / script)], check=True)
        shellcheck = require_tool("shellcheck", "shellcheck")
        done = subprocess.run(
            [shellcheck, "-x", str(SLURM / script)], check=False, capture_output=True, text=True, cwd=ROOT
        )
        assert done.returncode == 0, done.stdout

    @pytest.mark.parametrize("script", ["prolog.sh", "epilog.sh"])
    def test_scripts_are_executable(self, script: str) -> None:
        """slurmd runs the prolog and epilog directly, so they carry the executable bit."""
        assert os.stat(SLURM / script).st_mode & stat.S_IXUSR

    def test_epilog_revokes_the_jobs_grant_then_resets_its_gpus(self, fake_tools: Path) -> None:
        """The epilog revokes job 1234's grant and resets exactly SLURM_JOB_GPUS, naming the job."""
        code, calls = run_slurm("epilog.sh", fake_tools, SLURM_JOB_GPUS="0,1", SLURM_JOB_UID="1001")
        sock = fake_tools.parent / "admin.sock"
        assert code == 0
        assert calls == [
            f"eerlctl --socket {sock} --timeout 10 revoke --job-id 1234 --reason slurm epilog job 1234",
            f"eerlctl --socket {sock} --timeout 10 reset --gpus 0,1 --keep-pins "
            "--reason slurm epilog job 1234",
        ]

    def test_prolog_resets_the_jobs_gpus_then_grants_them_to_the_jobs_user(self, fake_tools: Path) -> None:
        """The prolog gives the job's uid a socket for exactly its GPUs, replacing a stale grant on them."""
        code, calls = run_slurm("prolog.sh", fake_tools, SLURM_JOB_GPUS="2,3", SLURM_JOB_UID="1001")
        sock = fake_tools.parent / "admin.sock"
        assert code == 0
        assert calls == [
            f"eerlctl --socket {sock} --timeout 10 reset --gpus 2,3 --keep-pins "
            "--reason slurm prolog job 1234",
            f"eerlctl --socket {sock} --timeout 10 grant --gpus 2,3 --uid 1001 --job-id 1234 --replace "
            "--reason slurm prolog job 1234",
        ]

    def test_prolog_makes_the_job_s_private_directory_in_root_s_and_the_epilog_removes_it(
        self, fake_tools: Path
    ) -> None:
        """The sidecar's default socket directory: the job user's, 0700, in a 0755 directory of root's."""
        jobs = fake_tools.parent / "jobs"
        (jobs / "1234").mkdir(parents=True)
        (jobs / "1234" / "left-by-an-old-job").touch()  # a job whose epilog never ran: not reused
        assert run_slurm("prolog.sh", fake_tools, SLURM_JOB_GPUS="0", SLURM_JOB_UID="1001")[0] == 0
        made = os.lstat(jobs / "1234")
        assert (stat.S_IMODE(made.st_mode), made.st_uid) == (0o700, 1001)
        parent = os.lstat(jobs)
        assert (stat.S_IMODE(parent.st_mode), parent.st_uid) == (0o755, 0)
        assert not list((jobs / "1234").iterdir())
        assert run_slurm("epilog.sh", fake_tools, SLURM_JOB_GPUS="0", SLURM_JOB_UID="1001")[0] == 0
        assert not (jobs / "1234").exists()
        odd = {"SLURM_JOB_GPUS": "0", "SLURM_JOB_UID": "1001", "SLURM_JOB_ID": "../x"}
        assert run_slurm("prolog.sh", fake_tools, **odd)[0] == 0
        assert not (jobs.parent / "x").exists()  # a job id that is not a plain name makes nothing

    def test_prolog_grants_nothing_when_grants_are_off_or_the_uid_is_unknown(self, fake_tools: Path) -> None:
        """EERL_SLURM_GRANT=0 (a single-tenant node) or no SLURM_JOB_UID: reset only."""
        _, off = run_slurm(
            "prolog.sh", fake_tools, SLURM_JOB_GPUS="0", SLURM_JOB_UID="1", EERL_SLURM_GRANT="0"
        )
        (fake_tools.parent / "calls").unlink()
        _, no_uid = run_slurm("prolog.sh", fake_tools, SLURM_JOB_GPUS="0")
        assert [c.split()[5] for c in off] == ["reset"]
        assert [c.split()[5] for c in no_uid] == ["reset"]

    def test_prolog_falls_back_to_cuda_visible_devices(self, fake_tools: Path) -> None:
        """Without SLURM_JOB_GPUS the prolog uses CUDA_VISIBLE_DEVICES."""
        _, calls = run_slurm("prolog.sh", fake_tools, CUDA_VISIBLE_DEVICES="3", SLURM_JOB_UID="7")
        assert [c.split(" --timeout 10 ")[1].split(" --reason")[0] for c in calls] == [
            "reset --gpus 3 --keep-pins",
            "grant --gpus 3 --uid 7 --job-id 1234 --replace",
        ]

    def test_without_eerld_the_ledger_reset_runs(self, fake_tools: Path) -> None:
        """With no daemon socket, eerld --reset-clocks resets what the ledger names; the job still runs."""
        code, calls = run_slurm("epilog.sh", fake_tools, daemon_running=False, SLURM_JOB_GPUS="0")
        assert (code, calls) == (0, ["eerld --state-dir /var/lib/eerld --reset-clocks"])

    def test_a_failing_eerlctl_never_resets_behind_a_running_daemon(self, fake_tools: Path) -> None:
        """If eerld runs but eerlctl fails, nothing else is tried and the epilog still succeeds."""
        code, calls = run_slurm("epilog.sh", fake_tools, SLURM_JOB_GPUS="0", FAIL_EERLCTL="1")
        assert code == 0
        assert [c.split()[0] for c in calls] == ["eerlctl", "eerlctl"]  # revoke, reset; never eerld

    @pytest.mark.parametrize("env", [{"SLURM_JOB_GPUS": ""}, {}, {"CUDA_VISIBLE_DEVICES": "NoDevFiles"}])
    def test_a_job_without_gpus_touches_nothing(self, fake_tools: Path, env: dict[str, str]) -> None:
        """No GPU list (or an empty one) calls nothing: never every GPU of a shared node."""
        code, calls = run_slurm("epilog.sh", fake_tools, **env)
        assert (code, calls) == (0, [])


class TestDockerfile:
    def dockerfile(self) -> str:
        return (ROOT / "Dockerfile").read_text()

    def test_the_base_is_pinned_and_the_build_is_multi_stage(self) -> None:
        """Every stage starts from the same exact python:3.11.x-slim-bookworm tag; there are two stages."""
        text = self.dockerfile()
        base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.MULTILINE)
        assert base is not None
        assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", base.group(1))
        assert re.findall(r"^FROM (\S+) AS (\w+)$", text, re.MULTILINE) == [
            ("${PYTHON_IMAGE}", "build"),
            ("${PYTHON_IMAGE}", "runtime"),
        ]

    def test_it_runs_eerld(self) -> None:
        """The entry point is eerld, serving on the conventional socket paths."""
        text = self.dockerfile()
        assert 'ENTRYPOINT ["eerld"]' in text
        assert "--socket=/run/eerld/eerld.sock" in text

    def test_everything_copied_exists_and_is_in_the_build_context(self) -> None:
        """Each COPY source exists and is re-included by the deny-all .dockerignore."""
        ignore = (ROOT / ".dockerignore").read_text().splitlines()
        included = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
        assert "*" in ignore
        for line in re.findall(r"^COPY (?!--from)(.+)$", self.dockerfile(), re.MULTILINE):
            *sources, _dest = line.split()
            for source in sources:
                assert (ROOT / source).exists(), source
                assert source.rstrip("/") in included, source

    def test_every_pip_step_is_pinned(self) -> None:
        """Each pip step installs from constraints.txt or from the built wheels only; the wheels build with
        the pinned backend rather than an isolated, unpinned one."""
        steps = re.findall(r"pip (install|wheel) ([^\n]*)", self.dockerfile())
        assert [verb for verb, _ in steps] == ["install", "wheel", "install"]
        for verb, flags in steps:
            assert "--constraint constraints.txt" in flags or "--no-index" in flags, (verb, flags)
            if verb == "wheel":
                assert "--no-build-isolation" in flags


def declared_requirements() -> list[Requirement]:
    """What eerld (base and demo extra), eerl-sim (base and bench extra), the eerl-client they ask for (and
    its extras) and the three wheel builds require."""
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    client = tomllib.loads((ROOT / "client/pyproject.toml").read_text())
    sim = tomllib.loads((ROOT / "sim/pyproject.toml").read_text())
    wanted = [*root["project"]["dependencies"], *root["project"]["optional-dependencies"]["demo"]]
    wanted += [*sim["project"]["dependencies"], *sim["project"]["optional-dependencies"]["bench"]]
    wanted += [build for project in (root, client, sim) for build in project["build-system"]["requires"]]
    requirements = []
    for requirement in map(Requirement, wanted):
        name = canonicalize_name(requirement.name)
        if name == "eerld":  # the checkout's own, whose requirements are listed above
            continue
        if name != "eerl-client":
            requirements.append(requirement)
            continue
        requirements += map(Requirement, client["project"]["dependencies"])
        for extra in requirement.extras:
            requirements += map(Requirement, client["project"]["optional-dependencies"][extra])
    return requirements


class TestConstraints:
    def pins(self) -> dict[str, str]:
        lines = (ROOT / "constraints.txt").read_text().splitlines()
        pins = {}
        for line in lines:
            if line and not line.startswith("#"):
                name, sep, version = line.partition("==")
                assert sep, f"not an exact pin: {line}"
                pins[canonicalize_name(name)] = version
        return pins

    def test_every_declared_dependency_is_pinned_within_its_range(self) -> None:
        """Every requirement of the three pyproject files has an exact pin in constraints.txt that it accepts
        (tests/ops/test_packaging.py proves that the indirect ones are pinned too)."""
        pins = self.pins()
        for requirement in declared_requirements():
            name = canonicalize_name(requirement.name)
            assert name in pins, f"{name} is not in constraints.txt: run `make constraints`"
            accepted = requirement.specifier.contains(pins[name], prereleases=True)
            assert accepted, f"{requirement} does not accept the pin {pins[name]}: run `make constraints`"

    def test_the_local_projects_are_not_pinned(self) -> None:
        """eerld, eerl-client and eerl-sim come from the checkout's wheels, never from an index."""
        assert {"eerld", "eerl-client", "eerl-sim"}.isdisjoint(self.pins())
