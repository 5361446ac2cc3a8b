"""docs/install.md's "Try it on a cluster without GPUs", run as written on the real cluster.

The section's ``bash`` blocks are read from the file (so a doc that drifts fails here) and run in
order by bash from the repository root, with only the values a reader sets for their own cluster
in the environment: ``KUBECONFIG``, a ``PATH`` with kubectl, ctr and helm, the kubelet root, CDI
directory and containerd socket ``python -m testbed.realcluster`` prints, the test image's archive and,
the cluster being air-gapped, ``EXAMPLE_IMAGE`` (the gpuready image itself, as the section says).
The node starts as a GPU-less node does: the session's release is uninstalled, the device nodes the
suite made for it are removed (the chart must make its own) and its old GPUReady condition is dropped.

Then: the example pods Succeeded with the simulated node's nvidia-smi in their log, and GPUReady is
True naming the published device count; the section's "Remove it" commands take the leader Lease
with the release, and an immediate reinstall (the old slices may linger) leads and publishes at once;
after its uninstall nothing of gpuready's is left: no object in its namespace or in the cluster (looked
up by name and driver, not by the release label), no ResourceSlice, and no file on the node (CDI
specs, sockets, the chart's directory, the device nodes it made).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_chart import PLUGIN_SELECTOR, leftover_objects
from e2e_support import DRIVER, E2E, MODE, NODE, REPO, wait_for

from testbed.realcluster import gpuready_image
from testbed.simulated_node import NVIDIA_SMI_OUTPUT

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster"), pytest.mark.uninstalls_the_release,
              pytest.mark.skipif(MODE != "chart", reason="chart mode only: the doc installs the chart itself")]

DOC = os.path.join(REPO, "docs", "install.md")
SECTION = "### Try it on a cluster without GPUs"
REMOVE = "#### Remove it"
NAMESPACE = "gpuready"  # the doc's
SIM_DIR = "/run/gpuready/simulated"  # simulated.hostDirectory's default


def doc_blocks() -> tuple[list[str], list[str]]:
    """The section's ``bash`` blocks before its "Remove it" heading, and after."""
    with open(DOC) as f:
        text = f.read()
    assert f"\n{SECTION}\n" in text, f"docs/install.md has no section {SECTION!r}"
    rest = text.split(f"\n{SECTION}\n", 1)[1]
    end = re.search(r"^#{1,3} ", rest, re.M)
    section = rest[:end.start()] if end else rest
    install, found, remove = section.partition(f"\n{REMOVE}\n")
    assert found, f"the section has no {REMOVE!r} part"

    def blocks(part: str) -> list[str]:
        return re.findall(r"^```bash\n(.*?)^```$", part, re.S | re.M)

    return blocks(install), blocks(remove)


def run_doc(script: str, env: dict[str, str], what: str) -> str:
    """Run the doc's commands as a reader's shell would (stopping at the first failure)."""
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, (f"docs/install.md's {what} failed (exit {done.returncode}):\n{script}\n"
                                  f"--- output ---\n{done.stdout}\n{done.stderr}")
    return done.stdout


def reader_env(e2e: E2E) -> dict[str, str]:
    """What a reader of the section has set: their cluster's paths and tools, the image archive."""
    bins = e2e.cluster.bins
    tools = dict.fromkeys(os.path.dirname(p) for p in (bins.kubectl, bins.ctr, bins.helm))
    return {**os.environ, "PATH": ":".join([*tools, os.environ.get("PATH", "/usr/bin:/bin")]),
            "KUBECONFIG": e2e.cluster.kubeconfig, "KUBELET_ROOT": e2e.cluster.kubelet_root,
            "CDI_DIR": e2e.cluster.cdi_dir, "CONTAINERD_SOCK": e2e.cluster.containerd_socket,
            "IMAGE_ARCHIVE": gpuready_image.build(testbed=True),
            "EXAMPLE_IMAGE": gpuready_image.image_name(testbed=True)}


