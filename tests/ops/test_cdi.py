"""eerl-cdi: the NVIDIA CDI spec, patched so that each GPU's device bind-mounts its eerld socket directory."""

from __future__ import annotations

import copy
import io
import json
import os
import socket
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from eerld import access
from eerld.cdi import (
    GPU_SOCKET_NAME,
    add_gpu_sockets,
    dump_spec,
    load_spec,
    main,
    patch_spec,
    present_gpus,
    remove_gpu_sockets,
    serving_gpus,
)
from eerld.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "data/nvidia-cdi.yaml"
SOCKET_DIR = "/run/eerld/gpus"
GPU0 = "GPU-6f8b2a3e-1c4d-4b5e-9a7f-0e1d2c3b4a59"
GPU1 = "GPU-0d3c9e8a-7b21-4f6c-8e5d-a1b2c3d4e5f6"
MIG = "MIG-3e1f5c7a-9b2d-5e4f-8a6c-b7d8e9f0a1b2"
OPTIONS = ["ro", "nosuid", "nodev", "bind"]


def nvidia_spec() -> dict[str, Any]:
    spec: dict[str, Any] = load_spec(FIXTURE.read_text(), "yaml")
    return spec


def plugin_spec() -> dict[str, Any]:
    """The NVIDIA device plugin's own spec: its kind, UUID names only (its default), no "all" device."""
    spec = nvidia_spec()
    spec["kind"] = "k8s.device-plugin.nvidia.com/gpu"
    spec["devices"] = [d for d in spec["devices"] if d["name"].startswith(("GPU-", "MIG-"))]
    return spec


def device(spec: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = (d for d in spec["devices"] if d["name"] == name)
    return found  # type: ignore[no-any-return]


def mounted(spec: dict[str, Any], name: str) -> list[str]:
    """The container paths under SOCKET_DIR that the device mounts."""
    mounts = device(spec, name)["containerEdits"].get("mounts", [])
    return [m["containerPath"] for m in mounts if m["containerPath"].startswith(SOCKET_DIR + "/")]


def gpu_dir(uuid: str, directory: str = SOCKET_DIR) -> str:
    return f"{directory}/{uuid}"


def old_mount(uuid: str) -> dict[str, Any]:
    """The mount of a GPU's socket file, as the previous eerl-cdi added it."""
    path = f"{SOCKET_DIR}/{uuid}.sock"
    return {"hostPath": path, "containerPath": path, "options": ["bind"]}


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "nvidia.yaml"
    path.write_text(FIXTURE.read_text())
    path.chmod(0o644)
    return path


@pytest.fixture
def gpu_sockets(sock_dir: Path) -> Iterator[Path]:
    """eerld's socket directory: GPU 0's socket is served, GPU 1's is stale (eerld restarting), and
    there are a GPU directory the spec does not name, a symlink named as a GPU and a stray file."""
    directory = sock_dir / "gpus"
    directory.mkdir(mode=0o700)
    for uuid in (GPU0, GPU1, "GPU-11111111-2222-3333-4444-555555555555"):
        (directory / uuid).mkdir(mode=0o711)
    (directory / "GPU-99999999-2222-3333-4444-555555555555").symlink_to(directory / GPU0)
    (directory / "README").touch()
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(directory / GPU0 / GPU_SOCKET_NAME))
    live.listen()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
        stale.bind(str(directory / GPU1 / GPU_SOCKET_NAME))
    try:
        yield directory
    finally:
        live.close()


class TestFixture:
    def test_the_fixture_has_the_devices_nvidia_ctk_names(self) -> None:
        """Index and UUID names per full GPU, the MIG device's two names, then "all"; no mounts yet."""
        spec = nvidia_spec()
        assert [d["name"] for d in spec["devices"]] == ["0", GPU0, "1", GPU1, "2:0", MIG, "all"]
        assert all("mounts" not in d["containerEdits"] for d in spec["devices"])


