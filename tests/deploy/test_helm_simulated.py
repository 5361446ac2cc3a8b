"""simulated.enabled: one value turns a GPU-less node into a simulated GPU node that publishes devices
and runs pods, with the chart making (and the node's last plugin pod removing) what the host needs."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("helm_python")
from test_helm_chart import one

from dra_driver.slices import SliceOptions, build_pool
from kubelet_plugin.nvml import discover, open_nvml

SIMULATED = {"simulated": {"enabled": True}}


def _pod(values: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = one(values, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_one_value_runs_a_simulated_node_that_publishes_devices_from_the_test_only_image() -> None:
    pod = _pod(SIMULATED)
    plugin = pod["containers"][0]
    nvml = _env(plugin)["NVML"]
    assert nvml == "sim:8xh100@$(NODE_NAME)"
    profile = nvml.removeprefix("sim:").split("@")[0]
    # The default profile publishes devices under the default migMode (4xh200's MIG-mode GPUs do not).
    slices = build_pool(discover(open_nvml(f"sim:{profile}@n1")), "n1", "gpu.nvidia.com",
                        SliceOptions(mig_mode="static"))
    assert sum(len(s.to_k8s(1, None)["spec"].get("devices", [])) for s in slices) >= 8
    assert plugin["image"] == pod["initContainers"][0]["image"] == "ghcr.io/gpuready/gpuready:0.1.0-testbed"
    # A tag set by hand wins (a user's own build); the production default is untouched.
    tagged = _pod({**SIMULATED, "image": {"tag": "dev-testbed"}})["containers"][0]["image"]
    assert tagged == "ghcr.io/gpuready/gpuready:dev-testbed"
    assert _pod({})["containers"][0]["image"] == "ghcr.io/gpuready/gpuready:0.1.0"


def test_the_init_container_fills_the_driver_root_the_plugin_mounts_and_cdi_names() -> None:
    pod = _pod({**SIMULATED, "simulated": {"enabled": True, "hostDirectory": "/var/run/gpuready-sim"},
                "driverRoot": "/run/nvidia/driver", "migMode": "dynamic",
                "kubeletPlugin": {"pluginsDirectoryPath": "/var/lib/k0s/kubelet/plugins/"}})
    init, plugin = pod["initContainers"][0], pod["containers"][0]
    volumes = {v["name"]: v for v in pod["volumes"]}
    parent = volumes["simulated-host"]["hostPath"]
    assert parent == {"path": "/var/run", "type": "DirectoryOrCreate"}
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    assert mounts == {"dev": "/dev", "simulated-host": "/host/simulated", "kubelet-pods": "/host/kubelet-pods"}
    # The kubelet's pod directories, beside its plugins directory: pods gone without preStop are forgotten.
    assert volumes["kubelet-pods"]["hostPath"] == {"path": "/var/lib/k0s/kubelet/pods", "type": "Directory"}
    args = init["command"]
    assert args[:4] == ["python3", "-m", "testbed.simulated_node", "setup"]
    state_dir = args[args.index("--dir") + 1]
    assert state_dir == "/host/simulated/gpuready-sim"  # = /var/run/gpuready-sim on the host
    assert args[args.index("--nvml") + 1] == _env(plugin)["NVML"]
    assert args[args.index("--mig-mode") + 1] == "dynamic"  # every MIG instance's nvidia-caps nodes
    assert args[args.index("--kubelet-pods") + 1] == "/host/kubelet-pods"
    assert {"NODE_NAME", "POD_UID"} <= {e["name"] for e in init["env"]}
    assert init["securityContext"]["privileged"] is True
    # The plugin reads and CDI names the directory the init container filled, not driverRoot, and
    # without mount propagation (a host whose / is private would refuse it).
    host_root = "/var/run/gpuready-sim/driver-root"
    assert volumes["driver-root"]["hostPath"] == {"path": host_root, "type": "DirectoryOrCreate"}
    assert _env(plugin)["NVIDIA_DRIVER_ROOT_HOST"] == host_root
    root_mount = next(m for m in plugin["volumeMounts"] if m["name"] == "driver-root")
    assert "mountPropagation" not in root_mount
    # The node's last plugin pod removes what was made.
    assert plugin["lifecycle"]["preStop"]["exec"]["command"] == [
        "python3", "-m", "testbed.simulated_node", "teardown", "--dir", state_dir, "--kubelet-pods", "/host/kubelet-pods"]
    assert {"name": "kubelet-pods", "mountPath": "/host/kubelet-pods", "readOnly": True} in plugin["volumeMounts"]
    assert {"name": "simulated-host", "mountPath": "/host/simulated"} in plugin["volumeMounts"]


def test_without_the_value_nothing_of_it_is_rendered() -> None:
    pod = _pod({"driverRoot": "/run/nvidia/driver"})
    plugin = pod["containers"][0]
    assert "initContainers" not in pod and "lifecycle" not in plugin
    assert "simulated-host" not in {v["name"] for v in pod["volumes"]}
    assert _env(plugin)["NVML"] == "real"
    assert _env(plugin)["NVIDIA_DRIVER_ROOT_HOST"] == "/run/nvidia/driver"
    root_mount = next(m for m in plugin["volumeMounts"] if m["name"] == "driver-root")
    assert root_mount["mountPropagation"] == "HostToContainer"
