"""What a process costs, read from ``/proc`` (Linux): resident memory, CPU time, threads, descriptors."""

from __future__ import annotations

import os
from pathlib import Path


def rss_mib(pid: int) -> float:
    """Resident memory of a process, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> int:
    """Threads of a process."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def fds(pid: int) -> int:
    """Open descriptors of a process."""
    return len(os.listdir(f"/proc/{pid}/fd"))
