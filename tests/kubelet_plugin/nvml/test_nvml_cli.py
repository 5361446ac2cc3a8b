"""``gpuready devices``: what a person sees, the machine formats, and the error without NVML."""

from __future__ import annotations

import json

import pytest
import yaml

from dra_driver.cli import main


def test_table_shows_names_memory_mig_and_placements(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--nvml=sim:8xh100"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "Driver 580.159.04, CUDA 13.0, 8 GPU(s)"
    row0 = next(line for line in lines if line.startswith("gpu-0 "))
    assert "NVIDIA H100 80GB HBM3" in row0 and " 79.6 " in row0 and "disabled" in row0 and "25/25" in row0
    row6 = next(line for line in lines if line.startswith("gpu-6 "))
    assert "enabled: 1x3g.40gb + 1x2g.20gb + 2x1g.10gb" in row6 and "0/25" in row6
    assert any(line.startswith("  gpu-7-mig-1g10gb-19-6") and " 9.8 " in line for line in lines)


def test_json_and_yaml_carry_the_device_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--nvml=sim:h200-141gb", "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    gpu = data["gpus"][0]
    assert gpu["name"] == "gpu-0" and gpu["memory_bytes"] == 150754820096 and gpu["mig_mode"] == "disabled"
    assert len(gpu["placement_names"]) == 25 and gpu["placement_names"][0] == "gpu-0-mig-1g18gb-19-0"
    assert main(["devices", "--nvml=sim:h100-7x1g", "-o", "yaml"]) == 0
    data = yaml.safe_load(capsys.readouterr().out)
    assert data["gpus"][0]["mig_devices"][0]["name"] == "gpu-0-mig-1g10gb-19-0"


def test_env_var_picks_the_default_source(capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUREADY_NVML", "sim:4xh200")
    assert main(["devices"]) == 0
    assert "4 GPU(s)" in capsys.readouterr().out


def _real_nvml_present() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(_real_nvml_present(), reason="this machine has NVML")
def test_without_nvml_the_error_says_how_to_simulate(capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUREADY_NVML", raising=False)
    assert main(["devices"]) == 2
    err = capsys.readouterr().err
    assert "NVML did not initialise" in err and "--nvml=sim:<profile>" in err


def test_unknown_profile_lists_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--nvml=sim:h300"]) == 2
    err = capsys.readouterr().err
    assert "unknown simulated NVML profile 'h300'" in err and "8xh100" in err


def test_unreadable_gpus_are_listed_with_their_reason_and_exit_1(capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from kubelet_plugin import devices_command as command
    from kubelet_plugin.nvml import discover, open_nvml

    sim = open_nvml("sim:8xh100")
    sim.faults.gpu_lost(2)
    monkeypatch.setattr(command, "open_nvml", lambda spec: sim)
    assert main(["devices", "--nvml=sim:8xh100"]) == 1
    out = capsys.readouterr().out
    assert "7 GPU(s), 1 unreadable" in out and "UNREADABLE  NVML index 2: nvmlDeviceGetHandleByIndex: GPU is lost" in out
    assert not any(line.startswith("gpu-2 ") for line in out.splitlines())
    assert discover(sim).unreadable  # still unreadable: the command changed nothing
