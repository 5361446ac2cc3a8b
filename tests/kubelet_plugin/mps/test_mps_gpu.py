"""MPS on a real GPU: the plugin prepares an MPS claim, a real CUDA client set up from the claim's CDI spec
connects to the claim's MPS server, and unprepare stops it. GPU-wide settings are never changed.

The client is run the way a container runtime would apply the CDI spec: the spec's environment, and
its mounts bind-mounted in a private mount namespace (so the client sees the claim's shm directory as
/dev/shm, as a container would).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.opaque_config import API_VERSION
from kubelet_plugin.cdi.driver_files import find_driver_binary
from kubelet_plugin.mps.control_daemon import MpsControl, MpsControlSettings
from kubelet_plugin.mps.mps_dirs import daemon_alive
from kubelet_plugin.nvml import open_nvml
from testbed.plugin_harness import PluginHarness, opaque

pytestmark = pytest.mark.gpu
NODE = "gpu-node"

_CLIENT = """
import sys
try:
    import torch
    x = torch.ones(1 << 20, device="cuda")
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    big_ok = True
    try:
        y = torch.empty(6 << 30, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
    except RuntimeError:
        big_ok = False
except ImportError:
    import cupy
    x = cupy.ones(1 << 20)
    cupy.cuda.Device().synchronize()
    free, total = cupy.cuda.runtime.memGetInfo()
    big_ok = True
    try:
        y = cupy.empty(6 << 30, dtype=cupy.uint8)
    except cupy.cuda.memory.OutOfMemoryError:
        big_ok = False
print(f"READY sum={float(x.sum())} total={total} six_gib_allocated={big_ok}", flush=True)
sys.stdin.read()  # stay connected until the test has looked at the server
"""


def _cuda_python() -> bool:
    probe = "import importlib.util as u, sys; sys.exit(0 if (u.find_spec('torch') or u.find_spec('cupy')) else 1)"
    return subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory() as d:
        probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                                'mount --bind "$0" /dev/shm', d], capture_output=True, check=False)
        return probe.returncode == 0


def _compute_modes(nvml: Any) -> list[int]:
    return [nvml.nvmlDeviceGetComputeMode(nvml.nvmlDeviceGetHandleByIndex(i))
            for i in range(nvml.nvmlDeviceGetCount())]


@pytest.fixture
def mps_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[bool]:
    if find_driver_binary("nvidia-cuda-mps-control", "/") is None:
        pytest.skip("nvidia-cuda-mps-control is not installed on this machine (NVIDIA driver's MPS tools)")
    if not _cuda_python():
        pytest.skip(f"neither PyTorch nor CuPy is importable by {sys.executable}")
    private_shm = _can_unshare()  # without CAP_SYS_ADMIN: daemon and client share this machine's /dev/shm
    monkeypatch.setenv("MPS_PRIVATE_SHM", "true" if private_shm else "false")
    yield private_shm


def test_mps_claim_serves_a_real_cuda_client_and_unprepare_stops_it(mps_env: bool) -> None:
    nvml = open_nvml("real")
    modes_before = _compute_modes(nvml)
    with PluginHarness() as h:
        plugin = h.start_plugin(NODE, nvml, health_mode="off")
        plugin.preparer.mps = MpsControl(MpsControlSettings(start_timeout=60.0, stop_timeout=30.0))
        whole = [g for g in plugin.inventory.current().devices.gpus if g.name in plugin.inventory.current().index]
        assert whole, f"no whole GPU to prepare (MIG mode on everywhere?): {plugin.inventory.current().devices.gpus}"
        gpu = min(whole, key=lambda g: g.minor)
        uid = h.create_claim("mps", [("gpu", NODE, gpu.name)], config=[opaque(
            {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mps": {
                "defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "4Gi"}}})])
        kubelet = h.kubelet(NODE)
        result = kubelet.prepare([("default", "mps", uid)])[uid]
        assert result.ok, result.error
        record = plugin.checkpoint.get(uid)
        assert record is not None and record.mps is not None and daemon_alive(record.mps.pid)
        mps = plugin.preparer.mps
        assert isinstance(mps, MpsControl)
        try:
            assert "50" in mps.query(record.mps, "get_default_active_thread_percentage")
            limit = mps.query(record.mps, f"get_default_device_pinned_mem_limit {gpu.uuid}")
            assert "4G" in limit or "4096M" in limit, limit

            edits = h.read_spec(NODE, uid)["devices"][0]["containerEdits"]
            env = dict(os.environ)
            env.update(e.split("=", 1) for e in edits["env"])
            assert env["CUDA_MPS_PIPE_DIRECTORY"] == record.mps.pipe_dir
            env.pop("CUDA_VISIBLE_DEVICES", None)  # under MPS the client sees the server's devices
            command = [sys.executable, "-c", _CLIENT]
            # Apply the spec's mounts as a runtime would, in the client's own mount namespace (a mount
            # whose container path is its host path is already in place here).
            mounts = [m for m in edits.get("mounts", []) if m["hostPath"] != m["containerPath"]]
            if mounts:
                script = " && ".join(f'mount --bind "{m["hostPath"]}" "{m["containerPath"]}"' for m in mounts)
                command = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                           f'{script} && exec "$0" "$@"', *command]
            client = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
            try:
                assert client.stdout is not None
                ready = client.stdout.readline()
                assert ready.startswith("READY"), f"{ready} {client.stderr.read() if client.stderr else ''}"
                print(f"MPS client on {gpu.name}: {ready.strip()} (private /dev/shm: {mps_env})")
                servers = mps.query(record.mps, "get_server_list").split()
                assert servers, "the claim's MPS control daemon started no server for the client"
                clients = mps.query(record.mps, f"get_client_list {servers[0]}")
                print(f"MPS server {servers[0]} clients: {clients.split()}")
                assert "six_gib_allocated=False" in ready  # the 4Gi pinned-memory limit is enforced
            finally:
                client.communicate(input="", timeout=60)
        finally:
            assert kubelet.unprepare([("default", "mps", uid)]) == {uid: ""}
        assert not daemon_alive(record.mps.pid)
        assert not os.path.exists(record.mps.root)
    assert _compute_modes(nvml) == modes_before  # MPS here never touches the compute mode
