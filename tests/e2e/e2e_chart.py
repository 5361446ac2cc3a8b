"""The chart mode of the e2e suite: gpuready installed the way users install it.

``helm install`` (helm v4, built by ``build-helm.sh``) of ``deploy/helm/gpuready`` on the real
cluster, with the test-only image tag (the production image plus the simulated NVML, built here by
``build-image.sh`` and imported into the node's containerd) and only the values a user of a
GPU-less test cluster would set: the image, the simulated profile, the kubelet's own directories
(this kubelet's root is not /var/lib/kubelet), the node's driver root (a fake driver install,
``testbed/realcluster/fake_driver.py``), the short recovery times the fault tests need, the
controller's placement mode, the readiness taint mode, and the fault directory
(``testbed.simControlDir``, a test-only value).
The node carries the label GPU nodes get from the GPU Operator, which the DaemonSet's affinity asks
for. The plugin is then the DaemonSet's pod and the controller the Deployment's pods, reached by
the API server through the chart's own Services, certificate and webhook configurations.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from e2e_support import PROFILE, REPO, wait_for

from testbed.realcluster import Cluster, binaries, gpuready_image, images
from testbed.realcluster.procs import ComponentError, run

RELEASE = "gpuready"
NAMESPACE = "gpuready-system"
CHART = os.path.join(REPO, "deploy", "helm", "gpuready")
GPU_NODE_LABEL = "nvidia.com/gpu.present=true"  # what the GPU Operator labels GPU nodes with
PLUGIN_SELECTOR = "app.kubernetes.io/component=kubelet-plugin"
CONTROLLER_SELECTOR = "app.kubernetes.io/component=controller"


def import_image(cluster: Cluster) -> str:
    """Build (or find in the cache) the test-only image and import it into the node; its name."""
    archive = gpuready_image.build(testbed=True)
    images.import_archive(cluster.bins.ctr, cluster.containerd_socket, archive)
    return gpuready_image.image_name(testbed=True)


def tag_image(cluster: Cluster, image: str, tag: str) -> str:
    """The same image under another tag in the node's containerd (a "new version" to upgrade to)."""
    repository = image.rsplit(":", 1)[0]
    run([cluster.bins.ctr, "--address", cluster.containerd_socket, "--namespace", "k8s.io", "images", "tag",
         "--force", image, f"{repository}:{tag}"], "ctr images tag")
    return f"{repository}:{tag}"


@dataclass
class ChartRelease:
    """The installed release and how to reach its pods."""

    cluster: Cluster
    image: str
    control_dir: str
    driver_root: str = "/"
    timings: dict[str, float] = field(default_factory=dict)

    def helm(self, *args: str, timeout: float = 300.0) -> str:
        """Run helm against the cluster as admin; return its output."""
        if not self.cluster.bins.helm:
            raise ComponentError("helm", f"helm is not built: {binaries.HELM_SCRIPT}")
        return run([self.cluster.bins.helm, "--kubeconfig", self.cluster.kubeconfig, *args], "helm", timeout=timeout)

    def values(self, image: str | None = None) -> dict[str, Any]:
        """The values this suite installs with (see the module docstring)."""
        repository, tag = (image or self.image).rsplit(":", 1)
        root = self.cluster.kubelet_root
        return {
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "nvml": {"source": "simulated", "simulatedProfile": PROFILE},
            "driverRoot": self.driver_root,
            "kubeletPlugin": {"registrarDirectoryPath": os.path.join(root, "plugins_registry"),
                              "pluginsDirectoryPath": os.path.join(root, "plugins"),
                              "cdiRoot": self.cluster.cdi_dir,
                              "podResources": {"hostPath": os.path.join(root, "pod-resources")}},
            # A faulted GPU comes back 2 s after its cause clears, after one validation.
            "validation": {"holdDownSeconds": 2, "recoveryPasses": 1},
            "controller": {"placementMode": "gated"},
            "readinessTaint": {"mode": "bootstrap-only"},
            "testbed": {"simControlDir": self.control_dir},
        }

    def _values_file(self, values: dict[str, Any]) -> str:
        path = os.path.join(self.cluster.dir, f"values-{time.monotonic_ns()}.json")
        with open(path, "w") as f:
            json.dump(values, f)  # JSON is YAML
        return path

    def install(self) -> None:
        """``helm install --wait``: returns once the plugin and controller pods are Ready. Times
        ``helm-install-to-first-slice`` (the node's first ResourceSlice of the driver, polled
        meanwhile) and ``helm-install-ready``."""
        from kubernetes import client as k

        resource = k.ResourceV1Api(self.cluster.api_client())
        done = threading.Event()
        t0 = time.monotonic()

        def first_slice() -> None:
            while not done.is_set():
                with contextlib.suppress(Exception):
                    if resource.list_resource_slice(field_selector=f"spec.nodeName={self.cluster.node_name}").items:
                        self.timings["helm-install-to-first-slice"] = round(time.monotonic() - t0, 2)
                        return
                done.wait(0.1)

        watcher = threading.Thread(target=first_slice, name="first-slice", daemon=True)
        watcher.start()
        try:
            self.helm("install", RELEASE, CHART, "--namespace", NAMESPACE, "--create-namespace",
                      "--values", self._values_file(self.values()), "--wait", "--timeout", "4m")
            self.timings["helm-install-ready"] = round(time.monotonic() - t0, 2)
            watcher.join(30)
        finally:
            done.set()

    def upgrade(self, image: str, wait: bool = True, extra: dict[str, Any] | None = None) -> None:
        """``helm upgrade`` to ``image``, with the suite's values plus ``extra`` (top-level keys, such
        as ``sharedGpus``; an upgrade without them goes back to the suite's values)."""
        values = {**self.values(image), **(extra or {})}
        self.helm("upgrade", RELEASE, CHART, "--namespace", NAMESPACE, "--values",
                  self._values_file(values), *(["--wait", "--timeout", "4m"] if wait else []))
        self.image = image

    def uninstall(self) -> str:
        """``helm uninstall --wait``; its output."""
        return self.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "3m")

    def pods(self, selector: str) -> list[Any]:
        """The release's pods with this label selector (not being deleted), oldest first."""
        from kubernetes import client as k

        items = k.CoreV1Api(self.cluster.api_client()).list_namespaced_pod(NAMESPACE, label_selector=selector).items
        return sorted((p for p in items if not p.metadata.deletion_timestamp),
                      key=lambda p: p.metadata.creation_timestamp)

    def plugin_pod(self) -> Any:
        """The DaemonSet's one Ready pod on the node (waits for it)."""
        def ready() -> Any:
            pods = [p for p in self.pods(PLUGIN_SELECTOR) if _ready(p)]
            return pods[-1] if len(pods) == 1 else None

        return wait_for("the kubelet plugin's pod to be Ready (registered, slices published)", ready, 120)

    def report(self) -> str:
        """The release's pods and the tail of their logs: what to look at when a test fails."""
        parts = [self.cluster.kubectl("get", "pods", "-o", "wide", "--namespace", NAMESPACE)]
        for selector in (PLUGIN_SELECTOR, CONTROLLER_SELECTOR):
            try:
                parts.append(f"--- {selector} ---\n" + "\n".join(self.logs(selector).splitlines()[-40:]))
            except Exception as e:  # a pod not started yet has no log
                parts.append(f"{selector}: no logs ({e})")
        return "\n".join(parts)

    def logs(self, selector: str) -> str:
        """The logs of the release's pods with this selector, all containers, one after the other."""
        from kubernetes import client as k

        core = k.CoreV1Api(self.cluster.api_client())
        return "\n".join(str(core.read_namespaced_pod_log(p.metadata.name, NAMESPACE)) for p in self.pods(selector))


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def share_mount(path: str) -> None:
    """Make ``path`` a shared mount point of its own (a bind mount onto itself), as a GPU Operator's
    ``/run/nvidia/driver`` is on a systemd host (``/`` shared). The chart mounts a driver root other
    than ``/`` with ``mountPropagation: HostToContainer``, and containerd refuses that for a path on a
    private mount ("is not a shared or slave mount"), which this machine's ``/`` is. The cluster's
    teardown unmounts it with everything else under its directory."""
    if not os.path.ismount(path):
        run(["mount", "--bind", path, path], f"mount --bind {path}")
    run(["mount", "--make-shared", path], f"mount --make-shared {path}")


