"""What one phase event costs through eerl-sidecar, beside the direct client; and SIGKILL → GPUs reset.

Every party is its own process, as in production: eerld on the sim backend (the fixed controller, so each
begin locks a clock), one ``eerl-sidecar`` holding the job's session, and this script as the job. Rows, each
over ``--events`` phase events (begins and ends alternating, spaced by ``--gap-ms`` of busy work):

* ``direct client, caller``: ``Phase.__enter__``/``__exit__`` on a session over the daemon's socket, the
  caller's thread only (the event is queued; the sender thread does the RPC) — what ``perf.client_overhead``
  measures.
* ``direct client, answered``: the same events, waited for until the daemon answered (``wait_for_clock_s``
  on a begin, ``flush`` after an end): the RPC's round trip as the caller would see it if it waited.
* ``EERL_SIDECAR client, caller``: the Python client with the sidecar in the daemon's place (the hooks'
  path); the caller's thread only.
* ``HTTP, kept-alive``: one synchronous ``POST`` per event on a kept-alive connection (what a job in another
  language pays per event with an HTTP library); the sidecar answers after the daemon did.
* ``HTTP, a connection per event``: the same with a fresh connection each time.
* ``curl, a process per event``: ``curl -s --max-time 1 --unix-socket … -d … URL`` from a shell loop, fork
  and exec included.

The sidecar listens where it does by default, on a private Unix socket; ``--tcp`` puts it on loopback TCP
with its secret instead.
* ``eerl phase CLI``: ``python -m eerl.cli phase begin|end`` per event (interpreter start-up included; fewer
  samples, ``--cli-events``).

Then ``--kills`` times: a sidecar with a phase open (the GPUs locked) is SIGKILLed, and the admin socket's
Status is polled every 5 ms until both GPUs are back on the default governor.

    .venv/bin/python -m perf.sidecar_overhead [--events 1000] [--gap-ms 2] [--kills 10] [--tcp]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import eerl
from eerl import ClientConfig
from eerl.sidecar._address import parse_address
from eerl.sidecar._owner import job_environment
from eerl.sidecar.client import SidecarHttp

from eerlctl.client import AdminClient
from perf.stats import percentile
from soak.daemon import DaemonProcess, stop_process


def work(duration_s: float) -> None:
    """Busy work between events, giving up the GIL often (see perf.client_overhead)."""
    deadline_s = time.perf_counter() + duration_s
    while time.perf_counter() < deadline_s:
        time.sleep(0)


class Sidecar:
    """``python -m eerl.sidecar.server`` where it listens by default (a private Unix socket under
    ``directory``), or with ``tcp`` on a free loopback port with a secret; until :meth:`stop` or
    :meth:`kill`."""

    def __init__(self, socket_path: Path, job_id: str, directory: Path, *, tcp: bool = False) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EERL_SIDECAR")}
        env["TMPDIR"] = str(directory)
        env.pop("XDG_RUNTIME_DIR", None)
        token_file = directory / f"token-{job_id}"
        listen = ["--listen", "127.0.0.1:0", "--token-file", str(token_file)] if tcp else []
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "eerl.sidecar.server", "--job-id", job_id, "--gpus", "0,1",
                *listen, "--socket", str(socket_path), "--log-level", "error",
            ],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("eerl-sidecar: listening on "):
            self.kill()
            raise RuntimeError(f"the sidecar did not start: {line!r}")
        self.url = line.removeprefix("eerl-sidecar: listening on ")
        self.address = parse_address(self.url)
        self.token = token_file.read_text().strip() if tcp else None

    @property
    def client_env(self) -> dict[str, str]:
        """``EERL_SIDECAR`` (and the secret on TCP), as ``-- command`` would give a job."""
        return job_environment(self.url, self.token)

    def connection(self) -> SidecarHttp:
        """A kept-alive connection of the job's (the product's client: owner checked, secret sent)."""
        return SidecarHttp(self.address, 5, token=self.token)

    def wait_connected(self, timeout_s: float = 30) -> None:
        deadline_s = time.monotonic() + timeout_s
        while time.monotonic() < deadline_s:
            connection = self.connection()
            try:
                if connection.request("GET", "/v1/status")[1].get("connected"):
                    return
            finally:
                connection.close()
            time.sleep(0.02)
        raise RuntimeError("the sidecar's session did not open")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def stop(self) -> None:
        stop_process(self.proc, timeout_s=15)
        self.kill()


def events(count: int) -> Iterator[tuple[bool, str, int]]:
    """(begin, kind, iteration) for ``count`` events: generation then training phases, alternating."""
    for n in range(count):
        phase = n // 2
        yield n % 2 == 0, ("generation" if phase % 2 == 0 else "training"), phase // 2


def time_session(config: ClientConfig, count: int, gap_s: float, *, answered: bool) -> list[int]:
    """Per-event caller time (ns) of a phase's enter, or report + exit; ``answered``: until the daemon's."""
    clock = time.perf_counter_ns
    costs: list[int] = []
    with eerl.connect(gpus=[0, 1], job_id="bench-direct", config=config) as session:
        if not session.wait_until_connected(30):
            raise RuntimeError("no session")
        phase = None
        for begin, kind, iteration in events(count):
            start_ns = clock()
            if begin:
                phase = session.phase(kind, iteration=iteration, wait_for_clock_s=5.0 if answered else 0.0)
                phase.__enter__()
            else:
                assert phase is not None
                phase.report(tokens=100, valid_tokens=80, sequences=4)
                phase.__exit__(None, None, None)
                if answered:
                    session.flush(5.0)
            costs.append(clock() - start_ns)
            work(gap_s)
        session.flush(5.0)
    return costs


def time_http(sidecar: Sidecar, count: int, gap_s: float, *, keep_alive: bool) -> list[int]:
    clock = time.perf_counter_ns
    costs: list[int] = []
    connection = sidecar.connection()
    try:
        for begin, kind, iteration in events(count):
            body: dict[str, object] = {"kind": kind, "iteration": iteration}
            if not begin:
                body.update(tokens=100, valid_tokens=80, sequences=4)
            start_ns = clock()
            connection.request("POST", "/v1/phases/begin" if begin else "/v1/phases/end", body)
            if not keep_alive:
                connection.close()  # the next request opens a new one
            costs.append(clock() - start_ns)
            work(gap_s)
    finally:
        connection.close()
    return costs


def time_commands(make: Callable[[bool, str, int], list[str]], count: int, env: dict[str, str]) -> list[int]:
    clock = time.perf_counter_ns
    costs: list[int] = []
    for begin, kind, iteration in events(count):
        command = make(begin, kind, iteration)
        start_ns = clock()
        subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        costs.append(clock() - start_ns)
    return costs


def locks(admin: AdminClient) -> list[int | None]:
    return [
        gpu.locked_sm_clock_mhz if gpu.HasField("locked_sm_clock_mhz") else None
        for gpu in admin.status(timeout_s=5).gpus
    ]


def time_kills(socket_path: Path, admin_path: Path, directory: Path, kills: int) -> list[float]:
    """Seconds from SIGKILL of a sidecar with a phase open to both GPUs back at the default governor."""
    resets: list[float] = []
    with AdminClient(admin_path) as admin:
        for k in range(kills):
            sidecar = Sidecar(socket_path, f"bench-kill-{k}", directory)
            try:
                sidecar.wait_connected()
                connection = sidecar.connection()
                connection.request("POST", "/v1/phases/begin", {"kind": "generation", "iteration": 0})
                connection.close()
                if locks(admin) != [1200, 1200]:
                    raise RuntimeError(f"the GPUs are not locked: {locks(admin)}")
                sidecar.proc.send_signal(signal.SIGKILL)
                killed_s = time.perf_counter()
                while locks(admin) != [None, None]:
                    if time.perf_counter() - killed_s > 30:
                        raise RuntimeError("the GPUs were not reset within 30 s")
                    time.sleep(0.005)
                resets.append(time.perf_counter() - killed_s)
            finally:
                sidecar.kill()
            time.sleep(0.1)
    return resets


def row(label: str, costs_ns: list[int]) -> None:
    median_us = percentile(costs_ns, 0.5) / 1000
    p99_us = percentile(costs_ns, 0.99) / 1000
    print(f"{label:<34} median {median_us:9.1f} µs/event   p99 {p99_us:9.1f} µs/event   (n={len(costs_ns)})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m perf.sidecar_overhead",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--process-events", type=int, default=200, help="events for the curl row")
    parser.add_argument("--cli-events", type=int, default=40, help="events for the eerl CLI row")
    parser.add_argument("--gap-ms", type=float, default=2.0)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument(
        "--tcp",
        action="store_true",
        help="the sidecar on loopback TCP with its secret (default: its Unix socket)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    gap_s = args.gap_ms / 1000
    with tempfile.TemporaryDirectory(prefix="eerl-sc-bench-", dir="/tmp") as tmp:
        directory = Path(tmp)
        # eerld on the sim backend in its own process: real time, the fixed controller (1200 / 1500 MHz).
        with DaemonProcess(directory, gpus=2, sim_speedup=1.0) as daemon:
            socket_path, admin_path = daemon.socket_path, daemon.admin_socket_path
            direct = dataclasses.replace(ClientConfig.uds(socket_path), close_timeout_s=5)
            row("direct client, caller", time_session(direct, args.events, gap_s, answered=False))
            row("direct client, answered", time_session(direct, args.events, gap_s, answered=True))
            sidecar = Sidecar(socket_path, "bench-sidecar", directory, tcp=args.tcp)
            try:
                sidecar.wait_connected()
                via = dataclasses.replace(
                    ClientConfig.sidecar(sidecar.url, token=sidecar.token), close_timeout_s=5
                )
                row("EERL_SIDECAR client, caller", time_session(via, args.events, gap_s, answered=False))
                row("HTTP, kept-alive", time_http(sidecar, args.events, gap_s, keep_alive=True))
                row("HTTP, a connection per event", time_http(sidecar, args.events, gap_s, keep_alive=False))
                env = {k: v for k, v in os.environ.items() if not k.startswith("EERL_SIDECAR")}
                env.update(sidecar.client_env)
                curl = shutil.which("curl")
                if curl is not None:
                    if sidecar.address.path:
                        where = ["--unix-socket", sidecar.address.path]
                        base = "http://localhost"
                    else:
                        where = ["-H", f"Authorization: Bearer {sidecar.token}"]
                        base = sidecar.url

                    def curl_command(begin: bool, kind: str, iteration: int) -> list[str]:
                        body = {"kind": kind, "iteration": iteration}
                        path = "begin" if begin else "end"
                        return [curl, "-s", "--max-time", "1", *where, "-d", json.dumps(body),
                                f"{base}/v1/phases/{path}"]  # fmt: skip

                    row("curl, a process per event", time_commands(curl_command, args.process_events, env))

                def cli_command(begin: bool, kind: str, iteration: int) -> list[str]:
                    edge = "begin" if begin else "end"
                    return [sys.executable, "-m", "eerl.cli", "phase", edge, kind, "-i", str(iteration)]

                row("eerl phase CLI, a process per event", time_commands(cli_command, args.cli_events, env))
            finally:
                sidecar.stop()
            if args.kills:
                resets = time_kills(socket_path, admin_path, directory, args.kills)
                median_ms, max_ms = percentile(resets, 0.5) * 1000, max(resets) * 1000
                print(
                    f"SIGKILL -> GPUs at default (n={len(resets)}): "
                    f"median {median_ms:.0f} ms, max {max_ms:.0f} ms"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