def fresh_node(e2e: E2E) -> None:
    """The session's node as a GPU-less node is before anyone installed gpuready."""
    if e2e.release is not None:
        e2e.release.uninstall()
        e2e.release = None
        wait_for("the session's plugin pods to go", lambda: not e2e.cluster.kubectl(
            "get", "pods", "-A", "-l", PLUGIN_SELECTOR, "-o", "name").strip(), 90)
    e2e.cluster.device_nodes.remove()  # the chart must make what its CDI specs name
    node = e2e.core.read_node(NODE)
    conditions = [c.type for c in node.status.conditions or []]
    if "GPUReady" in conditions:
        i = conditions.index("GPUReady")
        e2e.cluster.kubectl("patch", "node", NODE, "--subresource=status", "--type=json", "-p", json.dumps(
            [{"op": "test", "path": f"/status/conditions/{i}/type", "value": "GPUReady"},
             {"op": "remove", "path": f"/status/conditions/{i}"}]))


def gpu_ready(e2e: E2E) -> Any:
    node = e2e.core.read_node(NODE)
    return next((c for c in node.status.conditions or [] if c.type == "GPUReady"), None)


DEVICE_NODES = ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-caps")  # what 8xh100's specs stat


def device_nodes_here() -> set[str]:
    return {p for p in DEVICE_NODES if os.path.lexists(p)}


def node_files(e2e: E2E, host_own: set[str]) -> list[str]:
    """gpuready's files on the node: CDI specs, sockets, the chart's directory, device nodes that
    were not there before (``host_own``: the host's own, which the chart leaves alone)."""
    registry = os.path.join(e2e.cluster.kubelet_root, "plugins_registry")
    files = [*e2e.cdi_spec_files(), *(n for n in os.listdir(registry) if DRIVER in n)]
    return files + [p for p in (SIM_DIR, *sorted(device_nodes_here() - host_own)) if os.path.lexists(p)]


def timed_install(e2e: E2E, script: str, env: dict[str, str]) -> dict[str, float]:
    """Run the doc's install commands; seconds from their start, and from the plugin container's start
    (whole seconds: up to 1 s more), until the new plugin pod says its node's devices are published
    (``/readyz``: registered, and the node's ResourceSlices are what it publishes, whether it wrote
    them or found the old ones already right)."""
    seen: dict[str, float] = {}
    done = threading.Event()
    t0 = time.monotonic()

    def watch() -> None:
        while not done.is_set() and not seen:
            with contextlib.suppress(Exception):
                for pod in e2e.core.list_namespaced_pod(NAMESPACE, label_selector=PLUGIN_SELECTOR).items:
                    if pod.status.pod_ip and not pod.metadata.deletion_timestamp:
                        with urllib.request.urlopen(f"http://{pod.status.pod_ip}:8080/readyz", timeout=1) as r:
                            if r.status == 200:
                                seen["published"] = time.monotonic() - t0
                                now = datetime.datetime.now(datetime.UTC)
                                started = pod.status.container_statuses[0].state.running.started_at
                                seen["published-after-plugin-start"] = (now - started).total_seconds()
            done.wait(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        run_doc(script, env, "install")
        watcher.join(10)
    finally:
        done.set()
    return seen


def campaign_to_leader(e2e: E2E) -> float:
    """Seconds from the leading controller's first log line (its process up, campaigning at once) to
    its ``leader_started``: what an old holder left in the Lease would stretch to its whole term."""
    from e2e_chart import CONTROLLER_SELECTOR

    for pod in e2e.core.list_namespaced_pod(NAMESPACE, label_selector=CONTROLLER_SELECTOR).items:
        lines = [json.loads(line) for line in e2e.core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE).splitlines()
                 if line.startswith("{")]
        led = [x["ts"] for x in lines if x.get("event") == "leader_started"]
        if led:
            def at(ts: str) -> datetime.datetime:
                return datetime.datetime.fromisoformat(ts.replace("Z", "+00:00"))
            return (at(led[0]) - at(lines[0]["ts"])).total_seconds()
    raise AssertionError("no controller replica leads")


@pytest.fixture
def removed_afterwards(e2e: E2E) -> Iterator[None]:
    """Whatever the test's outcome, the doc's release goes before the session's cluster does: its last
    plugin pod's preStop must run, or the host keeps the simulated node's files."""
    yield
    with contextlib.suppress(Exception):
        if e2e.cluster.kubectl("get", "daemonsets", "--namespace", NAMESPACE, "-o", "name").strip():
            subprocess.run([e2e.cluster.bins.helm, "--kubeconfig", e2e.cluster.kubeconfig, "uninstall", "gpuready",
                            "--namespace", NAMESPACE, "--wait"], capture_output=True, timeout=180, check=False)
            wait_for("the plugin pods to go", lambda: not e2e.cluster.kubectl(
                "get", "pods", "-n", NAMESPACE, "-l", PLUGIN_SELECTOR, "-o", "name").strip(), 90)


