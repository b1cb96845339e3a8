"""Crashes: clients SIGKILLed mid-phase, the daemon SIGKILLed under load, a process killed mid ledger write.

Everything is checked from outside, as an operator would: the simulated GPUs' locks in the shared state
file (the "hardware"), the ledger file on disk, the daemon's Status over the admin socket.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from eerl_sim.gpu import SimDevice

from eerld.clocks.ledger import Ledger
from soak.daemon import REPO, STREAM_RESET_BOUND_S, DaemonProcess, locked_gpus, owned_gpus, wait_for

WORKER = "soak.worker"
"""The simulated RL worker's module (``python -m soak.worker``, run from the checkout)."""
GPUS = 8


def _spawn(daemon: DaemonProcess, gpu: int, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", WORKER, str(daemon.socket_path), str(daemon.state_file), str(gpu), mode],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _unlocked(device: SimDevice, gpu: int) -> bool:
    return device.observe(gpu).sm_lock_mhz is None


def _unlisted(daemon: DaemonProcess, gpu: int) -> bool:
    return gpu not in daemon.ledger_entries()


def _reap(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


# -- client death ------------------------------------------------------------------------------------


def client_kills(kills: int, seed: int = 1, lease_ttl_s: float = 10.0) -> dict[str, Any]:
    """SIGKILL ``kills`` clients mid-phase (rounds of up to 8, one per GPU, killed in random order).

    With a ``lease_ttl_s`` longer than the patience of the waits, a reset can only come from the end of
    the client's Attach stream (the lease would still run: the daemon's lease cap is raised to it).
    """
    rng = random.Random(seed)
    reset_s: list[float] = []
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="eerl-ck-", dir="/tmp") as d:
        cap = [f"--max-lease-ttl={lease_ttl_s:g}"]
        daemon = DaemonProcess(Path(d), gpus=GPUS, lease_ttl_s=lease_ttl_s, extra_args=cap)
        daemon.start()
        device = daemon.device()
        try:
            done = 0
            while done < kills:
                batch = min(GPUS, kills - done)
                victims = {gpu: _spawn(daemon, gpu, "victim") for gpu in range(batch)}
                for gpu, proc in victims.items():
                    assert proc.stdout is not None
                    line = proc.stdout.readline().strip()
                    if line != "ready":
                        raise RuntimeError(f"victim on GPU {gpu} did not start: {line!r}")
                locked = locked_gpus(device, GPUS)
                if set(locked) != set(victims):
                    problems.append(f"before the kills the locked GPUs were {sorted(locked)}")
                order = list(victims)
                rng.shuffle(order)
                for gpu in order:
                    time.sleep(rng.uniform(0.0, 0.3))  # at a random point of the phase's work
                    t0 = time.monotonic()
                    victims[gpu].send_signal(signal.SIGKILL)
                    wait_for(partial(_unlocked, device, gpu), f"GPU {gpu} reset")
                    reset_s.append(time.monotonic() - t0)
                    # the arbiter resets first and unlists after: the ledger may lag the hardware briefly
                    wait_for(partial(_unlisted, daemon, gpu), f"GPU {gpu} off the ledger", 10)
                for proc in victims.values():
                    _reap(proc)
                done += batch
            wait_for(lambda: not daemon.sessions(), "every killed client's session to be closed")
            leaked_locks = locked_gpus(device, GPUS)
            ledger_left = daemon.ledger_entries()
        finally:
            daemon.stop()
    over = [s for s in reset_s if s > STREAM_RESET_BOUND_S]
    return {
        "kills": len(reset_s),
        "reset_median_s": sorted(reset_s)[len(reset_s) // 2],
        "reset_max_s": max(reset_s),
        "bound_s": STREAM_RESET_BOUND_S,
        "over_bound": len(over),
        "leaked_locks": len(leaked_locks),
        "ledger_entries_left": len(ledger_left),
        "problems": problems,
    }


# -- daemon death --------------------------------------------------------------------------------------


def _start_info(daemon: DaemonProcess, starts_seen: int) -> list[int]:
    """``ledger_reset`` of the ``starts_seen``-th daemon_start line of the log."""
    lines = [
        json.loads(line)
        for line in daemon.log_path.read_text(errors="replace").splitlines()
        if line.startswith("{") and '"daemon_start"' in line
    ]
    return list(lines[starts_seen - 1].get("ledger_reset", [])) if len(lines) >= starts_seen else []


def daemon_kills(kills: int, clients: int = GPUS, seed: int = 2) -> dict[str, Any]:
    """SIGKILL the daemon ``kills`` times at random points while ``clients`` workers run phases."""
    rng = random.Random(seed)
    problems: list[str] = []
    reconnect_s: list[float] = []
    locked_at_kill: list[int] = []
    reset_at_start: list[int] = []
    with tempfile.TemporaryDirectory(prefix="eerl-dk-", dir="/tmp") as d:
        # training on the default governor: every phase change locks or resets, so the ledger is written
        # on every phase and random kills land in ledger writes too
        daemon = DaemonProcess(Path(d), gpus=GPUS, fixed_clocks="generation=1200")
        daemon.start()
        device = daemon.device()
        workers = [_spawn(daemon, gpu, "loop") for gpu in range(clients)]
        try:

            def all_back() -> bool:
                sessions = daemon.sessions()
                return len(sessions) == clients and all(sum(p.phases for p in s.phases) > 0 for s in sessions)

            wait_for(all_back, "every worker to open a session and run phases", patience_s=120)
            for k in range(kills):
                time.sleep(rng.uniform(0.2, 1.5))
                daemon.kill()
                try:
                    ledger = daemon.ledger_entries()
                except Exception as e:
                    problems.append(f"kill {k}: ledger corrupt: {e}")
                    ledger = {}
                locked = locked_gpus(device, GPUS)
                locked_at_kill.append(len(locked))
                unlisted = set(locked) - set(ledger)
                if unlisted:
                    problems.append(f"kill {k}: GPUs {sorted(unlisted)} locked but not in the ledger")
                daemon.start()
                reset = _start_info(daemon, daemon.starts)
                reset_at_start.append(len(reset))
                if not set(locked) <= set(reset):
                    problems.append(f"kill {k}: locked {sorted(locked)}, reset at start only {reset}")
                on_hw = locked_gpus(device, GPUS)
                owned = owned_gpus(daemon.status())
                if set(on_hw) - owned:
                    problems.append(f"kill {k}: GPUs {sorted(set(on_hw) - owned)} locked with no owner")
                t0 = time.monotonic()
                wait_for(all_back, f"workers to reconnect after kill {k}", patience_s=120)
                reconnect_s.append(time.monotonic() - t0)
                dead = [i for i, w in enumerate(workers) if w.poll() is not None]
                if dead:
                    problems.append(f"kill {k}: workers {dead} died")
            alive = sum(1 for w in workers if w.poll() is None)
        finally:
            for w in workers:
                _reap(w)
        wait_for(lambda: not daemon.sessions(), "the workers' sessions to end", patience_s=60)
        exit_code = daemon.stop()
        leaked = locked_gpus(device, GPUS)
        ledger_left = daemon.ledger_entries()
    return {
        "kills": kills,
        "clients": clients,
        "problems": problems,
        "gpus_locked_at_kill_total": sum(locked_at_kill),
        "gpus_reset_from_ledger_total": sum(reset_at_start),
        "reconnect_median_s": sorted(reconnect_s)[len(reconnect_s) // 2],
        "reconnect_max_s": max(reconnect_s),
        "workers_alive_at_end": alive,
        "daemon_exit_code": exit_code,
        "leaked_locks_at_end": len(leaked),
        "ledger_entries_at_end": len(ledger_left),
    }


# -- a process killed mid ledger write -------------------------------------------------------------------

LEDGER_WRITER = """
import sys
from pathlib import Path
from eerld.clocks.ledger import Ledger, LedgerEntry
ledger = Ledger(Path(sys.argv[1]))
print("ready", flush=True)
i = 0
while True:
    ledger.add(LedgerEntry(i % 64, f"GPU-{i % 64}", "session"))
    if i % 3 == 0:
        ledger.remove((i * 7) % 64)
    i += 1
"""


def ledger_write_kills(kills: int, seed: int = 3) -> dict[str, Any]:
    """SIGKILL a process that rewrites the ledger in a tight loop (so nearly always mid-write)."""
    rng = random.Random(seed)
    corrupt: list[str] = []
    entries: list[int] = []
    with tempfile.TemporaryDirectory(prefix="eerl-lk-", dir="/tmp") as d:
        state = Path(d)
        for _ in range(kills):
            proc = subprocess.Popen(
                [sys.executable, "-c", LEDGER_WRITER, str(state)], cwd=REPO, stdout=subprocess.PIPE, text=True
            )
            assert proc.stdout is not None
            proc.stdout.readline()
            time.sleep(rng.uniform(0.05, 0.4))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
            try:
                entries.append(len(Ledger(state).entries()))
            except Exception as e:
                corrupt.append(str(e))
    return {"kills": kills, "corrupt": len(corrupt), "errors": corrupt[:3], "entries_after_kill": entries}
