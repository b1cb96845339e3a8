"""ClientConfig builders and the EERL_* environment."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from eerl import DEFAULT_SOCKET_PATH, ClientConfig, ConfigError
from eerl.config import DEFAULT_RUN_DIR, discover_sockets


class TestBuilders:
    def test_uds_targets_the_absolute_socket_path(self, tmp_path: Path) -> None:
        config = ClientConfig.uds(tmp_path / "eerld.sock")
        assert config.transport == "uds"
        assert config.target == f"unix://{tmp_path}/eerld.sock"

    def test_uds_defaults_to_the_standard_socket(self) -> None:
        assert ClientConfig.uds().socket_path == DEFAULT_SOCKET_PATH

    def test_tcp_reads_pem_files_and_accepts_bytes(self, tmp_path: Path) -> None:
        (tmp_path / "ca.pem").write_bytes(b"CA")
        config = ClientConfig.tcp("node1:50051", root_cert=tmp_path / "ca.pem", cert=b"CERT", key=b"KEY")
        assert (config.target, config.root_cert_pem, config.cert_chain_pem, config.private_key_pem) == (
            "node1:50051",
            b"CA",
            b"CERT",
            b"KEY",
        )

    def test_tcp_names_an_unreadable_certificate(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match="root_cert"):
            ClientConfig.tcp("node1:50051", root_cert=tmp_path / "missing.pem", cert=b"C", key=b"K")

    def test_tcp_requires_all_three_tls_parts(self) -> None:
        with pytest.raises(ConfigError, match="tls"):
            ClientConfig(transport="tcp", address="node1:1", root_cert_pem=b"CA")

    def test_the_config_is_frozen(self) -> None:
        with pytest.raises(dataclasses.FrozenInstanceError):
            ClientConfig.uds().queue_size = 3  # type: ignore[misc]

    @pytest.mark.parametrize(
        "field", ["rpc_timeout_s", "stale_after_s", "reconnect_initial_s", "reconnect_max_s"]
    )
    def test_tuning_times_must_be_positive(self, field: str) -> None:
        with pytest.raises(ConfigError, match=field):
            dataclasses.replace(ClientConfig.uds(), **{field: 0.0})

    def test_the_queue_must_hold_a_begin_and_its_end(self) -> None:
        with pytest.raises(ConfigError, match="queue_size"):
            dataclasses.replace(ClientConfig.uds(), queue_size=1)

    def test_uds_with_several_sockets_opens_on_the_first_and_is_scoped(self) -> None:
        config = ClientConfig.uds(
            "/r/gpus/a.sock", Path("/r/gpus/b.sock"), "/r/gpus/a.sock", "/r/gpus/b.sock"
        )
        assert (config.socket_path, config.ticket_socket_paths, config.scoped) == (
            "/r/gpus/a.sock",
            ("/r/gpus/b.sock",),
            True,
        )
        assert config.socket_paths == ("/r/gpus/a.sock", "/r/gpus/b.sock")

    def test_one_socket_is_the_shared_one_unless_said_otherwise(self) -> None:
        assert not ClientConfig.uds("/r/eerld.sock").scoped
        assert ClientConfig.uds("/r/grants/job-1.sock", scoped=True).scoped

    def test_ticket_sockets_given_as_a_list_become_a_tuple_and_make_the_config_scoped(self) -> None:
        config = ClientConfig(transport="uds", socket_path="/a.sock", ticket_socket_paths=["/b.sock"])  # type: ignore[arg-type]
        assert (config.ticket_socket_paths, config.scoped) == (("/b.sock",), True)

    def test_ticket_sockets_need_a_unix_socket_config(self) -> None:
        with pytest.raises(ConfigError, match="ticket_socket_paths"):
            ClientConfig(
                transport="tcp",
                address="n:1",
                root_cert_pem=b"C",
                cert_chain_pem=b"C",
                private_key_pem=b"K",
                ticket_socket_paths=("/b.sock",),
            )


class TestFromEnv:
    @pytest.mark.skipif(
        any(os.path.exists(os.path.join(DEFAULT_RUN_DIR, d)) for d in ("gpus", "grants")),
        reason="this machine runs eerld with scoped sockets",
    )
    def test_an_empty_environment_means_the_default_socket(self) -> None:
        config = ClientConfig.from_env({})
        assert (config.transport, config.socket_path, config.gpus, config.job_id) == (
            "uds",
            DEFAULT_SOCKET_PATH,
            None,
            None,
        )

    def test_eerl_socket_moves_the_socket(self) -> None:
        config = ClientConfig.from_env({"EERL_SOCKET": "/tmp/x.sock"})
        assert (config.socket_paths, config.scoped) == (("/tmp/x.sock",), False)

    def test_eerl_socket_may_list_sockets_the_session_opening_on_the_first(self) -> None:
        config = ClientConfig.from_env({"EERL_SOCKET": "/r/gpus/a.sock: /r/gpus/b.sock:/r/gpus/c.sock"})
        assert (config.socket_path, config.ticket_socket_paths, config.scoped) == (
            "/r/gpus/a.sock",
            ("/r/gpus/b.sock", "/r/gpus/c.sock"),
            True,
        )

    def test_an_eerl_socket_that_names_no_socket_is_an_error(self) -> None:
        with pytest.raises(ConfigError, match="EERL_SOCKET"):
            ClientConfig.from_env({"EERL_SOCKET": " : "})

    @pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
    def test_eerl_disable_disables(self, value: str) -> None:
        assert ClientConfig.from_env({"EERL_DISABLE": value}).disabled

    @pytest.mark.parametrize("value", ["0", "false", "", "off"])
    def test_a_false_eerl_disable_keeps_it_on(self, value: str) -> None:
        assert not ClientConfig.from_env({"EERL_DISABLE": value}).disabled

    def test_an_unreadable_eerl_disable_is_an_error(self) -> None:
        with pytest.raises(ConfigError, match="EERL_DISABLE"):
            ClientConfig.from_env({"EERL_DISABLE": "maybe"})

    def test_job_id_and_gpus_come_from_the_environment(self) -> None:
        config = ClientConfig.from_env({"EERL_JOB_ID": "job-7", "EERL_GPUS": "1, GPU-aa11,MIG-bb22"})
        assert (config.job_id, config.gpus) == ("job-7", (1, "GPU-aa11", "MIG-bb22"))

    def test_eerl_address_without_tls_is_an_error_naming_what_is_missing(self) -> None:
        with pytest.raises(ConfigError, match="EERL_TLS_CA, EERL_TLS_CERT, EERL_TLS_KEY"):
            ClientConfig.from_env({"EERL_ADDRESS": "node1:50051"})

    def test_eerl_address_with_tls_means_tcp(self, tmp_path: Path) -> None:
        for name in ("ca", "cert", "key"):
            (tmp_path / name).write_bytes(name.encode())
        config = ClientConfig.from_env(
            {
                "EERL_ADDRESS": "node1:50051",
                "EERL_TLS_CA": str(tmp_path / "ca"),
                "EERL_TLS_CERT": str(tmp_path / "cert"),
                "EERL_TLS_KEY": str(tmp_path / "key"),
                "EERL_SOCKET": "/ignored.sock",
            }
        )
        assert (config.transport, config.target, config.private_key_pem) == ("tcp", "node1:50051", b"key")


def _socket_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return path


def _gpu_socket(run_dir: Path, uuid: str) -> Path:
    """The daemon's socket of one GPU, in that GPU's directory (what CDI mounts into a container)."""
    return _socket_file(run_dir / "gpus" / uuid / "eerld.sock")


class TestDiscovery:
    def test_with_nothing_there_it_is_the_shared_socket(self, tmp_path: Path) -> None:
        assert discover_sockets({"EERL_RUN_DIR": str(tmp_path)}) == ((str(tmp_path / "eerld.sock"),), False)

    def test_the_default_run_dir_holds_the_default_socket(self) -> None:
        assert os.path.join(DEFAULT_RUN_DIR, "eerld.sock") == DEFAULT_SOCKET_PATH

    def test_per_gpu_sockets_are_all_used_sorted_by_gpu_directory_and_scoped(self, tmp_path: Path) -> None:
        _socket_file(tmp_path / "eerld.sock")
        for uuid in ("GPU-bb", "GPU-aa"):
            _gpu_socket(tmp_path, uuid)
        _socket_file(tmp_path / "gpus" / "README")
        config = ClientConfig.from_env({"EERL_RUN_DIR": str(tmp_path)})
        assert config.socket_paths == (
            str(tmp_path / "gpus/GPU-aa/eerld.sock"),
            str(tmp_path / "gpus/GPU-bb/eerld.sock"),
        )
        assert config.scoped

    def test_a_gpu_directory_counts_while_its_socket_is_gone(self, tmp_path: Path) -> None:
        """eerld restarting: the mounted directory has no socket yet; the client waits for it there."""
        (tmp_path / "gpus" / "GPU-aa").mkdir(parents=True)
        found = discover_sockets({"EERL_RUN_DIR": str(tmp_path)})
        assert found == ((str(tmp_path / "gpus/GPU-aa/eerld.sock"),), True)

    def test_socket_files_directly_in_gpus_are_not_per_gpu_sockets(self, tmp_path: Path) -> None:
        """The old layout, gpus/<uuid>.sock, is no longer served: the shared socket is the answer."""
        _socket_file(tmp_path / "gpus" / "GPU-aa.sock")
        found = discover_sockets({"EERL_RUN_DIR": str(tmp_path)})
        assert found == ((str(tmp_path / "eerld.sock"),), False)

    def test_the_jobs_grant_wins_over_per_gpu_sockets(self, tmp_path: Path) -> None:
        grant = _socket_file(tmp_path / "grants" / "job-4711.sock")
        _gpu_socket(tmp_path, "GPU-aa")
        config = ClientConfig.from_env({"EERL_RUN_DIR": str(tmp_path), "EERL_JOB_ID": "4711"})
        assert (config.socket_paths, config.scoped) == ((str(grant),), True)

    def test_the_slurm_job_id_finds_the_grant_when_eerl_job_id_is_unset(self, tmp_path: Path) -> None:
        grant = _socket_file(tmp_path / "grants" / "job-99.sock")
        assert discover_sockets({"EERL_RUN_DIR": str(tmp_path), "SLURM_JOB_ID": "99"}) == (
            (str(grant),),
            True,
        )

    def test_another_jobs_grant_is_not_used(self, tmp_path: Path) -> None:
        _socket_file(tmp_path / "grants" / "job-1.sock")
        found = discover_sockets({"EERL_RUN_DIR": str(tmp_path), "EERL_JOB_ID": "2"})
        assert found == ((str(tmp_path / "eerld.sock"),), False)

    def test_a_job_id_that_is_no_grant_name_never_becomes_a_path(self, tmp_path: Path) -> None:
        _socket_file(tmp_path / "elsewhere.sock")
        found = discover_sockets({"EERL_RUN_DIR": str(tmp_path / "run"), "EERL_JOB_ID": "../../elsewhere"})
        assert found == ((str(tmp_path / "run" / "eerld.sock"),), False)

    def test_eerl_socket_wins_over_discovery(self, tmp_path: Path) -> None:
        _gpu_socket(tmp_path, "GPU-aa")
        config = ClientConfig.from_env({"EERL_RUN_DIR": str(tmp_path), "EERL_SOCKET": "/x.sock"})
        assert (config.socket_paths, config.scoped) == (("/x.sock",), False)
