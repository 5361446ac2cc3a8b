"""What the e2e tests share besides fixtures: the cluster handle with its helpers, and waiting.

Kept out of conftest.py so tests can import it by a name no other conftest shadows.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:  # testbed/ is not an installed package; the suite runs from a checkout
    sys.path.insert(0, REPO)

from testbed.nvml_sim.sim_control import CONTROL_DIR_ENV, send_fault  # noqa: E402
from testbed.realcluster import Cluster, ComponentError  # noqa: E402
from testbed.realcluster.kubelet_metrics import Operation, grpc_operations  # noqa: E402
from testbed.realcluster.procs import Component  # noqa: E402
from testbed.realcluster.sim_device_nodes import sim_device_nodes as device_nodes_of  # noqa: E402

if TYPE_CHECKING:
    from e2e_chart import ChartRelease

NODE = "node-a"
# Six whole H100s with MIG off plus two MIG-partitioned ones: whole GPUs are published in the default
# static MIG mode. (4xh200 has MIG on everywhere with no instances, so static mode publishes nothing.)
PROFILE = "8xh100"
DRIVER = "gpu.nvidia.com"
# The session's plugin: a faulted GPU comes back 2 s after its cause clears, after one validation
# (production: 60 s and three), so the fault tests see withdrawal and recovery in one run.
SESSION_PLUGIN_ARGS = ("--hold-down", "2", "--recovery-passes", "1")
# chart: gpuready installed by its Helm chart and image; process: as processes from this checkout.
MODE = os.environ.get("GPUREADY_E2E_MODE", "chart")
if MODE not in ("chart", "process"):
    raise SystemExit(f"GPUREADY_E2E_MODE={MODE!r}: want chart or process")


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0, interval: float = 0.2) -> Any:
    """Call ``check`` until it returns something truthy and return that; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as e:  # the API may say 404 until the object exists
            last_error = e
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}"
                                 + (f" (last error: {last_error})" if last_error else ""))
        time.sleep(interval)


