"""``gpuready kubelet-plugin`` flags and environment variables: bad settings are refused clearly."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from kubelet_plugin import plugin_command as command
from kubelet_plugin.health.policy import policy_from_config


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
    policy = policy_from_config(cfg)
    assert policy.extra_ignored_xids == {13, 43}


def test_share_modes_are_read_per_node_and_per_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = command.config_from_args(_args(["--node-name", "n", "--share-mode", "4",
                                          "--gpu-share-modes", "gpu-1=unlimited, gpu-0=memory"]))
    assert (cfg.share_mode, cfg.gpu_share_modes) == ("4", (("gpu-0", "memory"), ("gpu-1", "unlimited")))
    monkeypatch.setenv("SHARE_MODE", "unlimited")
    monkeypatch.setenv("GPU_SHARE_MODES", "gpu-3=8")
    cfg = command.config_from_args(_args(["--node-name", "n"]))
    assert (cfg.share_mode, cfg.gpu_share_modes) == ("unlimited", (("gpu-3", "8"),))


@pytest.mark.parametrize(("argv", "message"), [
    (["--share-mode", "shares"], "--share-mode (env SHARE_MODE) 'shares': use memory, unlimited, or a number of "
                                 "shares from 1 to 1000000; fix the flag or the SHARE_MODE environment variable"),
    (["--share-mode", "0"], "--share-mode (env SHARE_MODE) '0': use memory"),
    (["--gpu-share-modes", "gpu-0"], "--gpu-share-modes (env GPU_SHARE_MODES) entry 'gpu-0': write <GPU name>=<mode>"),
    (["--gpu-share-modes", "gpu-0=4,gpu-0=2"], "entry 'gpu-0=2': gpu-0 is given twice"),
    (["--gpu-share-modes", "gpu-0=four"], "entry 'gpu-0=four': 'four': use memory, unlimited, or a number"),
])
def test_a_bad_share_mode_names_the_flag_and_the_fix(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError) as err:
        command.config_from_args(_args(["--node-name", "n", *argv]))
    assert message in str(err.value)


def test_the_upstream_helpers_directory_flags_work_as_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    # A DaemonSet written for another DRA driver passes these names (flags or environment).
    cfg = command.config_from_args(_args(["--node-name", "n", "--kubelet-registrar-directory-path", "/k/registry",
                                          "--kubelet-plugins-directory-path", "/k/plugins"]))
    assert cfg.registrar_dir == "/k/registry"
    assert cfg.plugin_data_dir == "/k/plugins/gpu.nvidia.com" and cfg.checkpoint_path.startswith("/k/plugins/")
    monkeypatch.setenv("KUBELET_PLUGINS_DIRECTORY_PATH", "/env/plugins")
    monkeypatch.setenv("KUBELET_REGISTRAR_DIRECTORY_PATH", "/env/registry")
    cfg = command.config_from_args(_args(["--node-name", "n", "--driver-name", "gpu.example.com"]))
    assert (cfg.registrar_dir, cfg.plugin_data_dir) == ("/env/registry", "/env/plugins/gpu.example.com")
    # Both spellings agreeing is fine; disagreeing is an error that names both.
    cfg = command.config_from_args(_args(["--node-name", "n", "--driver-name", "gpu.example.com",
                                          "--registrar-dir", "/env/registry"]))
    assert cfg.registrar_dir == "/env/registry"
    with pytest.raises(ValueError, match="--registrar-dir /other and --kubelet-registrar-directory-path"):
        command.config_from_args(_args(["--node-name", "n", "--registrar-dir", "/other"]))
    with pytest.raises(ValueError, match="--plugin-dir /p and --kubelet-plugins-directory-path /env/plugins"):
        command.config_from_args(_args(["--node-name", "n", "--plugin-dir", "/p"]))


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        ([], "NODE_NAME"),
        (["--node-name", "n", "--driver-name", "Not_A_Domain"], "--driver-name"),
        (["--node-name", "n", "--nvml", "fake"], "<backend>:<argument> such as sim:4xh200"),
        (["--node-name", "n", "--xid-ignore", "13,x"], "--xid-ignore"),
        (["--node-name", "n", "--xid-ignore", "79", "--xid-fatal", "79"], "79"),
        (["--node-name", "n", "--nvml", "sim:no-such-profile", "--kubeconfig", "/nonexistent"], "no-such-profile"),
    ],
)
def test_bad_settings_exit_2_with_the_flag_named(argv: list[str], fragment: str,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert command.run(_args(argv)) == 2
    assert fragment in _invalid_configuration_error(caplog)


def _invalid_configuration_error(caplog: pytest.LogCaptureFixture) -> str:
    """The one ``invalid_configuration`` event's message (exactly one per bad start)."""
    events = [r for r in caplog.records if r.getMessage() == "invalid_configuration"]
    assert len(events) == 1
    return str(events[0].kv["error"])  # type: ignore[attr-defined]