@pytest.mark.usefixtures("removed_afterwards")
def test_the_gpu_less_section_runs_as_written_and_uninstall_leaves_nothing(e2e: E2E) -> None:
    install_blocks, remove_blocks = doc_blocks()
    assert any("helm install" in b for b in install_blocks) and any("helm uninstall" in b for b in remove_blocks)
    env = reader_env(e2e)
    fresh_node(e2e)
    host_own = device_nodes_here()  # none on a fresh machine; on a shared one another run's may be left
    assert gpu_ready(e2e) is None

    # One shell session, as a reader's: the first block's exports (which keep what is set) go before
    # each part; the install is timed on its own.
    exports = install_blocks[0]
    i = next(n for n, b in enumerate(install_blocks) if "helm install" in b)
    run_doc("\n".join(install_blocks[:i]), env, "GPU-less install (before helm install)")
    first = timed_install(e2e, "\n".join([exports, install_blocks[i]]), env)
    out = run_doc("\n".join([exports, *install_blocks[i + 1:]]), env, "GPU-less install (the examples)")
    # The examples ran on simulated GPUs: the fake driver root's nvidia-smi reached them through CDI.
    for pod in ("one-gpu", "at-least-40gi"):
        assert e2e.core.read_namespaced_pod(pod, "default").status.phase == "Succeeded"
    assert NVIDIA_SMI_OUTPUT.strip() in out
    assert device_nodes_here() == set(DEVICE_NODES)  # made by the chart (or the host's own, left alone)
    published = len(e2e.slice_devices())
    condition = gpu_ready(e2e)
    assert published > 0 and condition.status == "True", condition
    assert f"all {published} GPU devices passed validation" in condition.message, (published, condition.message)

    run_doc("\n".join(remove_blocks), env, "Remove it")
    # The Leases went with the release: nothing for the next install's controllers to wait out. The
    # leader Lease is the release's own; the garbage collector removes the plugin's heartbeat Lease
    # after its DaemonSet, so it can outlive `helm uninstall --wait` by a moment.
    wait_for("the release's Leases to go", lambda: e2e.cluster.kubectl(
        "get", "leases", "--namespace", NAMESPACE, "-o", "name").strip() == "", 60)

    # An immediate reinstall (the old slices may still be there): leads and publishes at once.
    times = timed_install(e2e, "\n".join([exports, install_blocks[i]]), env)
    times["campaign-to-leader"] = wait_for("a leader", lambda: [campaign_to_leader(e2e)], 30)[0]
    print(f"\nfirst install, seconds: {first}\nreinstall, seconds: {times}")
    # The release took its Lease: no old holder to wait out, the first campaign wins.
    assert times["campaign-to-leader"] <= 2.0, times
    # Nothing of the old release is waited for: the new plugin publishes within 5 s of starting (its
    # pod's start-up before that is the machine's: on a loaded 2-core CI host it alone can take 5 s).
    assert "published" in first and "published" in times, (first, times)
    assert times["published-after-plugin-start"] <= 5.0, (first, times)

    run_doc("helm uninstall gpuready --namespace gpuready --wait", env, "uninstall")
    wait_for("the plugin pods to go", lambda: not e2e.cluster.kubectl(
        "get", "pods", "-n", NAMESPACE, "-l", PLUGIN_SELECTOR, "-o", "name").strip(), 90)
    wait_for("gpuready's files to leave the node", lambda: node_files(e2e, host_own) == [], 30)
    wait_for(f"{NODE}'s ResourceSlices to go", lambda: not e2e.slice_devices(), 90)
    # What the garbage collector removes after the release's own objects (the controller's pods and
    # ReplicaSet, the heartbeat Lease) goes within a minute; anything still there then was left behind
    # (wait_for's timeout names it: the check's last failure).
    def nothing_left() -> bool:
        left = leftover_objects(e2e.cluster, NAMESPACE)
        assert left == [], f"helm uninstall left objects of gpuready's behind: {left}"
        return True

    wait_for("nothing of gpuready's left", nothing_left, 60)
