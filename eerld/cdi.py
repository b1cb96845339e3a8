"""CDI: hand a Kubernetes container the eerld sockets of exactly its GPUs (the ``eerl-cdi`` command).

A container gets its GPUs as CDI devices (Container Device Interface): the NVIDIA device plugin allocates
``k8s.device-plugin.nvidia.com/gpu=<name>`` from the spec it writes itself, the NVIDIA runtime in CDI mode
and ``nvidia-ctk cdi generate`` use ``nvidia.com/gpu=<name>``; the container runtime applies each device's
``containerEdits`` (device nodes, mounts, hooks) from a spec file under ``/var/run/cdi``. eerld serves one
socket per GPU, ``<socket_dir>/<GPU UUID>/eerld.sock``: ``socket_dir`` (``--gpu-socket-dir``) is a
directory only root may enter, each GPU's directory has mode 0711 (anyone may reach the socket by name,
nobody may list or write it); a session opened through one may claim that GPU only (:mod:`eerld.grants`).
:func:`add_gpu_sockets` returns a copy of a spec in which each physical GPU's device also bind-mounts that
GPU's *directory*, read-only, at the same path, so a container reaches the sockets of its own GPUs and no
others:

- ``GPU-<uuid>`` (``uuid`` naming): that GPU's directory;
- any other name of a full GPU (``0``, ``gpu0``: ``index`` and ``type-index`` naming): the directory of
  the UUID-named device with the same GPU device node ``/dev/nvidiaN``;
- ``all``: every GPU's directory;
- MIG devices (``0:1``, ``mig0:1``, ``MIG-<uuid>``, any device with ``/dev/nvidia-caps`` nodes): none.
  Clocks belong to the whole physical GPU, so a container holding one MIG slice must never set the clocks
  under the other slices' tenants; such jobs run without eerl.
- a device of a shape this module does not know is left as it is, with a warning in the report.

Why the directory, not the socket: a bind mount holds the inode it was made from. A mounted socket file
stays the dead one when eerld restarts and binds a new socket; a mounted directory shows whatever eerld
creates in it, so a running container reaches the restarted eerld (the client reopens its session by
itself). The mount is ``{"hostPath": <socket_dir>/<uuid>, "containerPath": the same, "options": ["ro",
"nosuid", "nodev", "bind"]}``: the fields of CDI's ``Mount`` (``specs-go/config.go``; ``type`` is
optional) become an OCI mount as they are (``pkg/cdi/oci.go``), and runc takes any mount with ``bind`` in
its options for a bind mount whatever its type (``libcontainer/specconv/spec_linux.go``), creating the
container's mount point as a directory when the source is one. Read-only keeps a container (root in it
too) from writing into the host's directory; connecting to a socket needs no write access to the mount.

Which GPUs get a mount, by the command's flags (default: every GPU of the spec):

- ``--only-present`` (what the DaemonSet's sidecar runs): the GPUs whose directory exists in
  ``socket_dir``. A CDI mount whose source is missing makes the container runtime fail to create the
  container, and the directories exist once eerld has served their GPUs since the node booted (``/run``
  is a tmpfs). eerld removes its sockets when it stops, never the directories, so a GPU keeps its mount
  while eerld restarts: a container created then starts, runs without eerl, and reaches eerld when it is
  back. Before eerld's first start there is no directory and no mount, and GPU pods start as before.
- ``--only-serving``: the GPUs whose ``<socket_dir>/<uuid>/eerld.sock`` accepts a connection now. With
  directory mounts no deployment needs it any more (a mounted directory never makes container creation
  fail while eerld is restarting); it is kept for checking by hand which sockets eerld serves.
- ``--remove``: none (the spec as nvidia-ctk wrote it). The sidecar no longer runs it on SIGTERM: a
  SIGTERM comes with every DaemonSet update as much as with an uninstall, a GPU pod created during an
  update would then run without eerl for its whole life, and a mount of a directory that exists costs a
  pod nothing. After an uninstall, run it by hand (docs/deployment.md).

Patching is a sync: eerl's mounts (host path = container path, a GPU UUID directly under ``socket_dir``,
and the socket files ``<socket_dir>/<name>.sock`` that an older eerl-cdi mounted) that the spec should not
have are removed, missing ones added; running it twice changes nothing, and :func:`remove_gpu_sockets`
restores the spec. The transforms are pure; :func:`main` does the file I/O.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import posixpath
import re
import socket
import stat
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TextIO

import yaml

from eerld import __version__, files
from eerld.errors import ConfigError

GPU_KINDS = ("nvidia.com/gpu", "k8s.device-plugin.nvidia.com/gpu")
"""The spec kinds whose devices are workload GPUs: nvidia-ctk's default, and the NVIDIA device plugin's."""
ALL_DEVICE = "all"
GPU_SOCKET_NAME = "eerld.sock"
"""The socket in each GPU's directory (eerld.access.GPU_SOCKET_NAME; not imported, to keep this light)."""
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")
MAX_SPEC_BYTES = 16 * 1024 * 1024
SERVING_PROBE_TIMEOUT_S = 1.0
_GPU_UUID = re.compile(r"GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")
_GPU_NODE = re.compile(r"/dev/nvidia[0-9]+")
_MIG_NODE_PREFIX = "/dev/nvidia-caps/"
_EXIT_OK, _EXIT_ERROR, _EXIT_USAGE = 0, 1, 2


