"""``eerld --sim``: one flag for a daemon anyone can start by hand (the options it sets, where it lives)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eerld.config import load_config
from eerld.config.trial import announcement, sim_home, with_sim_defaults
from eerld.errors import ConfigError


class TestWhereItLives:
    def test_the_login_s_runtime_directory_first(self, tmp_path: Path) -> None:
        """With ``XDG_RUNTIME_DIR`` (an existing absolute directory) it lives in ``eerld-sim`` there."""
        assert sim_home({"XDG_RUNTIME_DIR": str(tmp_path)}, 1000) == tmp_path / "eerld-sim"

    def test_else_a_directory_of_the_uid_s_under_tmpdir(self, tmp_path: Path) -> None:
        """Without one (or with one that does not exist) it is ``$TMPDIR/eerld-sim-<uid>``."""
        missing = str(tmp_path / "no-such-runtime-dir")
        env = {"XDG_RUNTIME_DIR": missing, "TMPDIR": str(tmp_path)}
        assert sim_home(env, 1000) == tmp_path / "eerld-sim-1000"
        relative = {"XDG_RUNTIME_DIR": "relative", "TMPDIR": str(tmp_path)}
        assert sim_home(relative, 7) == tmp_path / "eerld-sim-7"


class TestWhatItSets:
    def test_sim_alone_is_a_single_tenant_simulated_daemon_in_the_user_s_directory(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """No root path, no grants, no metrics port, no kubelet: nothing that needs root or collides."""
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
        config = load_config(["--sim"])
        home = tmp_path / "eerld-sim"
        assert config.sim_home == home
        assert config.backend == "sim"
        assert config.tenancy == "single"
        assert config.socket_path == home / "eerld.sock"
        assert config.admin_socket_path == home / "admin.sock"
        assert config.state_dir == home / "state"
        assert config.grant_dir is None
        assert config.metrics_address is None
        assert config.pod_resources_socket is None

    def test_flags_given_as_well_win(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """``--sim`` fills only what is not given: a named socket, GPU count or metrics address stay."""
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
        own = tmp_path / "mine.sock"
        config = load_config(
            ["--sim", "--socket", str(own), "--sim-gpus", "2", "--metrics-address", "127.0.0.1:9999"]
        )
        assert config.socket_path == own
        assert config.sim_gpus == 2
        assert config.metrics_address == "127.0.0.1:9999"
        assert config.admin_socket_path == tmp_path / "eerld-sim" / "admin.sock"

    def test_without_sim_nothing_changes(self) -> None:
        """The production defaults stay the production defaults."""
        config = load_config([])
        assert config.sim_home is None
        assert config.backend == "nvml"
        assert config.tenancy == "multi"

    def test_sim_with_real_gpus_is_refused(self) -> None:
        """``--sim --backend nvml`` asks for two contrary things: one clear error."""
        refusal = "--sim: simulated GPUs only; it cannot be combined with --backend nvml"
        with pytest.raises(ConfigError, match=refusal):
            load_config(["--sim", "--backend", "nvml"])
        assert with_sim_defaults({"backend": "sim"}, Path("/x"))["backend"] == "sim"


class TestWhatItSays:
    def test_the_lines_that_reach_it(self) -> None:
        """The export line and the eerlctl line, with the paths it serves on."""
        text = announcement(
            home=Path("/run/user/1000/eerld-sim"),
            socket_path=Path("/run/user/1000/eerld-sim/eerld.sock"),
            admin_socket_path=Path("/run/user/1000/eerld-sim/admin.sock"),
            gpus=8,
            profile="h100-sxm",
        )
        lines = text.splitlines()
        assert "8 simulated h100-sxm GPUs" in lines[0]
        assert "  export EERL_SOCKET=/run/user/1000/eerld-sim/eerld.sock" in lines
        assert "  eerlctl --socket /run/user/1000/eerld-sim/admin.sock status" in lines