@dataclass
class E2E:
    """The running cluster and plugin, with the helpers tests need."""

    cluster: Cluster
    api: Any  # kubernetes.client.ApiClient (admin)
    core: Any  # CoreV1Api
    resource: Any  # ResourceV1Api
    node: str = NODE
    control_dir: str = ""  # the node's simulated NVML takes faults from files here (sim_control.py)
    plugin: Component | None = None  # process mode: the node's plugin process
    release: ChartRelease | None = None  # chart mode: the Helm release
    # The node's (fake) NVIDIA driver installation (testbed/realcluster/fake_driver.py): the chart's
    # driverRoot, the plugin's --driver-root. Its libcuda and nvidia-smi reach containers through CDI.
    driver_root: str = ""

    def release_report(self) -> str:
        """Chart mode: the gpuready pods' state and the tail of their logs (for a failed test)."""
        if self.release is None:
            return "(process mode: the plugin's and controller's logs are among the cluster logs)"
        return self.release.report()

    @property
    def kubeconfig(self) -> str:
        """The admin kubeconfig."""
        return self.cluster.kubeconfig

    @property
    def cdi_dir(self) -> str:
        """Where the plugin writes CDI specs and containerd reads them."""
        return self.cluster.cdi_dir

    def apply(self, manifest: str, namespace: str | None = None) -> str:
        """``kubectl apply`` a YAML document (or several); return kubectl's output."""
        args = ["apply", "-f", "-"] + (["--namespace", namespace] if namespace else [])
        return self.cluster.kubectl(*args, input_text=manifest)

    def inject(self, fault: str, **args: Any) -> None:
        """Apply a fault to the kubelet node's simulated NVML, in the running plugin process (see
        testbed/nvml_sim/sim_control.py; ``fault`` names a SimFaults method, e.g. ``inject_xid``)."""
        send_fault(self.control_dir, fault, **args)

    def replace_plugin(self, new: Component, control_dir: str) -> Component:
        """Make ``new`` (taking faults from ``control_dir``) the node's plugin that later tests use,
        after a restart or a rolling update; return the old one."""
        old, self.plugin, self.control_dir = self.plugin, new, control_dir
        return old

    def start_node_plugin(self, name: str, extra_args: Sequence[str] = (), launcher: Sequence[str] = (),
                          env: dict[str, str] | None = None) -> tuple[Component, str]:
        """Another plugin instance for the kubelet's node with the session's settings and a fault
        directory of its own (two instances never read one): (the process, its fault directory).
        ``env``: more environment variables (``GPUREADY_BOOT_ID`` after a simulated reboot)."""
        control_dir = os.path.join(self.cluster.dir, "sim-control", name)
        plugin = start_plugin(self.cluster, name=name, extra_args=(*SESSION_PLUGIN_ARGS, *extra_args),
                              control_dir=control_dir, launcher=launcher, driver_root=self.driver_root, env=env)
        return plugin, control_dir

    def wait_plugin_registered(self, plugin: Component, timeout: float = 60.0) -> None:
        """Wait until the kubelet confirmed ``plugin``'s registration (its NotifyRegistrationStatus)."""
        plugin.wait_ready(lambda: log_has(plugin.log_path, "event=plugin_registered"), timeout,
                          "registered with the kubelet (its NotifyRegistrationStatus said registered)")

    def events_for(self, namespace: str, name: str) -> list[tuple[str, str]]:
        """(reason, message) of the Events about the object ``name`` in ``namespace``."""
        events = self.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
        return [(e.reason or "", e.message or "") for e in events.items]

    def pod(self, namespace: str, name: str) -> Any:
        """The Pod object as the API has it now."""
        return self.core.read_namespaced_pod(name, namespace)

    def wait_pod_phase(self, namespace: str, name: str, phase: str | tuple[str, ...], timeout: float = 60.0) -> Any:
        """Wait until the pod is in ``phase`` (one of several); fail early when it ends otherwise."""
        phases = (phase,) if isinstance(phase, str) else phase

        def check() -> Any:
            pod = self.pod(namespace, name)
            if pod.status.phase in phases:
                return pod
            if pod.status.phase in ("Succeeded", "Failed"):
                raise AssertionError(f"pod {namespace}/{name} ended {pod.status.phase}, wanted {phases}: "
                                     f"{self.describe_pod(namespace, name)}")
            return None

        try:
            return wait_for(f"pod {namespace}/{name} to be {'/'.join(phases)}", check, timeout)
        except AssertionError as e:
            if "ended" in str(e):
                raise
            raise AssertionError(f"{e}\n{self.describe_pod(namespace, name)}") from None

    def describe_pod(self, namespace: str, name: str) -> str:
        """``kubectl describe pod`` (status, conditions and events): what a user looks at first."""
        try:
            return self.cluster.kubectl("describe", "pod", "--namespace", namespace, name)
        except ComponentError as e:
            return str(e)

    def pod_logs(self, namespace: str, name: str, container: str | None = None) -> str:
        """The container's log through the API server (which asks the kubelet), like ``kubectl logs``."""
        kwargs = {"container": container} if container else {}
        return str(self.core.read_namespaced_pod_log(name, namespace, **kwargs))

    def delete_pod(self, namespace: str, name: str, timeout: float = 60.0) -> None:
        """Delete the pod and wait until the API no longer has it (the kubelet finished with it)."""
        from kubernetes.client import ApiException

        self.core.delete_namespaced_pod(name, namespace)

        def gone() -> bool:
            try:
                self.pod(namespace, name)
            except ApiException as e:
                return e.status == 404
            return False

        wait_for(f"pod {namespace}/{name} to be deleted", gone, timeout)

    def cdi_spec_files(self) -> list[str]:
        """The CDI spec files on the node now."""
        return sorted(glob.glob(os.path.join(self.cdi_dir, "*.json")) + glob.glob(os.path.join(self.cdi_dir, "*.yaml")))

    def slice_devices(self, node: str | None = None) -> dict[str, dict[str, Any]]:
        """A node's (default: the kubelet's) published devices of our driver, by name, as plain dicts."""
        slices = self.resource.list_resource_slice(
            field_selector=f"spec.nodeName={node or self.node},spec.driver={DRIVER}")
        return {d.name: self.api.sanitize_for_serialization(d) for s in slices.items for d in (s.spec.devices or [])}

    def whole_pool(self, node: str) -> dict[str, dict[str, Any]]:
        """A node's published devices once every slice of its pool's newest generation is there
        (``resourceSliceCount`` of them); {} while the pool is still arriving."""
        slices = self.resource.list_resource_slice(field_selector=f"spec.nodeName={node},spec.driver={DRIVER}").items
        if not slices:
            return {}
        newest = max(s.spec.pool.generation for s in slices)
        current = [s for s in slices if s.spec.pool.generation == newest]
        if len(current) != current[0].spec.pool.resource_slice_count:
            return {}
        return {d.name: self.api.sanitize_for_serialization(d) for s in current for d in (s.spec.devices or [])}

    def kubelet_grpc_operations(self) -> dict[str, Operation]:
        """The kubelet's ``dra_grpc_operations_duration_seconds`` for our driver, per method (OK calls)."""
        text = self.cluster.https_get(self.cluster.kubelet_url("/metrics")).decode()
        return grpc_operations(text, DRIVER)