@dataclass(frozen=True, slots=True)
class CdiPatch:
    """A patched spec and what the patch did."""

    spec: dict[str, Any]
    mounts: tuple[tuple[str, str], ...]
    """(device name, GPU directory) of every eerl mount in ``spec``."""
    added: int
    removed: int
    mig_devices: tuple[str, ...]
    """MIG devices, which get no socket by design."""
    warnings: tuple[str, ...]
    """Devices left as they were, and why."""

    @property
    def changed(self) -> bool:
        """Whether ``spec`` differs from the input."""
        return bool(self.added or self.removed)


@dataclass(frozen=True, slots=True)
class _Device:
    name: str
    edits: dict[str, Any]
    kind: str  # "gpu", "other" (named by index), "all", "mig"
    uuid: str | None
    node: str | None


# -- the transform (pure) -----------------------------------------------------------------------------


def add_gpu_sockets(spec: Mapping[str, Any], socket_dir: str) -> dict[str, Any]:
    """A copy of ``spec`` where each physical GPU's device bind-mounts its GPU directory (see the module)."""
    return patch_spec(spec, socket_dir).spec


def remove_gpu_sockets(spec: Mapping[str, Any], socket_dir: str) -> CdiPatch:
    """A copy of ``spec`` without any eerl mount under ``socket_dir`` (the spec as nvidia-ctk wrote it)."""
    return patch_spec(spec, socket_dir, uuids=())


def patch_spec(spec: Mapping[str, Any], socket_dir: str, *, uuids: Collection[str] | None = None) -> CdiPatch:
    """Sync the eerl mounts of ``spec``: each GPU's device mounts its directory ``<socket_dir>/<uuid>``.

    ``uuids``: only these GPUs get their directory (default: every GPU the spec names); eerl mounts of the
    others, and any mount of a socket file an older eerl-cdi added, are removed. Raises :class:`ConfigError`
    when ``spec`` is not a CDI spec of GPUs.
    """
    check_spec(spec)
    directory = _socket_dir(socket_dir)
    result: dict[str, Any] = copy.deepcopy(dict(spec))
    warnings: list[str] = []
    devices = [_classify(i, d, warnings) for i, d in enumerate(result["devices"])]
    gpus = [d for d in devices if d is not None and d.kind == "gpu"]
    uuid_of_node: dict[str, str] = {}
    for gpu in gpus:
        if gpu.node is None:
            continue
        if uuid_of_node.setdefault(gpu.node, str(gpu.uuid)) != gpu.uuid:
            warnings.append(f"{gpu.node} belongs to two UUID-named devices; index names cannot be matched")
            uuid_of_node[gpu.node] = ""
    every = list(dict.fromkeys(str(g.uuid) for g in gpus))
    wanted = set(every) if uuids is None else set(uuids)
    added = removed = 0
    mounts: list[tuple[str, str]] = []
    mig: list[str] = []
    for device in devices:
        if device is None:
            continue
        if device.kind == "mig":
            mig.append(device.name)
            chosen: list[str] = []
        elif device.kind == "gpu":
            chosen = [str(device.uuid)] if device.uuid in wanted else []
        elif device.kind == "all":
            if not every:
                warnings.append(f"{device.name}: the spec has no UUID-named GPU devices to take sockets from")
            chosen = [u for u in every if u in wanted]
        else:
            uuid = uuid_of_node.get(str(device.node))
            if not uuid:
                warnings.append(
                    f"{device.name}: no UUID-named device has its GPU node {device.node} (generate the spec "
                    "with the uuid naming strategy too); left as is"
                )
                continue
            chosen = [uuid] if uuid in wanted else []
        paths = [f"{directory}/{u}" for u in chosen]
        plus, minus, kept = _sync_mounts(device, directory, paths, warnings)
        added += plus
        removed += minus
        mounts.extend((device.name, p) for p in kept)
    return CdiPatch(result, tuple(mounts), added, removed, tuple(mig), tuple(warnings))


