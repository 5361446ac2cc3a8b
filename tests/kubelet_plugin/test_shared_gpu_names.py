"""``--shared-gpus`` entries that match no GPU are reported by name, with the valid names; never fatal.

A typo (``gpu0``, ``GPU-0``, a UUID where a name is expected) used to publish no shared GPU without
a word. The pure check says which entries share nothing and what was probably meant; the plugin
logs it once at start and keeps publishing the rest.
"""

from __future__ import annotations

import argparse
import os
import threading

import pytest

from dra_driver.slices import SliceOptions, build_pool, check_shared_gpu_names
from kubelet_plugin import plugin_command as command
from kubelet_plugin.nvml import discover
from testbed.nvml_sim import SimulatedNvml

# The simulated NVML itself, not the "sim:" backend: that seam is an installed entry point, and the
# GPU machine's bundle runs the suite from a checkout that is not pip-installed (this runs there too).
H100S = discover(SimulatedNvml("8xh100"))  # gpu-0..5 MIG off, gpu-6 and gpu-7 MIG on
UUID_3 = next(g.uuid for g in H100S.gpus if g.name == "gpu-3")
VALID = tuple(f"gpu-{i}" for i in range(8))


def test_unknown_entries_are_named_with_what_was_meant_and_the_valid_names() -> None:
    check = check_shared_gpu_names(frozenset({"gpu0", "GPU-1", UUID_3, "gpu-2", "gpu-9", "tpu"}), H100S)
    assert check.unknown == tuple(sorted(("GPU-1", UUID_3, "gpu-9", "gpu0", "tpu")))
    assert dict(check.suggestions) == {"gpu0": "gpu-0", "GPU-1": "gpu-1", UUID_3: "gpu-3"}
    assert check.valid == VALID and not check.ok
    message = check.message()
    assert "'gpu0' (did you mean 'gpu-0'?)" in message and "'gpu-9'," in message and "'tpu'" in message
    assert f"valid names here: {', '.join(VALID)} (or 'all')" in message
    assert "--shared-gpus (env SHARED_GPUS)" in message
    # The builder still shares what is valid (gpu-2) and skips the rest: the check is what reports it.
    pool = build_pool(H100S, "n", "gpu.nvidia.com", SliceOptions(shared_gpus=frozenset({"gpu0", "gpu-2"})))
    shared = sorted(d.name for s in pool for d in s.devices if d.allow_multiple_allocations)
    assert shared == ["gpu-2"]


def test_valid_lists_and_all_or_nothing_are_fine() -> None:
    assert check_shared_gpu_names(frozenset({"gpu-0", "gpu-5"}), H100S).ok
    assert check_shared_gpu_names(True, H100S).ok and check_shared_gpu_names(False, H100S).ok
    assert check_shared_gpu_names(frozenset(), H100S).ok


def test_a_mig_enabled_gpu_in_static_mode_is_reported_as_not_shared() -> None:
    check = check_shared_gpu_names(frozenset({"gpu-6", "gpu-0"}), H100S)
    assert check.unknown == () and check.mig_static == ("gpu-6",) and not check.ok
    assert "gpu-6, whose MIG mode is on" in check.message()
    # In dynamic MIG mode a shared GPU is published whole whatever its MIG mode: nothing to report.
    assert check_shared_gpu_names(frozenset({"gpu-6"}), H100S, mig_mode="dynamic").ok


def test_the_plugin_logs_a_typo_once_at_start_and_keeps_publishing(caplog: pytest.LogCaptureFixture) -> None:
    from testbed.plugin_harness import PluginHarness

    with PluginHarness() as h:
        config = h.config("n1", nvml="sim:8xh100", shared_gpus=frozenset({"gpu0", "gpu-1"}))
        kubeconfig = h.server.write_kubeconfig(os.path.join(h.root, "kubeconfig"))
        h.kubelet_emulator("n1")  # the kubelet registers the plugin: its slices wait for that
        plugin = command._start(config, kubeconfig, threading.Event(), delay=0.05)
        try:
            events = [r for r in caplog.records if r.getMessage() == "shared_gpus_unknown_names"]
            assert len(events) == 1 and events[0].levelname == "ERROR"
            kv = events[0].kv  # type: ignore[attr-defined]
            assert (kv["node"], kv["unknown"], kv["valid"]) == ("n1", "gpu0", ",".join(VALID))
            assert kv["suggestions"] == "gpu0->gpu-0" and "'gpu0' (did you mean 'gpu-0'?)" in kv["error"]
            # Not fatal: the plugin serves, and publishes the valid entry shared and the rest whole.
            published = h.wait_published("n1", {"gpu-0", "gpu-1"})  # the first publish may still be on its way
            assert published["gpu-1"].get("allowMultipleAllocations") is True
            assert "allowMultipleAllocations" not in published["gpu-0"]
            assert h.kubelet("n1").prepare([]) == {}
        finally:
            plugin.stop()


def test_a_correct_list_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    config = command.config_from_args(_args(["--node-name", "n", "--shared-gpus", "gpu-0, gpu-1"]))
    assert command.report_shared_gpu_names(config, H100S) is not None
    assert command.report_shared_gpu_names(config, None) is None  # nothing discovered (yet): no check
    assert not [r for r in caplog.records if r.getMessage().startswith("shared_gpus_")]
    all_gpus = command.config_from_args(_args(["--node-name", "n", "--shared-gpus", "all"]))
    assert command.report_shared_gpu_names(all_gpus, H100S) is None


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(argv)
