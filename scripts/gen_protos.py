"""Generate the gRPC Python code from proto/ into the client package, or check it is fresh.

The generated files are committed (users install the client without protoc); this script is the
one way they are made, with the tool versions pinned in pyproject.toml's dev extra. It also generates the
messages of the kubelet's pod-resources API that the daemon reads (``eerld/api/podresources/api.proto``,
messages only: the daemon's client calls the one method by name), and the Container Storage Interface
that ``eerl-csi`` serves (``eerld/csi/proto/csi.proto``, the spec's own file, unchanged: messages and the
gRPC services, whose stubs the tests call as the kubelet would).
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
KUBELET_PROTO = Path("eerld") / "api" / "podresources" / "api.proto"
KUBELET_GENERATED = ("api_pb2.py", "api_pb2.pyi")
CSI_PROTO = Path("eerld") / "csi" / "proto" / "csi.proto"
"""container-storage-interface/spec v1.12.0 (commit e6fc13ea4d529db12e211ef79c924ee3186c39d5), as released."""
CSI_GENERATED = ("csi_pb2.py", "csi_pb2.pyi", "csi_pb2_grpc.py", "csi_pb2_grpc.pyi")


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
    kubelet = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"--python_out={out_root}",
        f"--mypy_out={out_root}",
        str(KUBELET_PROTO),
    ]
    subprocess.run(kubelet, check=True, cwd=ROOT, env=env)
    csi = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        str(CSI_PROTO),
    ]
    subprocess.run(csi, check=True, cwd=ROOT, env=env)


def _outputs(out_root: Path) -> list[tuple[Path, Path]]:
    """(fresh under ``out_root``, committed) for every generated file."""
    pairs = [(out_root / PACKAGE_DIR / n, OUT_ROOT / PACKAGE_DIR / n) for n in GENERATED]
    kubelet_dir = KUBELET_PROTO.parent
    pairs += [(out_root / kubelet_dir / n, ROOT / kubelet_dir / n) for n in KUBELET_GENERATED]
    csi_dir = CSI_PROTO.parent
    pairs += [(out_root / csi_dir / n, ROOT / csi_dir / n) for n in CSI_GENERATED]
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        pairs = _outputs(Path(tmp))
        if args.check:
            stale = [
                str(committed.relative_to(ROOT))
                for fresh, committed in pairs
                if not committed.exists() or not filecmp.cmp(fresh, committed, False)
            ]
            if stale:
                print(
                    f"Error: generated code is stale: {', '.join(stale)}; run 'make proto'", file=sys.stderr
                )
                return 1
            print("generated code is fresh")
            return 0
        for fresh, committed in pairs:
            committed.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(fresh, committed)
        print(f"wrote {', '.join(str(c.relative_to(ROOT)) for _, c in pairs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
