"""Generate the gRPC Python code from proto/ into the client package, or check it is fresh.

The generated files are committed (users install the client without protoc); this script is the
one way they are made, with the tool versions pinned in pyproject.toml's dev extra.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT_ROOT = ROOT / "client"
PACKAGE_DIR = Path("eerl") / "v1"
GENERATED = ("eerl_pb2.py", "eerl_pb2.pyi", "eerl_pb2_grpc.py", "eerl_pb2_grpc.pyi")


def generate(out_root: Path) -> None:
    """Run protoc (from grpcio-tools) with the mypy-protobuf plugins into out_root."""
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *protos,
    ]
    bin_dir = str(Path(sys.executable).parent)
    env = {"PATH": bin_dir + ":/usr/bin:/bin"}
    subprocess.run(cmd, check=True, cwd=PROTO_ROOT, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh = Path(tmp) / PACKAGE_DIR
        committed = OUT_ROOT / PACKAGE_DIR
        if args.check:
            stale = [
                name
                for name in GENERATED
                if not (committed / name).exists() or not filecmp.cmp(fresh / name, committed / name, False)
            ]
            if stale:
                print(
                    f"Error: generated code is stale: {', '.join(stale)}; run 'make proto'", file=sys.stderr
                )
                return 1
            print("generated code is fresh")
            return 0
        committed.mkdir(parents=True, exist_ok=True)
        for name in GENERATED:
            shutil.copyfile(fresh / name, committed / name)
        print(f"wrote {', '.join(str(PACKAGE_DIR / n) for n in GENERATED)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