class TestAddGpuSockets:
    def test_a_uuid_named_gpu_bind_mounts_its_own_directory_read_only_at_the_same_path(self) -> None:
        """GPU-<uuid> gets {hostPath = containerPath = <dir>/<uuid>, a read-only bind, no type}, no more."""
        mounts = device(add_gpu_sockets(nvidia_spec(), SOCKET_DIR), GPU0)["containerEdits"]["mounts"]
        assert mounts == [{"hostPath": gpu_dir(GPU0), "containerPath": gpu_dir(GPU0), "options": OPTIONS}]

    def test_the_socket_in_each_gpu_directory_is_the_one_eerld_serves(self) -> None:
        """eerl-cdi's name of the socket in a GPU's directory is eerld's."""
        assert GPU_SOCKET_NAME == access.GPU_SOCKET_NAME

    def test_an_index_named_gpu_gets_the_directory_of_the_gpu_with_its_device_node(self) -> None:
        """ "0" shares /dev/nvidia0 with GPU0's UUID-named device, "1" /dev/nvidia1 with GPU1's."""
        spec = add_gpu_sockets(nvidia_spec(), SOCKET_DIR)
        assert (mounted(spec, "0"), mounted(spec, "1")) == ([gpu_dir(GPU0)], [gpu_dir(GPU1)])

    def test_all_gets_every_gpus_directory(self) -> None:
        """The "all" device mounts the directories of both full GPUs."""
        assert mounted(add_gpu_sockets(nvidia_spec(), SOCKET_DIR), "all") == [gpu_dir(GPU0), gpu_dir(GPU1)]

    def test_mig_devices_get_no_socket(self) -> None:
        """Neither name of the MIG device mounts anything, and the report lists both."""
        patch = patch_spec(nvidia_spec(), SOCKET_DIR)
        assert (mounted(patch.spec, "2:0"), mounted(patch.spec, MIG)) == ([], [])
        assert patch.mig_devices == ("2:0", MIG)

    def test_only_mounts_change_and_the_input_is_left_alone(self) -> None:
        """Apart from the mounts the patched spec equals the input, which is not modified."""
        original = nvidia_spec()
        given = copy.deepcopy(original)
        patched = add_gpu_sockets(given, SOCKET_DIR)
        assert given == original
        for d in patched["devices"]:
            d["containerEdits"].pop("mounts", None)
        assert patched == original

    def test_running_it_twice_adds_nothing(self) -> None:
        """Patching a patched spec changes nothing and says so."""
        once = add_gpu_sockets(nvidia_spec(), SOCKET_DIR)
        again = patch_spec(once, SOCKET_DIR)
        assert (again.spec, again.changed) == (once, False)

    def test_remove_restores_the_spec_as_nvidia_ctk_wrote_it(self) -> None:
        """remove_gpu_sockets of a patched spec is the original spec."""
        patched = add_gpu_sockets(nvidia_spec(), SOCKET_DIR)
        assert remove_gpu_sockets(patched, SOCKET_DIR).spec == nvidia_spec()

    def test_socket_file_mounts_of_the_previous_version_are_replaced_by_directory_mounts(self) -> None:
        """A spec with the old <dir>/<uuid>.sock mounts, patched again, has only the directory mounts."""
        spec = nvidia_spec()
        for name, uuids in (
            ("0", [GPU0]),
            (GPU0, [GPU0]),
            ("1", [GPU1]),
            (GPU1, [GPU1]),
            ("all", [GPU0, GPU1]),
        ):
            device(spec, name)["containerEdits"]["mounts"] = [old_mount(u) for u in uuids]
        patch = patch_spec(spec, SOCKET_DIR)
        assert patch.spec == add_gpu_sockets(nvidia_spec(), SOCKET_DIR)
        assert (patch.added, patch.removed) == (6, 6)

    def test_remove_takes_out_the_previous_versions_socket_file_mounts_too(self) -> None:
        """--remove on a spec the previous version patched gives back the spec nvidia-ctk wrote."""
        spec = nvidia_spec()
        device(spec, GPU0)["containerEdits"]["mounts"] = [old_mount(GPU0)]
        assert remove_gpu_sockets(spec, SOCKET_DIR).spec == nvidia_spec()

    def test_a_directory_mount_with_other_options_is_brought_up_to_date(self) -> None:
        """An eerl mount of the right directory with plain ["bind"] becomes the read-only bind."""
        spec = nvidia_spec()
        path = gpu_dir(GPU0)
        device(spec, GPU0)["containerEdits"]["mounts"] = [
            {"hostPath": path, "containerPath": path, "options": ["bind"]}
        ]
        patch = patch_spec(spec, SOCKET_DIR)
        assert device(patch.spec, GPU0)["containerEdits"]["mounts"] == [
            {"hostPath": path, "containerPath": path, "options": OPTIONS}
        ]
        assert (patch.added, patch.removed) == (6, 1)  # GPU0's, and the five other devices' mounts

    def test_only_the_named_gpus_keep_their_directories(self) -> None:
        """With uuids={GPU1}, GPU0's mounts go from "0", its UUID device and "all"; GPU1's stay."""
        patch = patch_spec(add_gpu_sockets(nvidia_spec(), SOCKET_DIR), SOCKET_DIR, uuids={GPU1})
        assert [mounted(patch.spec, n) for n in ("0", GPU0, "1", GPU1, "all")] == [
            [],
            [],
            [gpu_dir(GPU1)],
            [gpu_dir(GPU1)],
            [gpu_dir(GPU1)],
        ]
        assert (patch.added, patch.removed) == (0, 3)

    def test_the_device_plugins_spec_is_patched_too(self) -> None:
        """The device plugin's kind with UUID names only: each GPU mounts its directory, MIG none."""
        spec = add_gpu_sockets(plugin_spec(), SOCKET_DIR)
        assert [mounted(spec, n) for n in (GPU0, GPU1, MIG)] == [[gpu_dir(GPU0)], [gpu_dir(GPU1)], []]

    def test_an_index_name_without_a_uuid_twin_is_left_as_is_with_a_warning(self) -> None:
        """A spec named by index only cannot be matched to sockets: unchanged, one warning per device."""
        spec = nvidia_spec()
        spec["devices"] = [d for d in spec["devices"] if d["name"] in ("0", "1")]
        patch = patch_spec(spec, SOCKET_DIR)
        assert (patch.spec, patch.changed) == (spec, False)
        assert [w.split(":")[0] for w in patch.warnings] == ["0", "1"]

    def test_a_device_of_unknown_shape_is_left_as_is_with_a_warning(self) -> None:
        """A device whose containerEdits is not a mapping is not touched; the others still are."""
        spec = nvidia_spec()
        device(spec, "1")["containerEdits"] = ["not", "edits"]
        patch = patch_spec(spec, SOCKET_DIR)
        assert device(patch.spec, "1")["containerEdits"] == ["not", "edits"]
        assert mounted(patch.spec, GPU1) == [gpu_dir(GPU1)]
        assert any(w.startswith("1: ") for w in patch.warnings)

    def test_someone_elses_mount_at_a_gpu_directory_is_kept_and_reported(self) -> None:
        """A mount of another source at GPU0's directory stays the only one there, with a warning."""
        spec = nvidia_spec()
        other = {"hostPath": "/somewhere/else", "containerPath": gpu_dir(GPU0)}
        device(spec, GPU0)["containerEdits"]["mounts"] = [other]
        patch = patch_spec(spec, SOCKET_DIR)
        assert device(patch.spec, GPU0)["containerEdits"]["mounts"] == [other]
        assert any("/somewhere/else" in w for w in patch.warnings)

    @pytest.mark.parametrize(
        "spec",
        [
            ["a", "list"],
            "a string",
            None,
            {"kind": "nvidia.com/gpu", "devices": []},
            {"cdiVersion": "0.7.0", "kind": "nvidia.com/gpu", "devices": {"0": {}}},
        ],
    )
    def test_what_is_not_a_cdi_spec_is_refused(self, spec: Any) -> None:
        """Not a mapping, no cdiVersion, or devices not a list: ConfigError."""
        with pytest.raises(ConfigError, match="not a CDI spec"):
            patch_spec(spec, SOCKET_DIR)

    def test_a_spec_of_another_kind_is_refused(self) -> None:
        """The management spec (every GPU, for system containers) is not a spec of workload GPUs."""
        spec = nvidia_spec()
        spec["kind"] = "management.nvidia.com/gpu"
        with pytest.raises(ConfigError, match=r"kind: 'management\.nvidia\.com/gpu'"):
            patch_spec(spec, SOCKET_DIR)

    def test_a_relative_socket_directory_is_refused(self) -> None:
        """The socket directory is a host path: it must be absolute."""
        with pytest.raises(ConfigError, match="--socket-dir"):
            patch_spec(nvidia_spec(), "run/eerld/gpus")


