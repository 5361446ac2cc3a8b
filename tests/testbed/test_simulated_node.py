"""What the chart's simulated.enabled sets up on a node (testbed/simulated_node.py): a driver root the
plugin finds and pods can run, the device nodes CDI specs name, and teardown that leaves nothing
once the last plugin pod of a rolling update is gone."""

from __future__ import annotations

import ctypes
import json
import os
import stat
import subprocess
import sys

import pytest

from kubelet_plugin.cdi.driver_files import find_driver_files
from kubelet_plugin.cdi.elf_files import elf_soname
from testbed.simulated_node import (
    NVIDIA_SMI_OUTPUT,
    HostState,
    _discover,
    device_nodes,
    make_driver_root,
)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")


def test_the_fake_nvidia_smi_runs_with_any_arguments_and_says_it_is_simulated(tmp_path: str) -> None:
    root = make_driver_root(str(tmp_path))
    done = subprocess.run([os.path.join(root, "usr/bin/nvidia-smi"), "-L"], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (0, NVIDIA_SMI_OUTPUT)
    assert "simulated.enabled" in done.stdout


def test_the_plugin_finds_the_fake_driver_files_as_it_finds_a_real_drivers(tmp_path: str) -> None:
    root = make_driver_root(str(tmp_path))
    files = find_driver_files(root)
    assert sorted(f.container_path for f in files.libraries) == [
        "/usr/local/nvidia/lib64/libcuda.so.1", "/usr/local/nvidia/lib64/libnvidia-ml.so.1"]
    assert [f.container_path for f in files.tools] == ["/usr/bin/nvidia-smi"]
    assert files.skipped == ()
    library = root + files.libraries[0].source
    assert elf_soname(library) in ("libcuda.so.1", "libnvidia-ml.so.1")
    ctypes.CDLL(library)  # a program that dlopens the library gets it (and then finds no symbol)
    assert make_driver_root(root) == root and find_driver_files(root) == files  # idempotent


def test_device_nodes_follow_the_profile_and_the_mig_mode() -> None:
    whole = [n.path for n in device_nodes(_discover("sim:h100-80gb@n1"), "static")]
    assert whole == ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]  # nvidia<N>, nvidiactl: majors in the spec
    eight = _discover("sim:8xh100@n1")  # GPU 7 is split into MIG devices: their nvidia-caps nodes too
    caps = {p for g in eight["gpus"] for m in g.get("mig_devices") or [] for p in m["device_nodes"]}
    assert caps and {n.path for n in device_nodes(eight, "static")} == {*whole, *caps}
    mixed = device_nodes(_discover("sim:h100-mixed-mig@n1"), "static")
    assert "/dev/nvidia-caps/nvidia-cap21" in [n.path for n in mixed]
    dynamic = device_nodes(_discover("sim:4xh200@n1"), "dynamic")
    assert len([n for n in dynamic if "nvidia-caps" in n.path]) == 4 * 135  # every instance it may create
    assert len({n.path for n in dynamic}) == len(dynamic)


@needs_root
def test_setup_makes_what_is_missing_and_the_last_pod_removes_it(tmp_path: str) -> None:
    dev_root, state_dir = os.path.join(tmp_path, "host"), os.path.join(tmp_path, "gpuready", "simulated")
    os.makedirs(os.path.join(dev_root, "dev"))
    with open(os.path.join(dev_root, "dev", "nvidia-uvm-tools"), "w"):
        pass  # the host's own: never touched
    nodes = device_nodes(_discover("sim:h100-mixed-mig@n1"), "static")
    state = HostState(state_dir, dev_root)

    made = state.setup("old-pod", nodes)
    assert "/dev/nvidia-uvm-tools" not in [n.path for n in made]
    st = os.lstat(dev_root + "/dev/nvidia-uvm")
    assert stat.S_ISCHR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666
    assert find_driver_files(os.path.join(state_dir, "driver-root")).tools

    # A rolling update: the new pod sets up before the old one stops; the old one's teardown keeps all.
    assert state.setup("new-pod", nodes) == []
    assert state.teardown("old-pod") == []
    assert os.path.exists(dev_root + "/dev/nvidia-uvm")

    removed = state.teardown("new-pod")  # helm uninstall: the last pod goes
    assert sorted(removed) == sorted(n.path for n in made)
    assert os.listdir(os.path.join(dev_root, "dev")) == ["nvidia-uvm-tools"]
    assert not os.path.exists(state_dir)


@needs_root
def test_the_command_line_is_what_the_chart_runs(tmp_path: str) -> None:
    dev_root, state_dir = os.path.join(tmp_path, "host"), os.path.join(tmp_path, "simulated")
    os.makedirs(os.path.join(dev_root, "dev"))
    common = ["--dir", state_dir, "--dev-root", dev_root, "--pod-uid", "u1"]
    up = subprocess.run([sys.executable, "-m", "testbed.simulated_node", "setup", "--nvml", "sim:h100-80gb@n1",
                         "--mig-mode", "static", *common], capture_output=True, text=True, check=True)
    assert json.loads(up.stdout) == {"event": "simulated_node_ready", "device_nodes_made": 2, "pod_uid": "u1",
                                     "driver_root": os.path.join(state_dir, "driver-root")}
    down = subprocess.run([sys.executable, "-m", "testbed.simulated_node", "teardown", *common],
                          capture_output=True, text=True, check=True)
    assert json.loads(down.stdout)["device_nodes_removed"] == 2
    assert os.listdir(os.path.join(dev_root, "dev")) == []


@needs_root
def test_a_pod_gone_without_its_prestop_does_not_keep_the_files_forever(tmp_path: str) -> None:
    dev_root, state_dir = os.path.join(tmp_path, "host"), os.path.join(tmp_path, "simulated")
    pods = os.path.join(tmp_path, "kubelet", "pods")
    os.makedirs(os.path.join(dev_root, "dev"))
    nodes = device_nodes(_discover("sim:h100-80gb@n1"), "static")
    os.makedirs(os.path.join(pods, "crashed"))
    HostState(state_dir, dev_root, pods).setup("crashed", nodes)
    os.rmdir(os.path.join(pods, "crashed"))  # force-deleted: no preStop, the kubelet cleaned up its pod

    # A wrong kubelet path (this pod's own directory not there) forgets nobody.
    assert HostState(state_dir, dev_root, os.path.join(tmp_path, "elsewhere")).setup("live", nodes) == []
    assert HostState(state_dir, dev_root, os.path.join(tmp_path, "elsewhere")).teardown("live") == []
    assert os.path.exists(dev_root + "/dev/nvidia-uvm")

    os.makedirs(os.path.join(pods, "live"))
    state = HostState(state_dir, dev_root, pods)
    state.setup("live", nodes)
    assert sorted(state.teardown("live")) == ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert not os.path.exists(state_dir)