def check_spec(spec: object) -> None:
    """Raise :class:`ConfigError` unless ``spec`` is a CDI spec of workload GPUs (kind in GPU_KINDS)."""
    if not isinstance(spec, Mapping):
        raise ConfigError(f"not a CDI spec: expected a mapping at the top, got {_type_name(spec)}")
    if not isinstance(spec.get("cdiVersion"), str):
        raise ConfigError("not a CDI spec: no cdiVersion")
    kind = spec.get("kind")
    if not isinstance(kind, str):
        raise ConfigError("not a CDI spec: no kind")
    if kind not in GPU_KINDS:
        raise ConfigError(
            f"kind: {kind!r} is not a spec of workload GPUs (expected {' or '.join(GPU_KINDS)})"
        )
    if not isinstance(spec.get("devices"), list):
        raise ConfigError("not a CDI spec: devices is not a list")


def _socket_dir(socket_dir: str) -> str:
    directory = socket_dir.rstrip("/")
    if not posixpath.isabs(socket_dir) or not directory or posixpath.normpath(directory) != directory:
        raise ConfigError(f"--socket-dir: expected a normalised absolute path, got {socket_dir!r}")
    return directory


def _type_name(value: object) -> str:
    return "nothing" if value is None else type(value).__name__


def _classify(index: int, device: object, warnings: list[str]) -> _Device | None:
    """What a device is, or None (with a warning) when its shape is unknown."""
    if not isinstance(device, dict) or not isinstance(device.get("name"), str):
        warnings.append(f"devices[{index}]: not a device with a name; left as is")
        return None
    name: str = device["name"]
    edits = device.get("containerEdits")
    nodes = edits.get("deviceNodes", []) if isinstance(edits, dict) else None
    if (
        not isinstance(edits, dict)
        or not isinstance(nodes, list)
        or not all(isinstance(n, dict) and isinstance(n.get("path"), str) for n in nodes)
        or not isinstance(edits.get("mounts", []), list)
    ):
        warnings.append(f"{name}: containerEdits of an unknown shape; left as is")
        return None
    paths = [str(n["path"]) for n in nodes]
    gpu_nodes = [p for p in paths if _GPU_NODE.fullmatch(p)]
    node = gpu_nodes[0] if len(gpu_nodes) == 1 else None
    if name == ALL_DEVICE:
        return _Device(name, edits, "all", None, None)
    if name.startswith("MIG-") or ":" in name or any(p.startswith(_MIG_NODE_PREFIX) for p in paths):
        return _Device(name, edits, "mig", None, None)
    if _GPU_UUID.fullmatch(name):
        return _Device(name, edits, "gpu", name, node)
    if node is None:
        warnings.append(f"{name}: not one GPU's device ({len(gpu_nodes)} /dev/nvidiaN nodes); left as is")
        return None
    return _Device(name, edits, "other", None, node)