def sim_device_nodes(profile: str) -> list[tuple[str, int, int]]:
    """The host device nodes the kubelet node's CDI specs name (:mod:`testbed.realcluster.sim_device_nodes`)."""
    return device_nodes_of(f"sim:{profile}@{NODE}")


def start_plugin(cluster: Cluster, node: str = NODE, profile: str = PROFILE, *, name: str = "",
                 extra_args: Sequence[str] = (), control_dir: str = "", launcher: Sequence[str] = (),
                 driver_root: str = "", env: dict[str, str] | None = None) -> Component:
    """Run ``python -m dra_driver kubelet-plugin`` for ``node`` as a real process; return it.

    For the kubelet's node its sockets go where that kubelet looks (``<root>/plugins_registry``,
    ``<root>/plugins/<driver>``). For a fake node (no kubelet) they go to a directory of its own,
    where the testbed's kubelet emulator registers the plugin (``Cluster.fake_node_root``), so it
    publishes that node's slices as on a real node; nothing prepares there.

    ``name``: the component (and log file) name, for a second instance on one node (a rolling
    update). ``extra_args``: more plugin flags. ``control_dir``: the simulated NVML takes faults
    from files there (``GPUREADY_SIM_CONTROL_DIR``, see testbed/nvml_sim/sim_control.py).
    ``launcher``: what runs instead of ``-m dra_driver`` (``-m testbed.crash_points ... --``).
    ``driver_root``: the plugin's ``--driver-root`` (the session's fake driver install, whose files its
    CDI specs mount into containers); default: the plugin's own (``/``). ``env``: more environment
    variables for the process.
    """
    root = cluster.kubelet_root if node == cluster.node_name else cluster.fake_node_root(node)
    name = name or "gpuready-kubelet-plugin" + ("" if node == cluster.node_name else f"-{node}")
    argv = [sys.executable, *(launcher or ("-m", "dra_driver")), "kubelet-plugin", "--node-name", node,
            "--nvml", f"sim:{profile}@{node}", "--kubeconfig", cluster.kubeconfig,
            "--registrar-dir", os.path.join(root, "plugins_registry"),
            "--plugin-dir", os.path.join(root, "plugins", DRIVER),
            "--cdi-root", cluster.cdi_dir if node == cluster.node_name else os.path.join(root, "cdi"),
            "--metrics-port", "0",
            # The plugin's default assumes /var/lib/kubelet; this kubelet's root dir is elsewhere.
            "--pod-resources-socket",
            os.path.join(root, "pod-resources", "kubelet.sock") if node == cluster.node_name else "",
            *(("--driver-root", driver_root) if driver_root else ()),
            *extra_args]
    process_env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NODE_NAME", "NVML", CONTROL_DIR_ENV)}
    process_env.update(env or {})
    if control_dir:
        process_env[CONTROL_DIR_ENV] = control_dir
    plugin = Component(name, argv, cluster.log_path(name), env=process_env, cwd=REPO).start()
    cluster.components[plugin.name] = plugin  # stopped with the cluster, its log in the failure report
    return plugin


def log_has(path: str, text: str) -> bool:
    """Whether the log file at ``path`` contains ``text`` yet."""
    with open(path, errors="replace") as f:
        return text in f.read()


KEEP_RUNNING = "trap 'exit 0' TERM; while true; do sleep 1; done"


def one_gpu_pod_manifest(pod: str, template: str = "", report: str = "", spec_extra: str = "",
                         restart_policy: str = "Never") -> str:
    """A ResourceClaimTemplate asking for one ``gpu.nvidia.com`` device and a busybox pod using it.

    ``template`` defaults to the pod's name; ``report`` is shell run before the pod idles (its
    output is what the test reads from the log); ``spec_extra`` is YAML lines added to the pod's
    spec (indented two spaces, e.g. scheduling gates); ``restart_policy`` ``Always`` for a pod that
    should come back after a node reboot, as a Deployment's do. The pod exits at once on SIGTERM, so deletion
    does not wait out the grace period.
    """
    template = template or pod
    command = f"{report}; {KEEP_RUNNING}" if report else KEEP_RUNNING
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: {template}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
---
apiVersion: v1
kind: Pod
metadata:
  name: {pod}
spec:{spec_extra}
  restartPolicy: {restart_policy}
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: registry.local/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", {json.dumps(command)}]
    resources:
      claims:
      - name: gpu
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: {template}
"""