def _cli(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "PLUGIN_DIR", "CDI_ROOT")}
    return subprocess.run([sys.executable, "-m", "dra_driver.cli", *argv], capture_output=True, text=True,
                          env={**environ, **(env or {})}, timeout=60, check=False)


@pytest.mark.parametrize(("argv", "env", "flag"), [
    (["--plugin-dir", "plugins/gpu"], {}, "--plugin-dir (env PLUGIN_DIR) is 'plugins/gpu'"),
    ([], {"REGISTRAR_DIR": "./registry"}, "--registrar-dir (env REGISTRAR_DIR) is './registry'"),
    (["--cdi-root", "cdi"], {}, "--cdi-root (env CDI_ROOT) is 'cdi'"),
    (["--driver-root", "run/nvidia/driver"], {}, "--driver-root (env NVIDIA_DRIVER_ROOT)"),
    (["--dev-root", "fake"], {}, "--dev-root (env DEV_ROOT) is 'fake'"),
])
def test_a_relative_directory_exits_2_with_one_structured_line_naming_the_flag(
        argv: list[str], env: dict[str, str], flag: str) -> None:
    done = _cli(["kubelet-plugin", "--node-name", "n", "--nvml", "sim:h100-80gb", *argv], env)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr  # the structured event only: no second, plain copy
    assert "event=invalid_configuration" in lines[0] and "level=error" in lines[0]
    assert flag in lines[0] and "absolute path" in lines[0]