def _sync_mounts(
    device: _Device, directory: str, paths: list[str], warnings: list[str]
) -> tuple[int, int, list[str]]:
    """Make ``paths`` the device's eerl mounts; (added, removed, the device's eerl mounts now)."""
    kept: list[Any] = []
    ours: list[str] = []
    foreign: list[str] = []
    removed = 0
    for mount in device.edits.get("mounts", []):
        target = mount.get("containerPath") if isinstance(mount, dict) else None
        if isinstance(target, str) and mount.get("hostPath") == target and _is_eerl_path(target, directory):
            current = mount.get("options") == list(MOUNT_OPTIONS) and "type" not in mount
            if target in paths and target not in ours and current:
                ours.append(target)
                kept.append(mount)
            else:  # another GPU's, a duplicate, an older eerl-cdi's socket file or options: replaced
                removed += 1
            continue
        if target in paths and target not in foreign:
            warnings.append(f"{device.name}: {target} is mounted from {mount.get('hostPath')!r}; left as is")
            foreign.append(str(target))
        kept.append(mount)
    missing = [p for p in paths if p not in ours and p not in foreign]
    kept.extend({"hostPath": p, "containerPath": p, "options": list(MOUNT_OPTIONS)} for p in missing)
    if missing or removed:
        if kept:
            device.edits["mounts"] = kept
        else:
            del device.edits["mounts"]
    return len(missing), removed, [p for p in paths if p in ours or p in missing]


def _is_eerl_path(target: str, directory: str) -> bool:
    """Whether ``target`` is an eerl-cdi mount point: a GPU's directory, or an older version's socket file."""
    parent, name = posixpath.split(target)
    return parent == directory and (_GPU_UUID.fullmatch(name) is not None or name.endswith(".sock"))


# -- YAML and JSON ------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """YAML 1.2 core scalars, as Go's YAML (nvidia-ctk, containerd) reads them.

    PyYAML follows YAML 1.1, where ``1:0`` (a MIG device's index name) is the base-60 integer 60, ``on``
    a boolean and ``2024-01-01`` a date; rewritten, the spec would rename the device. Here they stay strings.
    """


_YAML11_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("bool", "int", "float", "timestamp")}
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _YAML11_TAGS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789")
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*|[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+|\.(?:inf|Inf|INF))$"),
    list("-+.0123456789"),
)


class _Dumper(yaml.SafeDumper):
    """Block style with indented lists; quotes every string that YAML 1.1 or Go could read as a number."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


_Dumper.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$"),
    list("-+.0123456789"),
)


def spec_format(path: Path) -> str:
    """``json`` or ``yaml``, by the file's extension; ConfigError for any other."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "json"
    if suffix in (".yaml", ".yml"):
        return "yaml"
    raise ConfigError(f"{path}: expected a .yaml or .json file")


def load_spec(text: str, fmt: str) -> Any:
    """The document in ``text`` (``json`` or ``yaml``); ConfigError when it does not parse."""
    try:
        if fmt == "json":
            return json.loads(text)
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader with YAML 1.2 scalars
    except (ValueError, yaml.YAMLError) as e:
        raise ConfigError(f"not valid {fmt.upper()}: {_one_line(str(e))}") from e


def dump_spec(spec: Mapping[str, Any], fmt: str) -> str:
    """``spec`` as ``json`` or ``yaml`` text (YAML with nvidia-ctk's leading ``---``)."""
    if fmt == "json":
        return json.dumps(spec, indent=2) + "\n"
    body = yaml.dump(dict(spec), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1 << 16)
    return "---\n" + body


def _one_line(text: str) -> str:
    return " ".join(text.split())


# -- the command (I/O at the edge) --------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="eerl-cdi",
        description="Give each GPU device of an NVIDIA CDI spec a bind mount of its eerld socket directory.",
    )
    p.add_argument("--version", action="version", version=f"eerl-cdi {__version__}")
    p.add_argument("--nvidia-spec", type=Path, required=True, help="the CDI spec (.yaml or .json) to patch")
    p.add_argument(
        "--socket-dir", required=True, help="eerld's --gpu-socket-dir as the host sees it (/run/eerld/gpus)"
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, help="write the patched spec here (default: standard output)")
    where.add_argument(
        "--in-place", action="store_true", help="replace --nvidia-spec atomically, only when it changes"
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--only-present",
        action="store_true",
        help="mount only the GPU directories that exist in --socket-dir (the others' mounts are removed)",
    )
    which.add_argument(
        "--only-serving",
        action="store_true",
        help="mount only the GPUs whose socket accepts a connection now (the others' mounts are removed)",
    )
    which.add_argument("--remove", action="store_true", help="remove every eerl mount (restore the spec)")
    return p


