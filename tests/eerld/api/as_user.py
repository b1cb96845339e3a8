"""Run an eerl command's entry point as another user: import as root, drop privileges, then call it.

The suite's Python may live where only root can read (``/root/.pyenv``), so the process imports what the
command needs first, as root, and only then becomes ``UID``/``GID`` (no supplementary groups); from then on
the kernel treats it as that user for everything it creates, binds or opens.

Usage: python as_user.py UID GID eerld|eerlctl|client [ARGS...]   (client: a Python snippet on stdin)
"""

from __future__ import annotations

import os
import sys

import eerl
import eerl.link
import eerl_sim.gpu
import grpc
import structlog

import eerlctl.main
import eerld.api.server
import eerld.app
import eerld.main

_PRELOADED = (eerl, eerl.link, eerld.api.server, eerld.app, eerl_sim.gpu, grpc, structlog)
"""Imported as root on purpose: a lazy import after the drop could not read the interpreter's files."""


def main() -> int:
    uid, gid, command, *args = sys.argv[1:]
    snippet = sys.stdin.read() if command == "client" else ""
    os.setgroups([])
    os.setgid(int(gid))
    os.setuid(int(uid))
    if os.geteuid() != int(uid) or os.getegid() != int(gid):
        raise SystemExit("as_user: could not drop privileges")
    if command == "eerld":
        return eerld.main.main(args)
    if command == "eerlctl":
        return eerlctl.main.main(args)
    exec(compile(snippet, "<client>", "exec"), {"__name__": "__main__"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
