"""What the real-GPU end-to-end suite shares (kept out of conftest.py so tests import it by a name no
other conftest shadows). The suite: gpuready on a real NVIDIA GPU under a real kubelet (marker ``gpu_e2e``).

One cluster for the session, on the GPU machine itself (testbed/realcluster, host network: that
machine has no bridges, iptables or network tools; without a controller-manager when the bundle
carries none): etcd, kube-apiserver, kube-scheduler, containerd, runc and a kubelet, and gpuready's
kubelet plugin on the real NVML as a process that is PID 1 of its own PID namespace, as it is in the
DaemonSet's container. Pods run ``cuda-check`` images that hold no NVIDIA file: everything NVIDIA in
the container comes from the plugin's CDI spec.

Skipped where NVML does not initialise or not as root (CI has no GPU). On the GPU machine,
``testbed/realcluster/gpu-node.sh`` unpacks the carried binaries and runs this suite. Nothing here
changes the GPU's MIG mode, compute mode, clocks, power or persistence; the settings are read
before and after the session and must be the same.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from testbed.realcluster import Cluster, cuda_images  # noqa: E402
from testbed.realcluster.kubelet_metrics import Operation, grpc_operations  # noqa: E402
from testbed.realcluster.procs import Component  # noqa: E402

NODE = "gpu-node"
DRIVER = "gpu.nvidia.com"
SETTINGS_QUERY = ("name,uuid,driver_version,mig.mode.current,compute_mode,persistence_mode,power.limit,"
                  "clocks.applications.graphics,clocks.applications.memory")
# Where a run's figures go, one JSON object per line (gpu-node.sh points it into $OUT).
REPORT_ENV = "GPUREADY_GPU_E2E_REPORT"
# Carried, prebuilt cuda-check archives ("layout=path,layout=path"); built here with gcc when unset.
IMAGES_ENV = "GPUREADY_CUDA_CHECK_ARCHIVES"


def gpu_settings() -> str:
    """What must never change: nvidia-smi's reading of the settings gpuready must leave alone."""
    return subprocess.run(["nvidia-smi", f"--query-gpu={SETTINGS_QUERY}", "--format=csv,noheader"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()


def report(kind: str, **fields: Any) -> None:
    """Append one figure or finding to the run's report (and print it for the log)."""
    line = json.dumps({"kind": kind, **fields}, sort_keys=True)
    print(f"gpu-e2e-report {line}", file=sys.stderr)
    path = os.environ.get(REPORT_ENV, "")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


@dataclass
class GpuCluster:
    """The session's cluster, its plugin and the helpers tests need."""

    cluster: Cluster
    core: Any
    resource: Any
    plugin: Component
    images: dict[str, str]  # layout -> image name
    namespace: str = "default"
    timings: dict[str, float] = field(default_factory=dict)

    def kubelet_operations(self) -> dict[str, Operation]:
        """The kubelet's own histogram of its gRPC calls to the plugin."""
        return grpc_operations(self.cluster.https_get(self.cluster.kubelet_url("/metrics")).decode(), DRIVER)

    def slice_devices(self) -> dict[str, dict[str, Any]]:
        """Published devices of this node: name -> device."""
        slices = self.resource.list_resource_slice(field_selector=f"spec.nodeName={NODE}",
                                                   _preload_content=False)
        out: dict[str, dict[str, Any]] = {}
        for s in json.loads(slices.data)["items"]:
            if s["spec"].get("driver") == DRIVER:
                out.update({d["name"]: d for d in s["spec"].get("devices") or []})
        return out

    def create(self, manifest: str) -> None:
        """Create every object of a YAML manifest (claims and pods only: that is all the tests make)."""
        for doc in yaml.safe_load_all(manifest):
            if not doc:
                continue
            if doc["kind"] == "ResourceClaim":
                self.resource.create_namespaced_resource_claim(self.namespace, doc)
            elif doc["kind"] == "Pod":
                self.core.create_namespaced_pod(self.namespace, doc)
            else:
                raise ValueError(f"unexpected kind {doc['kind']}")

    def pod_json(self, name: str) -> dict[str, Any]:
        """The pod as the API has it, as plain JSON."""
        answer = self.core.read_namespaced_pod(name, self.namespace, _preload_content=False)
        pod: dict[str, Any] = json.loads(answer.data)
        return pod

    def wait_phase(self, name: str, phases: tuple[str, ...], timeout: float = 180.0) -> dict[str, Any]:
        """Wait until the pod is in one of ``phases``; fail with its state and Events otherwise."""
        deadline = time.monotonic() + timeout
        pod: dict[str, Any] = {}
        while time.monotonic() < deadline:
            pod = self.pod_json(name)
            if pod["status"].get("phase") in phases:
                return pod
            if pod["status"].get("phase") in ("Succeeded", "Failed") or _stuck(pod):
                break
            time.sleep(0.2)
        raise AssertionError(f"pod {name} is {pod.get('status', {}).get('phase')}, not {'/'.join(phases)}: "
                             f"{json.dumps(pod.get('status'), indent=1)}\nEvents: {self.events(name)}\n"
                             f"log: {self.logs(name)}")

    def events(self, name: str) -> list[str]:
        """The Events about an object, as 'reason: message'."""
        items = self.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={name}").items
        return [f"{e.reason}: {e.message}" for e in items]

    def logs(self, name: str) -> str:
        """The pod's container log ("" when there is none yet)."""
        try:
            return str(self.core.read_namespaced_pod_log(name, self.namespace))
        except Exception as exc:
            return f"(no log: {exc})"

    def result(self, name: str) -> dict[str, Any]:
        """cuda-check's JSON line from the pod's log."""
        for line in self.logs(name).splitlines():
            if line.startswith("{"):
                answer: dict[str, Any] = json.loads(line)
                return answer
        raise AssertionError(f"pod {name} printed no JSON result: {self.logs(name)!r}")

    def delete_pod(self, name: str, timeout: float = 90.0) -> None:
        """Delete a pod and wait until it is gone: the kubelet confirms the end of a graceful deletion
        after it has unprepared the pod's claims."""
        self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.core.read_namespaced_pod(name, self.namespace)
            except Exception:
                return
            time.sleep(0.2)
        raise AssertionError(f"pod {name} still exists after {timeout:.0f}s")

    def clean(self) -> None:
        """Delete every pod and claim a test left (a failed one too), so the next test has the GPU."""
        for pod in self.core.list_namespaced_pod(self.namespace).items:
            self.delete_pod(pod.metadata.name)
        for claim in self.resource.list_namespaced_resource_claim(self.namespace).items:
            self.delete_claim(claim.metadata.name)

    def delete_claim(self, name: str, timeout: float = 60.0) -> None:
        """Delete a claim whose pods are gone, and wait until it is.

        Without a controller-manager (the GPU machine's bundle carries none) nothing else would do its
        resourceclaim controller's part: drop the gone pods from ``reservedFor``, deallocate, and lift
        the scheduler's delete-protection finalizer. Done here, as that controller does it, so the
        next test can have the GPU."""
        if not self.cluster.config.controller_manager:
            answer = self.resource.read_namespaced_resource_claim(name, self.namespace, _preload_content=False)
            claim = json.loads(answer.data)
            claim["status"] = {}
            answer = self.resource.replace_namespaced_resource_claim_status(name, self.namespace, claim,
                                                                           _preload_content=False)
            claim = json.loads(answer.data)
            claim["metadata"]["finalizers"] = []
            self.resource.replace_namespaced_resource_claim(name, self.namespace, claim)
        self.resource.delete_namespaced_resource_claim(name, self.namespace)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.resource.read_namespaced_resource_claim(name, self.namespace)
            except Exception:
                return
            time.sleep(0.2)
        raise AssertionError(f"claim {name} still exists after {timeout:.0f}s")


# A pod that will not get further without a change: say so at once, with the reason, instead of timing out.
_STUCK_REASONS = ("CreateContainerError", "CreateContainerConfigError", "RunContainerError", "ErrImageNeverPull",
                  "InvalidImageName")


def _stuck(pod: dict[str, Any]) -> bool:
    waiting = [s.get("state", {}).get("waiting", {}).get("reason", "")
               for s in pod["status"].get("containerStatuses") or []]
    return any(r in _STUCK_REASONS for r in waiting)


def archives(cache: str) -> dict[str, str]:
    given = os.environ.get(IMAGES_ENV, "")
    if given:
        return dict(pair.split("=", 1) for pair in given.split(",") if pair)
    return {layout: cuda_images.cuda_check_archive(cache, layout) for layout in cuda_images.CUDA_CHECK_IMAGES}


def apply_device_classes(resource: Any) -> None:
    for name in sorted(os.listdir(os.path.join(REPO, "deploy", "deviceclasses"))):
        with open(os.path.join(REPO, "deploy", "deviceclasses", name)) as f:
            for doc in yaml.safe_load_all(f):
                if doc and doc.get("kind") == "DeviceClass":
                    resource.create_device_class(doc)


def start_plugin(cluster: Cluster) -> Component:
    """gpuready's kubelet plugin on the real NVML, as PID 1 of a PID namespace of its own (with its own
    /proc), as in the DaemonSet's container: processes it daemonizes (MPS) become its children."""
    root = cluster.kubelet_root
    argv = [shutil.which("unshare") or "/usr/bin/unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "--",
            sys.executable, "-m", "dra_driver", "kubelet-plugin", "--node-name", NODE, "--nvml", "real",
            "--kubeconfig", cluster.kubeconfig, "--registrar-dir", os.path.join(root, "plugins_registry"),
            "--plugin-dir", os.path.join(root, "plugins", DRIVER), "--cdi-root", cluster.cdi_dir,
            "--metrics-port", "0", "--pod-resources-socket", os.path.join(root, "pod-resources", "kubelet.sock"),
            "--shared-gpus", "all"]
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NODE_NAME", "NVML")}
    plugin = Component("gpuready-kubelet-plugin", argv, cluster.log_path("gpuready-kubelet-plugin"), env=env,
                       cwd=REPO).start()
    cluster.components[plugin.name] = plugin
    return plugin
