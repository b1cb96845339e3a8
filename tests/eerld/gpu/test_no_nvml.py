"""A node without NVML (no pynvml, no libnvidia-ml, no driver): one line that points to the simulator."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import eerld.app
from eerld.main import main
from tests.eerld.gpu.fake_pynvml import FakePynvml


def _eerld(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    tmp_path.chmod(0o700)
    code = main(
        [
            "--backend=nvml",
            f"--socket={tmp_path / 'w.sock'}",
            f"--admin-socket={tmp_path / 'a.sock'}",
            f"--state-dir={tmp_path / 'state'}",
            "--metrics-address=off",
            "--tenancy=single",
        ]
    )
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("pynvml", "why"),
    [
        (FakePynvml(library_present=False), "NVML_ERROR_LIBRARY_NOT_FOUND"),
        (FakePynvml(driver_loaded=False), "NVML_ERROR_DRIVER_NOT_LOADED"),
        (None, "nvidia-ml-py (module pynvml) is not installed"),  # None in sys.modules: the import fails
    ],
    ids=["no-libnvidia-ml", "no-driver", "no-pynvml"],
)
def test_eerld_says_nvml_is_not_available_and_names_the_simulator(
    pynvml: FakePynvml | None,
    why: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", pynvml)
    code, out, err = _eerld(tmp_path, capsys)
    assert (code, out) == (1, "")  # as other start-up errors: exit 1, no traceback
    assert err.count("\n") == 1, err
    assert err.startswith("Error: NVML is not available (")
    assert why in err
    assert err.endswith("run the simulator: eerld --sim\n")  # eerl-sim is installed here


def test_without_eerl_sim_it_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = eerld.app.importlib.util.find_spec
    monkeypatch.setattr(
        eerld.app.importlib.util, "find_spec", lambda name, *a: None if name == "eerl_sim" else real(name, *a)
    )
    line = eerld.app.nvml_unavailable(RuntimeError("nvmlInit failed"))
    assert line.endswith("eerld --sim (pip install eerl-sim)")


def test_perf_real_gpu_without_nvml_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from perf import real_gpu  # noqa: PLC0415 - a repository tool, imported only here

    monkeypatch.setitem(sys.modules, "pynvml", FakePynvml(library_present=False))
    monkeypatch.setattr(sys, "argv", ["real_gpu", "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as info:
        real_gpu.main()
    message = str(info.value.code)
    assert "\n" not in message
    assert message.startswith("python -m perf.real_gpu: needs an NVIDIA GPU: NVML is not available (")