def install_release(cluster: Cluster, control_dir: str, driver_root: str = "/") -> ChartRelease:
    """Label the node as a GPU node, import the image, ``helm install`` the chart (``driverRoot``:
    ``driver_root``, made a shared mount when it is not ``/``); the release."""
    cluster.kubectl("label", "node", cluster.node_name, GPU_NODE_LABEL, "--overwrite")
    if driver_root.rstrip("/"):
        share_mount(driver_root)
    t0 = time.monotonic()
    image = import_image(cluster)
    release = ChartRelease(cluster, image, control_dir, driver_root)
    release.timings["image-import"] = round(time.monotonic() - t0, 2)
    os.makedirs(control_dir, exist_ok=True)
    release.install()
    return release


def host_pid_of(pod_uid: str, program: str = "gpuready") -> int:
    """The host PID of the pod's container process running ``program`` (found by its POD_UID in the
    environment the chart gives it): what a node admin's ``kill -9`` would name."""
    needle = f"POD_UID={pod_uid}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if needle in env and program.encode() in cmdline:
            return int(entry)
    raise AssertionError(f"no {program} process of pod {pod_uid} on this host")


# Made in every namespace by Kubernetes itself, not by gpuready.
_NOT_OURS = {"configmap/kube-root-ca.crt", "serviceaccount/default"}
_CLUSTER_KINDS = ("deviceclasses", "mutatingwebhookconfigurations", "validatingwebhookconfigurations",
                  "validatingadmissionpolicies", "validatingadmissionpolicybindings", "clusterroles",
                  "clusterrolebindings", "priorityclasses", "customresourcedefinitions")


def leftover_objects(cluster: Cluster, namespace: str, driver: str = "gpu.nvidia.com") -> list[str]:
    """What is left of a release, whatever its labels: every object in ``namespace`` but Events and
    what Kubernetes makes in any namespace, and every cluster object whose name says gpuready or the
    driver's domain (its DeviceClasses, webhooks, policies, roles)."""
    kinds = [r for r in cluster.kubectl("api-resources", "--verbs=list", "--namespaced", "-o", "name").split()
             if r not in ("events", "events.events.k8s.io")]
    left = []
    for name in cluster.kubectl("get", ",".join(kinds), "--namespace", namespace, "--ignore-not-found",
                                "-o", "name").split():
        kind, _, obj = name.partition("/")
        if f"{kind.split('.')[0]}/{obj}" not in _NOT_OURS:
            left.append(f"{namespace}: {name}")
    domain = driver.split(".", 1)[1]
    for kind in _CLUSTER_KINDS:
        left += [o for o in cluster.kubectl("get", kind, "-o", "name").split() if "gpuready" in o or domain in o]
    return left
