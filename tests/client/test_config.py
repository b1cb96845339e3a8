"""ClientConfig builders and the EERL_* environment."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from eerl import DEFAULT_SOCKET_PATH, ClientConfig, ConfigError


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


class TestFromEnv:
    def test_an_empty_environment_means_the_default_socket(self) -> None:
        config = ClientConfig.from_env({})
        assert (config.transport, config.socket_path, config.gpus, config.job_id) == (
            "uds",
            DEFAULT_SOCKET_PATH,
            None,
            None,
        )

    def test_eerl_socket_moves_the_socket(self) -> None:
        assert ClientConfig.from_env({"EERL_SOCKET": "/tmp/x.sock"}).socket_path == "/tmp/x.sock"

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
