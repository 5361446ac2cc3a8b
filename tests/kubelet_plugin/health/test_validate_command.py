"""``gpuready validate``: one line per GPU and check, the reason for each failure, non-zero on failure."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dra_driver.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    rc = main(["validate", *argv])
    return rc, capsys.readouterr().out.splitlines()


def line(lines: list[str], subject: str, check: str) -> str:
    return next(ln for ln in lines if ln.split()[1:3] == [subject, check])


def test_healthy_simulated_node_passes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, lines = run(capsys, "--nvml", "sim:8xh100", "--cdi-dir", str(tmp_path))
    assert rc == 0
    assert lines[-1] == "RESULT: all 8 GPU(s) ready"
    assert line(lines, "node", "driver").startswith("PASS")
    for i in range(8):
        assert line(lines, f"gpu-{i}", "nvml").startswith("PASS")
    assert line(lines, "gpu-0", "cuda").startswith("PASS")
    assert line(lines, "gpu-7-mig-1g10gb-19-0", "cuda").startswith("PASS")  # MIG devices probed one by one


def test_each_failure_is_named_with_its_reason(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, lines = run(capsys, "--nvml", "sim:8xh100", "--cdi-dir", str(tmp_path), "--probe-timeout", "2",
                    "--sim-fault", "1:hang", "--sim-fault", "2:wrong", "--sim-fault", "3:row-remap",
                    "--sim-fault", "4:lost", "--sim-fault", "5:unknown")
    assert rc == 1
    assert line(lines, "gpu-0", "cuda").startswith("PASS")
    assert line(lines, "gpu-1", "cuda").startswith("FAIL")
    assert line(lines, "gpu-1", "cuda").endswith("probe timed out after 2s")
    assert "kernel result wrong" in line(lines, "gpu-2", "cuda")
    assert "memory row remapping pending" in line(lines, "gpu-3", "nvml")
    assert line(lines, "gpu-3", "cuda").startswith("SKIP")
    lost = [ln for ln in lines if ln.startswith("FAIL") and "GPU is lost" in ln]
    unknown = [ln for ln in lines if ln.startswith("FAIL") and "Unknown Error" in ln]
    assert lost and unknown
    assert lines[-1].startswith("RESULT: NOT READY: ") and "gpu-1 (cuda: probe timed out after 2s)" in lines[-1]


def test_device_nodes_cdi_and_plugin_checks(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    dev = tmp_path / "host"
    (dev / "dev").mkdir(parents=True)
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0"):
        (dev / "dev" / name).write_text("")
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    cdi.chmod(0o500)
    try:
        rc, lines = run(capsys, "--nvml", "sim:h100-80gb", "--dev-root", str(dev), "--cdi-dir", str(cdi),
                        "--registration-socket", str(tmp_path / "gpu.nvidia.com-reg.sock"))
    finally:
        cdi.chmod(0o700)
    assert rc == 1
    assert line(lines, "node", "container").startswith("PASS")
    if os.geteuid() != 0:  # root writes anywhere
        assert "is not writable" in line(lines, "node", "cdi")
    assert "is not registered with the kubelet" in line(lines, "node", "plugin")
    (dev / "dev" / "nvidia0").unlink()
    rc, lines = run(capsys, "--nvml", "sim:h100-80gb", "--dev-root", str(dev), "--cdi-dir", str(tmp_path / "c2"))
    assert rc == 1
    assert f"{dev}/dev/nvidia0 is missing" in line(lines, "node", "container")
    # A missing CDI directory the plugin can create at start passes, saying so; validate does not create it.
    cdi_line = line(lines, "node", "cdi")
    assert cdi_line.startswith("PASS") and "does not exist yet; the plugin creates it at start" in cdi_line
    assert not (tmp_path / "c2").exists()
    # One it cannot create (a file where a directory belongs) fails, named with the flag.
    (tmp_path / "file").write_text("x")
    rc, lines = run(capsys, "--nvml", "sim:h100-80gb", "--dev-root", str(dev), "--cdi-dir",
                    str(tmp_path / "file" / "cdi"))
    cdi_line = line(lines, "node", "cdi")
    assert rc == 1 and cdi_line.startswith("FAIL") and f"--cdi-dir {tmp_path / 'file' / 'cdi'} (env CDI_ROOT)" in cdi_line


def test_bad_arguments_are_explained(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--nvml", "sim:no-such-node"]) == 2
    out = capsys.readouterr().out
    assert "no-such-node" in out and "8xh100" in out  # names the profiles that exist
    assert main(["validate", "--nvml", "sim:h100-80gb", "--sim-fault", "zero:hang"]) == 2
    assert "expected INDEX:FAULT" in capsys.readouterr().err
    assert main(["validate", "--sim-fault", "0:hang"]) == 2
    assert "needs --nvml sim:" in capsys.readouterr().err


def test_missing_optional_uvm_tools_node_is_not_a_failure(capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path) -> None:
    dev = tmp_path / "host"
    (dev / "dev").mkdir(parents=True)
    for name in ("nvidiactl", "nvidia-uvm", "nvidia0"):
        (dev / "dev" / name).write_text("")
    rc, lines = run(capsys, "--nvml", "sim:h100-80gb", "--dev-root", str(dev), "--cdi-dir", str(tmp_path))
    assert rc == 0, lines
    assert line(lines, "node", "container").startswith("PASS")


def test_hung_gpu_with_mig_enabled_fails_through_a_temporary_instance(capsys: pytest.CaptureFixture[str],
                                                                     tmp_path: Path) -> None:
    # Four H200 with MIG on and no instance (dynamic MIG): CUDA reaches each only through a MIG
    # instance, so validate makes a temporary full-size one per GPU, probes it, and destroys it.
    rc, lines = run(capsys, "--nvml", "sim:4xh200", "--sim-fault", "1:hang", "--probe-timeout", "2",
                    "--cdi-dir", str(tmp_path))
    assert rc == 1
    assert line(lines, "gpu-1", "cuda").startswith("FAIL")
    assert "probe timed out after 2s (on a temporary 7g.141gb MIG instance" in line(lines, "gpu-1", "cuda")
    for gpu in ("gpu-0", "gpu-2", "gpu-3"):
        assert line(lines, gpu, "cuda").startswith("PASS")
    assert lines[-1].startswith("RESULT: NOT READY: gpu-1 (cuda: probe timed out after 2s")


def test_one_static_mig_device_fails_alone(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # h100-7x1g: seven 1g.10gb devices, GPU instance ids 7..13 (placement starts 0..6).
    rc, lines = run(capsys, "--nvml", "sim:h100-7x1g", "--sim-fault", "0/9:wrong", "--cdi-dir", str(tmp_path))
    assert rc == 1
    cuda = [ln for ln in lines if ln.split()[2:3] == ["cuda"]]
    assert len(cuda) == 7  # one per MIG device, none for the parent CUDA cannot see
    assert [ln.split()[1] for ln in cuda if ln.startswith("FAIL")] == ["gpu-0-mig-1g10gb-19-2"]
    assert "kernel result wrong" in line(lines, "gpu-0-mig-1g10gb-19-2", "cuda")
    assert main(["validate", "--nvml", "sim:h100-7x1g", "--sim-fault", "0/9:lost"]) == 2
    assert "takes only hang or wrong" in capsys.readouterr().err


def test_gpus_not_probed_are_said_and_counted_apart(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Dynamic MIG with a MIG device present: it is a tenant's, so the GPU is not probed; not a failure.
    rc, lines = run(capsys, "--nvml", "sim:h100-mixed-mig", "--dynamic-mig", "--cdi-dir", str(tmp_path))
    assert rc == 0
    assert line(lines, "gpu-0", "cuda").startswith("SKIP")
    assert "not probed: in use by a claim's MIG instance" in line(lines, "gpu-0", "cuda")
    assert lines[-1] == ("RESULT: 0 GPU(s) ready, 1 not probed (gpu-0: in use by a claim's MIG instance "
                         "(a probe never runs inside a tenant's instance))")
    rc, lines = run(capsys, "--nvml", "sim:4xh200", "--no-temporary-mig", "--sim-fault", "1:hang",
                    "--cdi-dir", str(tmp_path))
    assert rc == 0  # nothing could be probed, so nothing is known to fail: said, not hidden
    assert lines[-1].startswith("RESULT: 0 GPU(s) ready, 4 not probed (gpu-0, gpu-1, gpu-2, gpu-3: MIG enabled")
    rc, lines = run(capsys, "--nvml", "sim:4xh200", "--no-temporary-mig", "--require-probe",
                    "--cdi-dir", str(tmp_path))
    assert rc == 1
    assert lines[-1].startswith("RESULT: NOT READY: not probed, and --require-probe is set (gpu-0, gpu-1")


@pytest.mark.gpu
def test_real_node_validates(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # --require-probe: every GPU must really run the CUDA probe (the H200 has MIG disabled, so each is
    # probed by its GPU UUID); a GPU skipped as "not probed" fails this test.
    rc, lines = run(capsys, "--cdi-dir", str(tmp_path / "cdi"), "--probe-timeout", "120", "--require-probe")
    print("\n".join(lines))
    cuda = [ln for ln in lines if ln.split()[2:3] == ["cuda"]]
    assert cuda and all(ln.startswith("PASS") for ln in cuda), lines
    assert lines[-1].startswith("RESULT: all "), lines
    assert rc == 0, lines