def test_before_logging_is_configured_a_usage_error_prints_one_plain_line() -> None:
    code = ("import argparse, sys; from kubelet_plugin import plugin_command as command; p = argparse.ArgumentParser(); "
            "command.add_arguments(p); sys.exit(command.run(p.parse_args(['--cdi-root', 'cdi'])))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "NODE_NAME": "n"})
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [lines[0]] and lines[0].startswith("gpuready kubelet-plugin: --cdi-root (env CDI_ROOT)")


def test_nvml_not_ready_at_start_is_retried_instead_of_crash_looping(monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import threading

    import kubelet_plugin.nvml
    from kubelet_plugin.nvml import NvmlUnavailableError
    from testbed.plugin_harness import PluginHarness

    real_open = kubelet_plugin.nvml.open_nvml
    attempts = []

    def flaky_open(spec: str, driver_root: str | None = None) -> object:
        attempts.append(spec)
        if len(attempts) < 3:
            raise NvmlUnavailableError("NVML_ERROR_DRIVER_NOT_LOADED (the driver is still loading)")
        return real_open(spec, driver_root=driver_root)

    monkeypatch.setattr(kubelet_plugin.nvml, "open_nvml", flaky_open)
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
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("NODE_NAME", "n")
    monkeypatch.setenv(env, value)
    args = _args([])  # building and parsing the flags never fails on a bad number
    assert command.run(args) == 2  # exit 2 with the variable named, no traceback, no crash loop
    assert fragment in _invalid_configuration_error(caplog)
    monkeypatch.delenv(env)
    assert command.config_from_args(_args([])).metrics_port == 0


_BAD_XID_LISTS = [
    ("0", "XID 0 is not positive"),
    ("13,-5", "XID -5 is not positive"),
    ("abc", "'abc' is not an XID number"),
    ("13,43,13", "XID 13 is listed twice"),
    ("1 3", "'1 3' is not an XID number"),  # a space inside a number (the old parser read it as 13)
    ("1_3", "'1_3' is not an XID number"),  # int() alone would read it as 13
]


@pytest.mark.parametrize(("flag", "env"), [("--xid-fatal", "XID_FATAL"), ("--xid-ignore", "XID_IGNORE")])
@pytest.mark.parametrize(("value", "problem"), _BAD_XID_LISTS)
@pytest.mark.parametrize("given_by", ["flag", "environment"])
def test_a_bad_xid_list_exits_2_naming_the_flag_its_variable_the_value_and_the_fix(
        flag: str, env: str, value: str, problem: str, given_by: str,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("NODE_NAME", "n")
    # A simulated node and no kubeconfig: should the list be accepted, the start fails at once on the
    # kubeconfig (another message) instead of retrying NVML until the test times out.
    argv = ["--nvml", "sim:h100-80gb", "--kubeconfig", "/nonexistent"]
    if given_by == "environment":
        monkeypatch.setenv(env, value)
    else:
        argv += [flag, value]
    assert command.run(_args(argv)) == 2
    error = _invalid_configuration_error(caplog)
    assert f"{flag} (env {env}) is {value!r}" in error
    assert problem in error
    assert f"fix the flag or the {env} environment variable" in error


@pytest.mark.parametrize(("value", "xids"), [
    ("", frozenset()),
    ("79", frozenset({79})),
    ("13, 43", frozenset({13, 43})),
    (" 13 ,,43 ", frozenset({13, 43})),
    ("13;43", frozenset({13, 43})),
])
def test_a_valid_xid_list_is_read_from_the_flag_and_the_environment(
        value: str, xids: frozenset[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "n")
    assert command.config_from_args(_args(["--xid-fatal", value])).xid_fatal == xids
    monkeypatch.setenv("XID_IGNORE", value)
    assert command.config_from_args(_args([])).xid_ignore == xids


def test_a_bad_xid_list_on_the_command_line_exits_2_with_one_line() -> None:
    done = _cli(["kubelet-plugin", "--node-name", "n", "--nvml", "sim:h100-80gb"], {"XID_FATAL": "0"})
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "event=invalid_configuration" in lines[0] and "--xid-fatal (env XID_FATAL)" in lines[0]
    assert "XID 0 is not positive" in lines[0]


def test_numbers_and_the_proc_root_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {"NODE_NAME": "n", "METRICS_PORT": "9400", "HEALTH_PROBE_TIMEOUT": "12.5",
                 "PROC_ROOT": "/host/proc", "VRAM_CHECK_INTERVAL": "5"}.items():
        monkeypatch.setenv(k, v)
    cfg = command.config_from_args(_args([]))
    assert (cfg.metrics_port, cfg.probe_timeout, cfg.proc_root, cfg.vram_interval) == (9400, 12.5, "/host/proc", 5.0)
    assert command.config_from_args(_args(["--proc-root", "/p", "--metrics-port", "1"])).proc_root == "/p"


@pytest.mark.parametrize("argv, words", [
    (["--bind-time-validation", "true", "--health-mode", "off"], "needs the health monitor"),
    (["--bind-time-validation", "true", "--bind-validation-freshness", "-1"], "BIND_VALIDATION_FRESHNESS=-1.0"),
    (["--bind-validation-freshness", "soon"], "--bind-validation-freshness (env BIND_VALIDATION_FRESHNESS)"),
])
def test_bind_time_validation_settings_that_cannot_work_are_refused_by_name(
        monkeypatch: pytest.MonkeyPatch, argv: list[str], words: str) -> None:
    monkeypatch.setenv("NODE_NAME", "node-7")
    with pytest.raises(ValueError) as refused:
        command.config_from_args(_args(argv))
    assert words in str(refused.value)
    monkeypatch.setenv("BIND_TIME_VALIDATION", "true")
    monkeypatch.setenv("BIND_VALIDATION_FRESHNESS", "12.5")
    cfg = command.config_from_args(_args([]))
    assert (cfg.bind_time_validation, cfg.bind_validation_freshness) == (True, 12.5)
