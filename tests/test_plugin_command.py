"""``gpuready kubelet-plugin`` flags and environment variables: bad settings are refused clearly."""

from __future__ import annotations

import argparse

import pytest

from kubelet_plugin import command


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(argv)


def test_environment_variables_fill_every_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"NODE_NAME": "node-7", "POD_UID": "abc", "DRIVER_NAME": "gpu.example.com", "MIG_MODE": "dynamic",
           "SHARED_GPUS": "gpu-0,gpu-1", "HEALTH_MODE": "taint", "XID_IGNORE": "13, 43", "XID_FATAL": "31",
           "HEALTH_RECOVERY_PASSES": "2", "NVIDIA_DRIVER_ROOT": "/driver-root",
           "NVIDIA_DRIVER_ROOT_HOST": "/run/nvidia/driver", "HEALTH_STREAM": "false"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfg = command.config_from_args(_args([]))
    assert (cfg.node_name, cfg.pod_uid, cfg.driver_name, cfg.mig_mode) == ("node-7", "abc", "gpu.example.com", "dynamic")
    assert cfg.shared_gpus == frozenset({"gpu-0", "gpu-1"})
    assert cfg.xid_ignore == {13, 43} and cfg.xid_fatal == {31} and cfg.recovery_passes == 2
    assert cfg.plugin_data_dir == "/var/lib/kubelet/plugins/gpu.example.com"
    assert cfg.cdi_driver_root == "/run/nvidia/driver" and cfg.driver_root == "/driver-root"
    assert cfg.health_stream is False
    policy = cfg.health_policy()
    assert policy.extra_ignored_xids == {13, 43}


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        ([], "NODE_NAME"),
        (["--node-name", "n", "--driver-name", "Not_A_Domain"], "--driver-name"),
        (["--node-name", "n", "--nvml", "fake"], "sim:<profile>"),
        (["--node-name", "n", "--xid-ignore", "13,x"], "--xid-ignore"),
        (["--node-name", "n", "--xid-ignore", "79", "--xid-fatal", "79"], "79"),
        (["--node-name", "n", "--nvml", "sim:no-such-profile", "--kubeconfig", "/nonexistent"], "no-such-profile"),
    ],
)
def test_bad_settings_exit_2_with_the_flag_named(argv: list[str], fragment: str,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert command.run(_args(argv)) == 2
    assert fragment in capsys.readouterr().err


def test_nvml_not_ready_at_start_is_retried_instead_of_crash_looping(monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import threading

    import dra_driver.nvml
    from dra_driver.nvml import NvmlUnavailableError
    from kubelet_plugin.testing import PluginHarness

    real_open = dra_driver.nvml.open_nvml
    attempts = []

    def flaky_open(spec: str) -> object:
        attempts.append(spec)
        if len(attempts) < 3:
            raise NvmlUnavailableError("NVML_ERROR_DRIVER_NOT_LOADED (the driver is still loading)")
        return real_open(spec)

    monkeypatch.setattr(dra_driver.nvml, "open_nvml", flaky_open)
    with PluginHarness() as h:
        config = h.config("n1", nvml="sim:h100-80gb")
        kubeconfig = h.server.write_kubeconfig(os.path.join(h.root, "kubeconfig"))
        plugin = command._start(config, kubeconfig, threading.Event(), delay=0.05)
        try:
            assert len(attempts) == 3
            assert h.kubelet("n1").prepare([]) == {}
        finally:
            plugin.stop()


@pytest.mark.parametrize(("env", "value", "fragment"), [
    ("METRICS_PORT", "http", "--metrics-port (env METRICS_PORT) is 'http': it must be a whole number"),
    ("METRICS_PORT", "70000", "--metrics-port (env METRICS_PORT) is 70000"),
    ("HEALTH_PROBE_TIMEOUT", "soon", "--probe-timeout (env HEALTH_PROBE_TIMEOUT) is 'soon': it must be a number"),
    ("HEALTH_RECOVERY_PASSES", "2.5", "--recovery-passes (env HEALTH_RECOVERY_PASSES) is '2.5'"),
    ("VRAM_CHECK_INTERVAL", "-1", "VRAM_CHECK_INTERVAL=-1.0: must not be negative"),
])
def test_a_bad_number_in_the_environment_is_reported_at_run_time_naming_it(
        env: str, value: str, fragment: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("NODE_NAME", "n")
    monkeypatch.setenv(env, value)
    args = _args([])  # building and parsing the flags never fails on a bad number
    assert command.run(args) == 2  # exit 2 with the variable named, no traceback, no crash loop
    # The last line is the message for people (a log handler earlier tests left may print before it).
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("gpuready kubelet-plugin: ") and fragment in last
    monkeypatch.delenv(env)
    assert command.config_from_args(_args([])).metrics_port == 0


def test_numbers_and_the_proc_root_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {"NODE_NAME": "n", "METRICS_PORT": "9400", "HEALTH_PROBE_TIMEOUT": "12.5",
                 "PROC_ROOT": "/host/proc", "VRAM_CHECK_INTERVAL": "5"}.items():
        monkeypatch.setenv(k, v)
    cfg = command.config_from_args(_args([]))
    assert (cfg.metrics_port, cfg.probe_timeout, cfg.proc_root, cfg.vram_interval) == (9400, 12.5, "/host/proc", 5.0)
    assert command.config_from_args(_args(["--proc-root", "/p", "--metrics-port", "1"])).proc_root == "/p"
