"""End-to-end fixtures: a real cluster (testbed.realcluster) with the gpuready kubelet plugin on it.

One cluster per session: etcd, kube-apiserver, kube-scheduler, kube-controller-manager, containerd
and a kubelet for node ``node-a``, then ``python -m dra_driver kubelet-plugin`` as a real process
on a simulated node, registered with that kubelet through its plugin registry directory, and the
DeviceClasses of deploy/deviceclasses/. Tests talk to it like users do: the API, pod logs, files
on the node.

Two modes, one suite (``GPUREADY_E2E_MODE``):

- ``chart`` (the default, and CI's): ``helm install`` of deploy/helm/gpuready with the gpuready image
  (``e2e_chart.py``): the plugin is the DaemonSet's pod, the controller the Deployment's, the
  DeviceClasses the chart's.
- ``process`` (quicker to iterate on: no image to rebuild after a change): the plugin and, for the tests that
  ask for it, the controller run as host processes from this checkout, and deploy/deviceclasses/
  is applied.

A missing binary, a component that does not come up or a plugin the kubelet does not register is
a test error, never a skip: the suite exists to run against the real thing.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import Generator, Iterator
from typing import Any

import pytest
from e2e_chart import install_release
from e2e_controller import ChartController, RunningController, start_controller, webhook_shapes_claims
from e2e_support import (
    E2E,
    MODE,
    NODE,
    PROFILE,
    REPO,
    SESSION_PLUGIN_ARGS,
    sim_device_nodes,
    start_plugin,
    wait_for,
)

from testbed.realcluster import Cluster, ClusterConfig, ComponentError, MissingBinary, binaries
from testbed.realcluster.cuda_images import CUDA_CHECK_IMAGES, cuda_check_archive
from testbed.realcluster.fake_driver import make_fake_driver_root

_started: dict[str, Any] = {}


@pytest.fixture(scope="session")
def e2e() -> Iterator[E2E]:
    """The session's cluster with the plugin registered and its slices published."""
    if os.geteuid() != 0:
        pytest.fail("the e2e suite runs a kubelet and containerd: it must run as root", pytrace=False)
    problem = ""
    try:
        bins = binaries.find()
    except MissingBinary as e:
        problem = str(e)
    if problem:  # failed outside the except block: the report shows the list, not a traceback chain
        pytest.fail(problem, pytrace=False)
    keep = os.environ.get("GPUREADY_E2E_KEEP", "") not in ("", "0")
    image_cache = ClusterConfig().image_cache or os.path.expanduser("~/.cache/gpuready/k8s/images")
    t_images = time.monotonic()
    try:  # the cuda-check images (gcc; cached) the node imports, for test_driver_files_in_pod.py
        cuda_images = tuple(cuda_check_archive(image_cache, layout) for layout in sorted(CUDA_CHECK_IMAGES))
    except ComponentError as e:
        problem = f"the cuda-check images could not be built: {e}"
    if problem:
        pytest.fail(problem, pytrace=False)
    cluster = Cluster(bins, ClusterConfig(node_name=NODE, keep_dir=keep, image_cache=image_cache,
                                          extra_images=cuda_images))
    cluster.timings["cuda-check-images"] = round(time.monotonic() - t_images, 2)
    t0 = time.monotonic()
    try:
        cluster.start()
    except ComponentError as e:
        problem = f"the cluster did not come up: {e}"
    if problem:
        pytest.fail(problem, pytrace=False)
    _started["cluster"] = cluster
    try:
        for path, major, minor in sim_device_nodes(PROFILE):
            cluster.device_nodes.ensure(path, major, minor)
        # The node's NVIDIA driver install, faked: its libcuda and nvidia-smi reach pods through CDI.
        driver_root = make_fake_driver_root(os.path.join(cluster.dir, "driver-root"), image_cache)
        from kubernetes import client as k

        api = cluster.api_client()
        control_dir = os.path.join(cluster.dir, "sim-control", NODE)
        env = E2E(cluster=cluster, api=api, core=k.CoreV1Api(api), resource=k.ResourceV1Api(api),
                  control_dir=control_dir, driver_root=driver_root)
        t_install = time.monotonic()
        if MODE == "chart":
            env.release = install_release(cluster, control_dir, driver_root)
            cluster.timings.update(env.release.timings)
        else:
            cluster.kubectl("apply", "-f", os.path.join(REPO, "deploy", "deviceclasses"))
            env.plugin = start_plugin(cluster, extra_args=SESSION_PLUGIN_ARGS, control_dir=control_dir,
                                      driver_root=driver_root)
            env.wait_plugin_registered(env.plugin)
        wait_for(f"{NODE}'s ResourceSlices with devices", env.slice_devices, 60)
        cluster.timings["install-to-first-slice"] = round(time.monotonic() - t_install, 2)
        cluster.timings["e2e-ready"] = round(time.monotonic() - t0, 2)
        print(f"\ne2e cluster ({MODE} mode) in {cluster.dir}: {cluster.timings}", file=sys.stderr)
        _started["env"] = env
        yield env
    except BaseException:
        print(cluster.failure_report(), file=sys.stderr)
        raise
    finally:
        _started.pop("cluster", None)
        _started.pop("env", None)
        cluster.stop()


@pytest.fixture(scope="session")
def controller(e2e: E2E) -> Iterator[RunningController | ChartController]:
    """The gpuready controller with its webhooks registered in the API server, placement mode on.
    Chart mode: the chart's Deployment, once its webhook shapes a claim. Process mode: a process,
    started by the first test that needs it, stopped (webhooks unregistered) at the end."""
    if e2e.release is not None:
        wait_for("the chart's mutating webhook to shape a VRAM claim (dry run)",
                 lambda: webhook_shapes_claims(e2e.cluster), 60)
        yield ChartController(e2e.release)
        return
    running = start_controller(e2e.cluster)
    yield running
    running.stop(e2e.cluster)


@pytest.fixture
def namespace(e2e: E2E) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (without waiting for it to go)."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    e2e.core.create_namespace({"metadata": {"name": name}})
    # Pods need the namespace's default ServiceAccount, which the controller-manager makes.
    wait_for(f"ServiceAccount {name}/default", lambda: e2e.core.read_namespaced_service_account("default", name), 30)
    yield name
    with contextlib.suppress(Exception):
        e2e.core.delete_namespace(name)


def pytest_configure(config: pytest.Config) -> None:
    """The marker of the test that removes the Helm release (run last: the others need it)."""
    config.addinivalue_line("markers", "uninstalls_the_release: runs after every other e2e test")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the tests that uninstall the release to the end of the session."""
    items.sort(key=lambda item: item.get_closest_marker("uninstalls_the_release") is not None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """On a failed e2e test, attach the tail of every component's log to the report."""
    report = yield
    cluster = _started.get("cluster")
    if report.failed and cluster is not None and "e2e" in item.keywords:
        report.sections.append(("real cluster logs", cluster.failure_report()))
        if env := _started.get("env"):
            report.sections.append(("gpuready pods", env.release_report()))
    return report