class TestYaml:
    def test_an_unquoted_mig_index_name_stays_a_string(self) -> None:
        """ "1:0" is read as Go reads it (a string, not YAML 1.1's base-60 60) and written quoted."""
        spec = load_spec("cdiVersion: 0.7.0\nname: 1:0\n", "yaml")
        assert spec["name"] == "1:0"
        assert yaml.safe_load(dump_spec(spec, "yaml"))["name"] == "1:0"

    def test_yaml_1_1_booleans_and_dates_stay_strings_and_numbers_stay_numbers(self) -> None:
        """on, no and 2024-01-01 are strings; 195 and true are what they look like."""
        spec = load_spec("a: on\nb: no\nc: 2024-01-01\nd: 195\ne: true\n", "yaml")
        assert spec == {"a": "on", "b": "no", "c": "2024-01-01", "d": 195, "e": True}


class TestCommand:
    def test_the_console_script_is_declared(self) -> None:
        """pyproject.toml installs eerl-cdi as eerld.cdi:main."""
        project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        assert project["scripts"]["eerl-cdi"] == "eerld.cdi:main"

    def test_prints_the_patched_yaml_spec(self, spec_file: Path) -> None:
        """Without --out or --in-place the patched spec goes to standard output, as YAML."""
        code, out, _ = run("--nvidia-spec", str(spec_file), "--socket-dir", SOCKET_DIR)
        assert (code, out.startswith("---\n")) == (0, True)
        assert load_spec(out, "yaml") == add_gpu_sockets(nvidia_spec(), SOCKET_DIR)

    def test_a_json_spec_comes_back_as_json(self, tmp_path: Path) -> None:
        """The device plugin's JSON spec is read and written as JSON."""
        path = tmp_path / "k8s.device-plugin.nvidia.com-gpu.json"
        path.write_text(json.dumps(plugin_spec()))
        code, out, _ = run("--nvidia-spec", str(path), "--socket-dir", SOCKET_DIR)
        assert (code, json.loads(out)) == (0, add_gpu_sockets(plugin_spec(), SOCKET_DIR))

    def test_out_writes_the_patched_spec_to_a_file(self, spec_file: Path, tmp_path: Path) -> None:
        """--out FILE gets the patched spec; the input is left as it was."""
        target = tmp_path / "patched.yaml"
        code, out, _ = run("--nvidia-spec", str(spec_file), "--socket-dir", SOCKET_DIR, "--out", str(target))
        assert (code, out) == (0, "")
        assert load_spec(target.read_text(), "yaml") == add_gpu_sockets(nvidia_spec(), SOCKET_DIR)
        assert spec_file.read_text() == FIXTURE.read_text()

    def test_in_place_replaces_the_file_keeping_its_mode_and_leaving_no_temp_file(
        self, spec_file: Path
    ) -> None:
        """--in-place renames a patched copy over the spec: same mode, nothing else left in the directory."""
        code, out, _ = run("--nvidia-spec", str(spec_file), "--socket-dir", SOCKET_DIR, "--in-place")
        assert (code, out) == (0, "")
        assert load_spec(spec_file.read_text(), "yaml") == add_gpu_sockets(nvidia_spec(), SOCKET_DIR)
        assert (spec_file.stat().st_mode & 0o777, os.listdir(spec_file.parent)) == (0o644, [spec_file.name])

    def test_in_place_leaves_an_up_to_date_spec_untouched(self, spec_file: Path) -> None:
        """A second --in-place finds nothing to do and does not replace the file."""
        argv = ("--nvidia-spec", str(spec_file), "--socket-dir", SOCKET_DIR, "--in-place")
        run(*argv)
        inode = spec_file.stat().st_ino
        code, _, err = run(*argv)
        assert (code, spec_file.stat().st_ino, "unchanged" in err) == (0, inode, True)

    def test_remove_in_place_restores_the_spec(self, spec_file: Path) -> None:
        """--remove --in-place after a patch gives back the spec nvidia-ctk wrote."""
        run("--nvidia-spec", str(spec_file), "--socket-dir", SOCKET_DIR, "--in-place")
        code, _, _ = run(
            "--nvidia-spec", str(spec_file), "--socket-dir", SOCKET_DIR, "--remove", "--in-place"
        )
        assert (code, load_spec(spec_file.read_text(), "yaml")) == (0, nvidia_spec())

    def test_only_present_mounts_the_gpu_directories_that_exist(
        self, spec_file: Path, gpu_sockets: Path
    ) -> None:
        """GPU0 and GPU1 have their directory (GPU1's socket is stale: eerld restarting): both are mounted."""
        directory = str(gpu_sockets)
        code, out, _ = run("--nvidia-spec", str(spec_file), "--socket-dir", directory, "--only-present")
        assert (code, load_spec(out, "yaml")) == (0, add_gpu_sockets(nvidia_spec(), directory))

    def test_only_present_leaves_out_a_gpu_without_its_directory(
        self, spec_file: Path, sock_dir: Path
    ) -> None:
        """Only GPU1's directory exists (GPU0's was never made): GPU0's devices mount nothing."""
        directory = sock_dir / "gpus"
        directory.mkdir(mode=0o700)
        (directory / GPU1).mkdir(mode=0o711)
        code, out, _ = run("--nvidia-spec", str(spec_file), "--socket-dir", str(directory), "--only-present")
        assert (code, load_spec(out, "yaml")) == (
            0,
            patch_spec(nvidia_spec(), str(directory), uuids={GPU1}).spec,
        )

    def test_only_serving_mounts_the_gpus_whose_socket_answers(
        self, spec_file: Path, gpu_sockets: Path
    ) -> None:
        """GPU0's <uuid>/eerld.sock accepts a connection, GPU1's is stale: only GPU0's devices mount."""
        directory = str(gpu_sockets)
        code, out, _ = run("--nvidia-spec", str(spec_file), "--socket-dir", directory, "--only-serving")
        spec = load_spec(out, "yaml")
        assert code == 0
        has_mounts = [
            device(spec, n)["containerEdits"].get("mounts", []) != [] for n in ("0", GPU0, "1", GPU1)
        ]
        assert has_mounts == [True, True, False, False]
        assert [m["hostPath"] for m in device(spec, "all")["containerEdits"]["mounts"]] == [
            gpu_dir(GPU0, directory)
        ]

    def test_a_gpu_is_present_by_its_own_directory_and_serving_by_its_socket(self, gpu_sockets: Path) -> None:
        """Present: GPU-named real directories (no symlink, no stray file); serving: their socket answers."""
        other = "GPU-11111111-2222-3333-4444-555555555555"
        assert present_gpus(str(gpu_sockets)) == tuple(sorted((GPU0, GPU1, other)))
        assert serving_gpus(str(gpu_sockets)) == (GPU0,)

    @pytest.mark.parametrize("flag", ["--only-present", "--only-serving"])
    def test_without_a_socket_directory_nothing_is_mounted(
        self, spec_file: Path, tmp_path: Path, flag: str
    ) -> None:
        """No socket directory (eerld never ran): the spec comes out without any eerl mount."""
        absent = str(tmp_path / "absent")
        code, out, _ = run("--nvidia-spec", str(spec_file), "--socket-dir", absent, flag)
        assert (code, load_spec(out, "yaml")) == (0, nvidia_spec())

    @pytest.mark.parametrize(
        ("name", "content", "message"),
        [
            (
                "nvidia.yaml",
                "- not\n- a mapping\n",
                "not a CDI spec: expected a mapping at the top, got list",
            ),
            ("nvidia.yaml", "hello: world\n", "not a CDI spec: no cdiVersion"),
            ("nvidia.yaml", "cdiVersion: 0.7.0\nkind: nvidia.com/imex-channel\ndevices: []\n", "kind: "),
            (
                "nvidia.json",
                '{"cdiVersion": "0.7.0", "kind": "nvidia.com/gpu", "devices": {}}',
                "devices is not",
            ),
            ("nvidia.yaml", "devices: [\n", "not valid YAML"),
            ("nvidia.json", "{", "not valid JSON"),
            ("nvidia.txt", "", "expected a .yaml or .json file"),
        ],
    )
    def test_bad_input_exits_2_with_one_error_line(
        self, tmp_path: Path, name: str, content: str, message: str
    ) -> None:
        """Each bad spec gives exit status 2, nothing on stdout and one `Error: …` line naming the problem."""
        path = tmp_path / name
        path.write_text(content)
        code, out, err = run("--nvidia-spec", str(path), "--socket-dir", SOCKET_DIR)
        assert (code, out, err.count("\n"), err.startswith("Error: ")) == (2, "", 1, True)
        assert message in err

    @pytest.mark.parametrize(
        "argv",
        [
            ["--socket-dir", SOCKET_DIR],
            ["--nvidia-spec", "/nonexistent/nvidia.yaml", "--socket-dir", SOCKET_DIR],
            ["--nvidia-spec", str(FIXTURE), "--socket-dir", "relative/gpus"],
            ["--nvidia-spec", str(FIXTURE), "--socket-dir", SOCKET_DIR, "--remove", "--only-serving"],
            ["--nvidia-spec", str(FIXTURE), "--socket-dir", SOCKET_DIR, "--only-present", "--only-serving"],
        ],
    )
    def test_bad_usage_exits_2_with_one_error_line(self, argv: list[str]) -> None:
        """A missing flag, a missing file, a relative directory or clashing flags: exit 2, one line."""
        code, out, err = run(*argv)
        assert (code, out, err.count("\n"), err.startswith("Error: ")) == (2, "", 1, True)
