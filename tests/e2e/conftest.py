"""End-to-end fixtures: a real cluster (testbed.realcluster) with the gpuready kubelet plugin on it.

One cluster per session: etcd, kube-apiserver, kube-scheduler, kube-controller-manager, containerd
and a kubelet for node ``node-a``, then ``python -m dra_driver kubelet-plugin`` as a real process
on a simulated node, registered with that kubelet through its plugin registry directory, and the
DeviceClasses of deploy/deviceclasses/. Tests talk to it like users do: the API, pod logs, files
on the node.

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

import pytest
from e2e_controller import RunningController, start_controller
from e2e_support import (
    E2E,
    NODE,
    PROFILE,
    REPO,
    SESSION_PLUGIN_ARGS,
    sim_device_nodes,
    start_plugin,
    wait_for,
)

from testbed.realcluster import Cluster, ClusterConfig, ComponentError, MissingBinary, binaries

_started: dict[str, Cluster] = {}


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
    cluster = Cluster(bins, ClusterConfig(node_name=NODE, keep_dir=keep))
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
        cluster.kubectl("apply", "-f", os.path.join(REPO, "deploy", "deviceclasses"))
        from kubernetes import client as k

        api = cluster.api_client()
        control_dir = os.path.join(cluster.dir, "sim-control", NODE)
        env = E2E(cluster=cluster, plugin=start_plugin(cluster, extra_args=SESSION_PLUGIN_ARGS, control_dir=control_dir),
                  api=api, core=k.CoreV1Api(api), resource=k.ResourceV1Api(api), control_dir=control_dir)
        env.wait_plugin_registered(env.plugin)
        wait_for(f"{NODE}'s ResourceSlices with devices", env.slice_devices, 60)
        cluster.timings["e2e-ready"] = round(time.monotonic() - t0, 2)
        print(f"\ne2e cluster in {cluster.dir}: {cluster.timings}", file=sys.stderr)
        yield env
    except BaseException:
        print(cluster.failure_report(), file=sys.stderr)
        raise
    finally:
        _started.pop("cluster", None)
        cluster.stop()


@pytest.fixture(scope="session")
def controller(e2e: E2E) -> Iterator[RunningController]:
    """The gpuready controller as a process, its webhooks registered in the API server, placement
    mode on: started by the first test that needs it, stopped (webhooks unregistered) at the end."""
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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """On a failed e2e test, attach the tail of every component's log to the report."""
    report = yield
    cluster = _started.get("cluster")
    if report.failed and cluster is not None and "e2e" in item.keywords:
        report.sections.append(("real cluster logs", cluster.failure_report()))
    return report
