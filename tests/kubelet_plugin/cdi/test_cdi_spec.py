"""CDI specs for prepared claims: the right devices, env and mounts, and a spec a CDI loader accepts."""

from __future__ import annotations

from dra_driver.devices import NVIDIA_CONTROL_DEVICE_NODES
from dra_driver.opaque_config import API_VERSION, parse_config
from kubelet_plugin.cdi.cdi_spec import (
    CdiDevice,
    claim_spec,
    driver_mounts,
    minimum_version,
    qualified_device_id,
    spec_file_name,
)
from kubelet_plugin.cdi.driver_files import DriverFile
from testbed.cdi_loader import loader_problems

UID = "001e71af-c5fc-47a6-b4f5-477b213e4080"


def _spec() -> dict:
    devices = [
        CdiDevice("gpu-0", "gpu", "GPU-aaa", ("/dev/nvidia0",)),
        CdiDevice("gpu-1", "gpu", "GPU-bbb", ("/dev/nvidia1",)),
        CdiDevice("gpu-2-mig-1g18gb-19-3", "small", "MIG-ccc",
                  ("/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31")),
    ]
    return claim_spec("gpu.nvidia.com", UID, devices, NVIDIA_CONTROL_DEVICE_NODES,
                      driver_mounts("/run/nvidia/driver", [DriverFile("/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi")]))


def test_names_follow_cdi_conventions() -> None:
    assert qualified_device_id("gpu.nvidia.com", UID, "gpu-0") == f"k8s.gpu.nvidia.com/claim={UID}-gpu-0"
    assert spec_file_name("gpu.nvidia.com", UID) == f"k8s.gpu.nvidia.com-claim_{UID}.json"


def test_spec_lists_device_nodes_uuids_and_mounts() -> None:
    spec = _spec()
    assert loader_problems(spec) == []
    assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
    # hostPath in deviceNodes and names starting with a digit both need 0.5.0, nothing newer is used.
    assert spec["cdiVersion"] == "0.5.0"
    gpu0, gpu1, mig = spec["devices"]
    assert gpu0["name"] == f"{UID}-gpu-0"
    node = gpu0["containerEdits"]["deviceNodes"][0]
    assert (node["path"], node["type"], node["major"], node["minor"]) == ("/dev/nvidia0", "c", 195, 0)
    # Devices of one request carry the same value, so a container given both sees both.
    assert "NVIDIA_VISIBLE_DEVICES=GPU-aaa,GPU-bbb" in gpu0["containerEdits"]["env"]
    assert "NVIDIA_VISIBLE_DEVICES=GPU-aaa,GPU-bbb" in gpu1["containerEdits"]["env"]
    assert "NVIDIA_VISIBLE_DEVICES=MIG-ccc" in mig["containerEdits"]["env"]
    assert [n["path"] for n in mig["containerEdits"]["deviceNodes"]] == [
        "/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31"]
    top = spec["containerEdits"]
    assert [n["path"] for n in top["deviceNodes"]] == list(NVIDIA_CONTROL_DEVICE_NODES)
    assert top["mounts"] == [{"hostPath": "/run/nvidia/driver/usr/bin/nvidia-smi",
                              "containerPath": "/usr/bin/nvidia-smi", "type": "bind",
                              "options": ["ro", "nosuid", "nodev", "bind"]}]


def test_config_env_reaches_the_container() -> None:
    cfg = parse_config({"apiVersion": API_VERSION, "kind": "GpuConfig", "env": {"X": "1"},
                        "visibleDevicesEnv": "CUDA_VISIBLE_DEVICES",
                        "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 25,
                                                               "defaultPinnedDeviceMemoryLimit": "8Gi"}}}).config
    spec = claim_spec("gpu.nvidia.com", UID, [CdiDevice("gpu-0", "gpu", "GPU-aaa", ("/dev/nvidia0",), cfg)],
                      NVIDIA_CONTROL_DEVICE_NODES)
    env = spec["devices"][0]["containerEdits"]["env"]
    for want in ("X=1", "CUDA_VISIBLE_DEVICES=GPU-aaa", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
                 "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M", "GPUREADY_SHARING_STRATEGY=MPS"):
        assert want in env
    assert loader_problems(spec) == []
    assert not any(e.startswith("CUDA_MPS_PIPE_DIRECTORY=") for e in env)  # no daemon given: none claimed


def test_mps_device_points_at_its_daemon_and_timeslicing_exports_no_interval() -> None:
    mps = parse_config({"apiVersion": API_VERSION, "kind": "GpuConfig",
                        "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 30}}}).config
    ts = parse_config({"apiVersion": API_VERSION, "kind": "GpuConfig",
                       "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Default"}}}).config
    pipe, shm = "/var/lib/kubelet/plugins/gpu.nvidia.com/mps/u/pipe", "/var/lib/kubelet/plugins/gpu.nvidia.com/mps/u/shm"
    spec = claim_spec("gpu.nvidia.com", UID, [
        CdiDevice("gpu-0", "a", "GPU-aaa", ("/dev/nvidia0",), mps, mps_pipe_dir=pipe, mps_shm_dir=shm),
        CdiDevice("gpu-1", "b", "GPU-bbb", ("/dev/nvidia1",), ts)], NVIDIA_CONTROL_DEVICE_NODES)
    assert loader_problems(spec) == []
    mps_edits, ts_edits = (d["containerEdits"] for d in spec["devices"])
    assert f"CUDA_MPS_PIPE_DIRECTORY={pipe}" in mps_edits["env"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30" in mps_edits["env"]  # client limit kept
    assert mps_edits["mounts"] == [
        {"hostPath": pipe, "containerPath": pipe, "type": "bind", "options": ["rw", "nosuid", "nodev", "bind"]},
        {"hostPath": shm, "containerPath": "/dev/shm", "type": "bind", "options": ["rw", "nosuid", "nodev", "bind"]}]
    assert "mounts" not in ts_edits
    assert not any(e.startswith(("GPUREADY_TIMESLICE_INTERVAL=", "CUDA_MPS_")) for e in ts_edits["env"])


def test_minimum_version_tracks_features() -> None:
    spec = {"kind": "a.com/b", "devices": [{"name": "x", "containerEdits": {"env": ["A=1"]}}]}
    assert minimum_version(spec) == "0.3.0"
    spec["kind"] = "a.com/b.c"
    assert minimum_version(spec) == "0.6.0"
    spec["devices"][0]["containerEdits"]["netDevices"] = [{"hostInterfaceName": "eth1", "name": "net0"}]
    assert minimum_version(spec) == "1.1.0"
