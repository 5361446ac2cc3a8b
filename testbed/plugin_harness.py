"""A harness that runs real plugins against the local API server and the kubelet emulator.

For tests, benchmarks and the demo: everything is real (HTTP to the local API server through the
``kubernetes`` client, gRPC over Unix sockets, files on disk); only NVML is simulated.

    with PluginHarness() as h:
        plugin = h.start_plugin("node-a", "sim:8xh100")
        uid = h.create_claim("c1", [("gpu", "node-a", "gpu-0")])
        result = h.kubelet("node-a").prepare([("default", "c1", uid)])
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import kubernetes

from kubelet_plugin.config import PluginConfig

NAMESPACE = "default"


@dataclass
class NodeDirs:
    """The per-node directories a plugin uses (short paths: Unix socket limits)."""

    root: str
    registry: str
    plugin: str
    cdi: str

    @staticmethod
    def make(root: str) -> NodeDirs:
        """Create the directories under ``root``."""
        dirs = NodeDirs(root, os.path.join(root, "reg"), os.path.join(root, "plug"), os.path.join(root, "cdi"))
        for d in (dirs.registry, dirs.plugin, dirs.cdi):
            os.makedirs(d, exist_ok=True)
        return dirs


@dataclass
class PluginHarness:
    """Local API server + one kubelet emulator and one plugin per simulated node."""

    driver_name: str = "gpu.nvidia.com"
    server: Any = None
    plugins: dict[str, Any] = field(default_factory=dict)
    emulators: dict[str, Any] = field(default_factory=dict)
    dirs: dict[str, NodeDirs] = field(default_factory=dict)
    root: str = ""
    # API server feature gates, e.g. {"DRADeviceTaints": False}: a cluster that drops those fields.
    feature_gates: dict[str, bool] | None = None

    def __enter__(self) -> PluginHarness:
        from testbed.apiserver import LocalApiServer

        self.root = tempfile.mkdtemp(prefix="gr-", dir="/tmp")
        self.server = LocalApiServer(feature_gates=self.feature_gates).start()
        self.api_client = self.server.api_client()
        self.core = kubernetes.client.CoreV1Api(self.api_client)
        self.resource = kubernetes.client.ResourceV1Api(self.api_client)
        try:
            self.core.create_namespace({"metadata": {"name": NAMESPACE}})
        except kubernetes.client.ApiException as exc:
            if exc.status != 409:
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop everything and delete the temporary directories."""
        for plugin in self.plugins.values():
            plugin.stop()
        for emu in self.emulators.values():
            emu.stop()
        if self.server is not None:
            self.server.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    # --- nodes ------------------------------------------------------------------------------------
    def node_dirs(self, node: str) -> NodeDirs:
        """The directories of a node (created on first use)."""
        if node not in self.dirs:
            self.dirs[node] = NodeDirs.make(os.path.join(self.root, node))
            try:
                self.core.create_node({"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}})
            except kubernetes.client.ApiException as exc:
                if exc.status != 409:
                    raise
        return self.dirs[node]

    def config(self, node: str, **overrides: Any) -> PluginConfig:
        """A PluginConfig for ``node`` pointing at its directories."""
        d = self.node_dirs(node)
        # NVML is always simulated here: say so (a real-NVML config would check this machine's /dev).
        base = PluginConfig(node_name=node, driver_name=self.driver_name, registrar_dir=d.registry,
                            plugin_dir=d.plugin, cdi_root=d.cdi, health_mode="off", registration_retry=0.2,
                            boot_id="test-boot", nvml="sim:8xh100",
                            pod_resources_socket=self.pod_resources_socket(node))
        return replace(base, **overrides)

    def kubelet(self, node: str, timeout: float = 20.0, previous: Any = None) -> Any:
        """The emulated kubelet's handle on ``node``'s registered plugin.

        ``previous``: a handle from before the plugin restarted; waits until the emulator has let it go
        (same socket names: the restarted plugin replaces the files) and returns the new registration.
        """
        emu = self.kubelet_emulator(node)
        if previous is not None:
            emu.wait_for_deregistration(previous, timeout=timeout)
        return emu.wait_for_plugin(self.driver_name, timeout=timeout)

    def kubelet_emulator(self, node: str) -> Any:
        """``node``'s emulated kubelet (started on first use)."""
        from testbed.kubelet_emulator import KubeletEmulator

        if node not in self.emulators:
            self.emulators[node] = KubeletEmulator(self.node_dirs(node).registry, retry_initial=0.2,
                                                   pod_resources_socket=self.pod_resources_socket(node)).start()
        return self.emulators[node]

    def pod_resources_socket(self, node: str) -> str:
        """Where ``node``'s emulated kubelet serves the PodResources API (its plugin's default)."""
        return os.path.join(self.node_dirs(node).root, "podres.sock")

    def set_pod(self, node: str, name: str, containers: dict[str, list[str]], namespace: str = NAMESPACE) -> None:
        """Run pod ``name`` on ``node`` as its kubelet's PodResources API reports it: container -> claim names."""
        self.kubelet(node)  # the emulator, and its PodResources socket, exist from here on
        self.emulators[node].set_pod(namespace, name, containers)

    def start_plugin(self, node: str, nvml: Any = "sim:8xh100", kubelet: bool = True, **overrides: Any) -> Any:
        """Start an in-process plugin for ``node`` (``nvml``: a spec string or an NVML object); ``kubelet``:
        start the node's emulated kubelet first (False: it comes later, through :meth:`kubelet`)."""
        from kubelet_plugin.daemon import KubeletPlugin
        from kubelet_plugin.nvml import open_nvml

        handle = open_nvml(f"{nvml}@{node}") if isinstance(nvml, str) else nvml
        # The config says which NVML runs: the real one checks the machine's /dev (device nodes).
        real = getattr(handle, "__name__", "") == "pynvml"
        overrides.setdefault("nvml", "real" if real else nvml if isinstance(nvml, str) else "sim:8xh100")
        plugin = KubeletPlugin(self.config(node, **overrides), self.api_client, handle)
        # As on a real node, a kubelet is there to register the plugin (its slices wait for that).
        if kubelet:
            self.kubelet_emulator(node)
        plugin.start()
        self.plugins[node] = plugin
        return plugin

    def stop_plugin(self, node: str) -> None:
        """Stop a node's plugin (sockets removed)."""
        self.plugins.pop(node).stop()

    # --- claims -----------------------------------------------------------------------------------
    def create_claim(self, name: str, results: Sequence[tuple[str, str, str]],
                     config: Sequence[dict[str, Any]] = (), namespace: str = NAMESPACE,
                     extra_results: Sequence[dict[str, Any]] = ()) -> str:
        """Create an allocated claim; ``results`` are (request, pool, device). Returns its UID."""
        # Every result's request must name a request (or request/subrequest) of the claim: the API
        # server checks it. "<request>/<sub>" results get a firstAvailable request listing the subs.
        subs: dict[str, set[str]] = {}
        for request in [r[0] for r in results] + [str(r.get("request", "")) for r in extra_results]:
            if request:
                top, _, sub = request.partition("/")
                subs.setdefault(top, set()).update({sub} - {""})
        subs = subs or {"gpu": set()}
        body = {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [
                {"name": r, "firstAvailable": [{"name": sub, "deviceClassName": "gpu.nvidia.com"}
                                               for sub in sorted(subs[r])]}
                if subs[r] else {"name": r, "exactly": {"deviceClassName": "gpu.nvidia.com"}}
                for r in sorted(subs)]}},
        }
        created = self.resource.create_namespaced_resource_claim(namespace, body, _preload_content=False)
        claim = json.loads(created.data)
        claim["status"] = {"allocation": {"devices": {
            "results": [{"request": req, "driver": self.driver_name, "pool": pool, "device": dev}
                        for req, pool, dev in results] + list(extra_results),
            "config": list(config)}}}
        self.resource.replace_namespaced_resource_claim_status(name, namespace, claim, _preload_content=False)
        uid: str = claim["metadata"]["uid"]
        return uid

    def get_claim(self, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
        """A claim as JSON."""
        resp = self.resource.read_namespaced_resource_claim(name, namespace, _preload_content=False)
        result: dict[str, Any] = json.loads(resp.data)
        return result

    def delete_claim(self, name: str, namespace: str = NAMESPACE) -> None:
        """Delete a claim."""
        self.resource.delete_namespaced_resource_claim(name, namespace, _preload_content=False)

    def published_devices(self, node: str, timeout: float = 20.0) -> dict[str, dict[str, Any]]:
        """device name -> device JSON of the node's pool, as a scheduler reads it: only the newest
        pool generation, and only once all of its slices exist (a pool of several slices is written
        one slice at a time, so a plain list can catch it half-written)."""
        import time

        from dra_driver.slices import complete_pool_devices

        deadline = time.monotonic() + timeout
        while True:
            resp = self.resource.list_resource_slice(field_selector=f"spec.nodeName={node}",
                                                     _preload_content=False)
            devices = complete_pool_devices(json.loads(resp.data)["items"])
            if devices is not None:
                return devices
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {node}'s pool was not complete within {timeout}s")
            time.sleep(0.02)

    def wait_published(self, node: str, expected: set[str], timeout: float = 30.0) -> dict[str, dict[str, Any]]:
        """The node's complete pool once it includes every device in ``expected``. Validation finishing
        does not mean the publisher has written its result yet: wait for what a scheduler would see."""
        import time

        deadline = time.monotonic() + timeout
        while not expected <= set(devices := self.published_devices(node, timeout)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {node} never published {sorted(expected - set(devices))}")
            time.sleep(0.05)
        return devices

    def published_taints(self, node: str) -> dict[str, list[str]]:
        """device name -> the keys of its taints, as the node's complete pool publishes them."""
        return {name: [t["key"] for t in d.get("taints") or []] for name, d in self.published_devices(node).items()}

    def cdi_files(self, node: str) -> list[str]:
        """Spec files in a node's CDI directory (names only, sorted)."""
        return sorted(f for f in os.listdir(self.node_dirs(node).cdi) if f.endswith(".json"))

    def read_spec(self, node: str, claim_uid: str) -> dict[str, Any]:
        """The CDI spec of a claim on a node."""
        from kubelet_plugin.cdi.cdi_spec import spec_file_name

        with open(os.path.join(self.node_dirs(node).cdi, spec_file_name(self.driver_name, claim_uid))) as f:
            result: dict[str, Any] = json.load(f)
            return result


def opaque(parameters: dict[str, Any], requests: Sequence[str] = (), source: str = "FromClaim",
           driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    """An allocation config entry."""
    return {"source": source, "requests": list(requests), "opaque": {"driver": driver, "parameters": parameters}}
