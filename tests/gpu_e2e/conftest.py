"""The real-GPU end-to-end suite's session: see gpu_e2e_support.py for what it runs and why."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator

import pytest
from gpu_e2e_support import GpuCluster, apply_device_classes, archives, gpu_settings, report, start_plugin

from testbed.realcluster import Cluster, ClusterConfig, binaries, cuda_images
from testbed.realcluster.hostnet import host_address

NODE = "gpu-node"


@pytest.fixture(scope="session")
def gpu() -> Iterator[GpuCluster]:
    """The session's cluster with the plugin registered and the real GPU published after its probe."""
    if os.geteuid() != 0:
        pytest.skip("the real-GPU suite runs a kubelet and containerd: root only")
    before = gpu_settings()
    report("gpu_settings_before", settings=before)
    bins = binaries.find(optional=binaries.GPU_HOST_OPTIONAL)
    cache = os.environ.get("GPUREADY_IMAGE_CACHE", "") or os.path.expanduser("~/.cache/gpuready/k8s/images")
    carried = archives(cache)
    config = ClusterConfig(node_name=NODE, node_ip=host_address(), host_network=True,
                           controller_manager=bool(bins.kube_controller_manager), image_cache=cache,
                           extra_images=tuple(carried.values()), start_timeout=180.0,
                           keep_dir=os.environ.get("GPUREADY_E2E_KEEP", "") not in ("", "0"))
    cluster = Cluster(bins, config)
    t0 = time.monotonic()
    cluster.start()
    try:
        from kubernetes import client as k

        api = cluster.api_client()
        resource = k.ResourceV1Api(api)
        apply_device_classes(resource)
        t_plugin = time.monotonic()
        plugin = start_plugin(cluster)
        env = GpuCluster(cluster=cluster, core=k.CoreV1Api(api), resource=resource, plugin=plugin,
                         images=dict(cuda_images.CUDA_CHECK_IMAGES))
        deadline = time.monotonic() + 240
        # Published and registered: the kubelet prepares only for a driver that registered with it
        # (a pod bound before that waits for the kubelet's retry).
        while not env.slice_devices() or "event=plugin_registered" not in _read(plugin.log_path):
            if not plugin.running() or time.monotonic() > deadline:
                raise AssertionError("the real GPU was never published:\n" + cluster.failure_report(60))
            time.sleep(0.2)
        env.timings = {**cluster.timings, "plugin-start-to-first-slice": round(time.monotonic() - t_plugin, 2),
                       "cluster-start-to-first-slice": round(time.monotonic() - t0, 2)}
        report("cluster", timings=env.timings, devices=sorted(env.slice_devices()))
        yield env
    except BaseException:
        print(cluster.failure_report(60), file=sys.stderr)
        raise
    finally:
        cluster.stop()
        after = gpu_settings()
        report("gpu_settings_after", settings=after, unchanged=after == before)
        assert after == before, f"GPU settings changed during the run:\nbefore: {before}\nafter:  {after}"


@pytest.fixture(autouse=True)
def clean_after(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test leaves no pod or claim behind, passed or failed."""
    yield
    if "gpu" in request.fixturenames:
        request.getfixturevalue("gpu").clean()


def _read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Put each failure in the run's report as it happens: a run cut short still says why."""
    outcome = yield
    result = outcome.get_result()  # type: ignore[attr-defined]
    if result.failed:
        report("test_failed", test=item.nodeid, when=result.when, error=str(result.longrepr)[-4000:])
