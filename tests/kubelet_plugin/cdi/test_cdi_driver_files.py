"""Driver files under a driver root become read-only bind mounts with the host's paths."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from kubelet_plugin.cdi.cdi_spec import CdiDevice, claim_spec, driver_mounts, validate_spec
from kubelet_plugin.cdi.driver_files import find_driver_files


def test_files_found_under_a_container_mount_are_mounted_from_the_host_path() -> None:
    root = tempfile.mkdtemp(dir="/tmp")
    for rel in ("usr/bin/nvidia-smi", "usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
                "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05", "usr/lib/x86_64-linux-gnu/libunrelated.so.1"):
        Path(root, rel).parent.mkdir(parents=True, exist_ok=True)
        Path(root, rel).write_text("x")
    os.symlink("libcuda.so.580.95.05", os.path.join(root, "usr/lib/x86_64-linux-gnu/libcuda.so.1"))
    os.symlink("missing.so", os.path.join(root, "usr/lib/x86_64-linux-gnu/libnvidia-cfg.so.1"))  # dangling
    found = find_driver_files(root)
    assert found == ["/usr/bin/nvidia-smi", "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                     "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
                     "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05"]
    mounts = driver_mounts("/run/nvidia/driver", found)
    assert mounts[0] == {"hostPath": "/run/nvidia/driver/usr/bin/nvidia-smi", "containerPath": "/usr/bin/nvidia-smi",
                         "type": "bind", "options": ["ro", "nosuid", "nodev", "bind"]}
    spec = claim_spec("gpu.nvidia.com", "u1", [CdiDevice("gpu-0", "gpu", "GPU-a", ("/dev/nvidia0",))],
                      ("/dev/nvidiactl",), mounts)
    assert validate_spec(spec) == [] and len(spec["containerEdits"]["mounts"]) == 4


def test_no_driver_means_no_mounts() -> None:
    assert find_driver_files(tempfile.mkdtemp(dir="/tmp")) == []
    assert driver_mounts("/", []) == []