def present_gpus(socket_dir: str) -> tuple[str, ...]:
    """The UUIDs of the GPUs whose directory is in ``socket_dir`` (eerld made it; it outlives restarts)."""
    try:
        names = sorted(os.listdir(socket_dir))
    except OSError:
        return ()
    return tuple(n for n in names if _GPU_UUID.fullmatch(n) and _is_dir(os.path.join(socket_dir, n)))


def serving_gpus(socket_dir: str) -> tuple[str, ...]:
    """The UUIDs of the GPUs whose ``<socket_dir>/<uuid>/eerld.sock`` accepts a connection now."""
    return tuple(
        u for u in present_gpus(socket_dir) if _accepts(os.path.join(socket_dir, u, GPU_SOCKET_NAME))
    )


def _is_dir(path: str) -> bool:
    """A directory itself, not a symlink to one (eerld makes directories; a link could point anywhere)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _accepts(path: str) -> bool:
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(SERVING_PROBE_TIMEOUT_S)
            probe.connect(path)
    except OSError:
        return False
    return True


def _read(path: Path) -> tuple[str, os.stat_result]:
    try:
        with path.open("rb") as f:
            before = os.fstat(f.fileno())
            if not stat.S_ISREG(before.st_mode):
                raise ConfigError("not a regular file")
            data = f.read(MAX_SPEC_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}") from e
    if len(data) > MAX_SPEC_BYTES:
        raise ConfigError(f"larger than {MAX_SPEC_BYTES} bytes; not a CDI spec")
    try:
        return data.decode(), before
    except UnicodeDecodeError as e:
        raise ConfigError("not UTF-8 text") from e


def _chosen(args: argparse.Namespace) -> tuple[str, ...] | None:
    """The GPUs to mount by the flags: the present, the serving, none (--remove), or every one (None)."""
    if args.only_present:
        return present_gpus(args.socket_dir)
    if args.only_serving:
        return serving_gpus(args.socket_dir)
    return () if args.remove else None


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run eerl-cdi; return the exit status (0 ok, 1 could not write, 2 bad usage or input)."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else _EXIT_USAGE
    except ConfigError as e:
        err.write(f"Error: {_one_line(str(e))}\n")
        return _EXIT_USAGE
    source: Path = args.nvidia_spec
    try:
        fmt = spec_format(source)
        if args.out is not None and spec_format(args.out) != fmt:
            raise ConfigError(
                f"--out: {args.out} would get {fmt.upper()}; give it the extension of the input"
            )
        if args.in_place and source.is_symlink():
            raise ConfigError(f"--in-place: {source} is a symlink; patch the file it points to")
    except ConfigError as e:
        err.write(f"Error: {_one_line(str(e))}\n")
        return _EXIT_USAGE
    try:
        text, before = _read(source)
        spec = load_spec(text, fmt)
        uuids = _chosen(args)
        patch = patch_spec(spec, args.socket_dir, uuids=uuids)
    except ConfigError as e:
        err.write(f"Error: {source}: {_one_line(str(e))}\n")
        return _EXIT_USAGE
    for warning in patch.warnings:
        err.write(f"eerl-cdi: warning: {source}: {_one_line(warning)}\n")
    rendered = dump_spec(patch.spec, fmt)
    target = source if args.in_place else args.out
    try:
        if target is None:
            out.write(rendered)
            return _EXIT_OK
        if patch.changed or not args.in_place:
            mode = stat.S_IMODE(before.st_mode) if args.in_place and before is not None else 0o644
            # The temp file ends in .tmp, which CDI's spec cache ignores.
            files.atomic_write_bytes(
                target, rendered.encode(), mode, unchanged_since=before if args.in_place else None
            )
    except files.ChangedMeanwhile:
        err.write(f"Error: {source}: changed while being patched; nothing written, run again\n")
        return _EXIT_ERROR
    except OSError as e:
        err.write(f"Error: {target}: cannot write: {e.strerror or e}\n")
        return _EXIT_ERROR
    verb = "patched" if patch.changed else "unchanged"
    mig = f"; MIG devices without a socket: {', '.join(patch.mig_devices)}" if patch.mig_devices else ""
    err.write(
        f"eerl-cdi: {target}: {verb}, {len(patch.mounts)} GPU directory mounts "
        f"(+{patch.added} -{patch.removed}){mig}\n"
    )
    return _EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
