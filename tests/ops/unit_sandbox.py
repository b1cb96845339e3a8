"""Run a command under the system-call filter and W^X rule of systemd/eerld.service, without systemd.

``python -m tests.ops.unit_sandbox UNIT -- COMMAND ...`` reads the unit's ``SystemCallFilter=`` lines
(systemd's rules: the first line's kind sets the default; later allow lines add, later ``~`` lines
remove), expands the groups with ``systemd-analyze syscall-filter``, maps names to x86-64 numbers from the
kernel headers, and execs COMMAND under a seccomp filter that allows exactly those calls, answers any
other with ``SystemCallErrorNumber=`` (EPERM), and — ``MemoryDenyWriteExecute=yes`` — refuses mmap and
mprotect of memory both writable and executable. It is how the tests check that eerld (Python, gRPC, its
chown of sockets, its rlimit) runs under the unit's sandbox on a machine without systemd as init.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

UNISTD = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
AUDIT_ARCH_X86_64 = 0xC000003E
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
LD_ABS, JEQ, AND, RET = 0x20, 0x15, 0x54, 0x06
PROT_WRITE_EXEC = 0x2 | 0x4
WX_CALLS = ("mmap", "mprotect", "pkey_mprotect")


def expand(group: str, analyze: str, seen: set[str] | None = None) -> set[str]:
    """The system calls of ``@group`` (nested groups expanded), or ``{name}`` for a call."""
    if not group.startswith("@"):
        return {group}
    seen = seen if seen is not None else set()
    if group in seen:
        return set()
    seen.add(group)
    out = subprocess.run(
        [analyze, "syscall-filter", group], capture_output=True, text=True, check=True
    ).stdout
    calls: set[str] = set()
    for line in out.splitlines()[1:]:
        name = line.strip()
        if name and not name.startswith("#"):
            calls |= expand(name, analyze, seen)
    return calls


def allowed_calls(unit_text: str, analyze: str) -> set[str]:
    """The calls the unit's ``SystemCallFilter=`` lines allow (an allow list must come first)."""
    lines = [v.strip() for k, _, v in (line.partition("=") for line in unit_text.splitlines())
             if k.strip() == "SystemCallFilter"]  # fmt: skip
    if not lines or lines[0].startswith("~"):
        raise SystemExit("the unit's first SystemCallFilter= must be an allow list")
    allowed: set[str] = set()
    for value in lines:
        deny = value.startswith("~")
        names = set().union(*(expand(n, analyze) for n in value.lstrip("~").split()))
        allowed = allowed - names if deny else allowed | names
    return allowed


def numbers() -> dict[str, int]:
    """x86-64 system call numbers by name."""
    pattern = re.compile(r"#define __NR_(\w+) (\d+)")
    return {m.group(1): int(m.group(2)) for m in pattern.finditer(UNISTD.read_text())}


def program(allowed: set[str], errno_value: int, deny_wx: bool) -> list[tuple[int, int, int, int]]:
    """A classic BPF seccomp program (code, jt, jf, k)."""
    nr = numbers()
    refuse = RET_ERRNO | errno_value
    prog = [(LD_ABS, 0, 0, 4), (JEQ, 1, 0, AUDIT_ARCH_X86_64), (RET, 0, 0, refuse), (LD_ABS, 0, 0, 0)]
    if deny_wx:
        wx = [nr[c] for c in WX_CALLS]
        # three tests, each jumping to the W^X block right after them
        for i, number in enumerate(wx):
            prog.append((JEQ, len(wx) - i, 0, number))
        prog.append((JEQ, 0, 5, 0xFFFFFFFF))  # never equal: skip the W^X block
        # W^X block: args[2] (prot), low word
        prog += [(LD_ABS, 0, 0, 16 + 2 * 8), (AND, 0, 0, PROT_WRITE_EXEC), (JEQ, 0, 1, PROT_WRITE_EXEC)]
        prog += [(RET, 0, 0, RET_ERRNO | errno.EACCES), (RET, 0, 0, RET_ALLOW)]
    for name in sorted(allowed):
        if name in nr:
            prog += [(JEQ, 0, 1, nr[name]), (RET, 0, 0, RET_ALLOW)]
    prog.append((RET, 0, 0, refuse))
    return prog


def install(prog: list[tuple[int, int, int, int]]) -> None:
    """Load the program for this process and its children (no new privileges from here on)."""
    libc = ctypes.CDLL(None, use_errno=True)
    raw = b"".join(struct.pack("HBBI", *insn) for insn in prog)
    buffer = ctypes.create_string_buffer(raw)

    class Fprog(ctypes.Structure):
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

    fprog = Fprog(len(prog), ctypes.addressof(buffer))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")


def main(argv: list[str]) -> None:
    unit_path, _, command = argv[0], argv[1], argv[2:]
    analyze = shutil.which("systemd-analyze") or "systemd-analyze"
    text = Path(unit_path).read_text()
    settings = {k.strip(): v.strip() for k, _, v in (line.partition("=") for line in text.splitlines())}
    errno_value = getattr(errno, settings.get("SystemCallErrorNumber", "EPERM"))
    prog = program(allowed_calls(text, analyze), errno_value, settings.get("MemoryDenyWriteExecute") == "yes")
    install(prog)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
