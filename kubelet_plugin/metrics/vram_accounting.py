"""VRAM accounting per claim: which pod's processes use how much GPU memory, against what they asked for.

NVML lists the processes on each GPU (or MIG device) with the memory each holds. Each PID is mapped to
its pod and container through ``/proc/<pid>/cgroup`` (:mod:`kubelet_plugin.metrics.cgroup_paths`), and each pod
to the claims prepared on this node for that device. The result is exported per claim
(``gpuready_claim_vram_used_bytes``, ``..._requested_bytes``) and, when a claim on a shared GPU
(consumable capacity) uses more memory than it requested, a Warning Event on the pod names the process,
its VRAM and the request, once per crossing (deduplicated until usage falls back under the request).

Nothing enforces the request: NVIDIA GPUs have no per-process memory limit outside MIG and MPS. The
Event and metric make the overuse visible to the pod's owner before the GPU's other tenants hit OOM.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dra_driver.devices import GIB, MigMode, NodeDevices
from dra_driver.logs import get_logger
from dra_driver.quantity import parse_quantity
from kubelet_plugin.metrics.cgroup_paths import CgroupIdentity, read_process_identity
from kubelet_plugin.metrics.gpu_collector import DeviceAllocation
from kubelet_plugin.metrics.plugin_metrics import (
    CLAIM_VRAM_REQUESTED,
    CLAIM_VRAM_USED,
    UNATTRIBUTED_VRAM_USED,
)
from kubelet_plugin.metrics.pod_resources_client import ContainerMap, containers_of_pod, single_pod_users
from kubelet_plugin.periodic import Periodic

log = get_logger(__name__)

EVENT_REASON = "VRAMOverRequest"


@dataclass(frozen=True)
class PodRef:
    """A pod a claim is reserved for."""

    name: str
    namespace: str
    uid: str


@dataclass(frozen=True)
class PreparedClaim:
    """What the plugin prepared for a claim on this node: its devices, pods and memory requests."""

    claim_uid: str
    claim_name: str
    claim_namespace: str
    devices: tuple[str, ...]
    pods: tuple[PodRef, ...] = ()
    # device -> bytes requested through consumable capacity (shared GPUs only)
    requested_memory: tuple[tuple[str, int], ...] = ()

    def requested_for(self, device: str) -> int | None:
        """Bytes of memory the claim requested on ``device``, or None (a whole device)."""
        return next((n for d, n in self.requested_memory if d == device), None)


def _quantity_bytes(value: Any) -> int:
    # A consumed capacity the scheduler wrote: a whole number of bytes (rounded up if it is not).
    number = parse_quantity(value)
    return -((-number.numerator) // number.denominator)


def prepared_claim_from_api(claim: Mapping[str, Any], driver: str, pool: str) -> PreparedClaim:
    """Build a :class:`PreparedClaim` from a ResourceClaim as the API server returns it (a dict).

    Devices are the allocation results of ``driver`` in ``pool`` (this node); requests come from
    ``consumedCapacity.memory``; pods from ``status.reservedFor``.
    """
    meta = claim.get("metadata") or {}
    status = claim.get("status") or {}
    results = (((status.get("allocation") or {}).get("devices") or {}).get("results")) or []
    devices: list[str] = []
    requested: list[tuple[str, int]] = []
    for r in results:
        if r.get("driver") != driver or r.get("pool") != pool:
            continue
        devices.append(r["device"])
        consumed = r.get("consumedCapacity") or {}
        memory = consumed.get("memory", consumed.get(f"{driver}/memory"))
        # 0 is what a claim that named no memory consumes on a GPU shared by shares or unlimited (the
        # policy's default): it asked for none, so no VRAM it uses is "more than it requested".
        if memory is not None and (nbytes := _quantity_bytes(memory)) > 0:
            requested.append((r["device"], nbytes))
    pods = tuple(PodRef(ref.get("name", ""), meta.get("namespace", ""), ref.get("uid", ""))
                 for ref in status.get("reservedFor") or [] if ref.get("resource") == "pods")
    return PreparedClaim(claim_uid=meta.get("uid", ""), claim_name=meta.get("name", ""),
                         claim_namespace=meta.get("namespace", ""), devices=tuple(devices), pods=pods,
                         requested_memory=tuple(requested))


def allocations_from_claims(claims: Sequence[PreparedClaim],
                            containers: ContainerMap | None = None) -> dict[str, list[DeviceAllocation]]:
    """device name -> allocations with pod and container names, for :class:`~kubelet_plugin.metrics.GpuCollector` labels.

    ``containers``: the kubelet's PodResources answer (:func:`~kubelet_plugin.metrics.pod_resources_client.claim_device_containers`),
    the only source of container names; None (not available) leaves them out. When the claim's
    ``reservedFor`` could not be read, PodResources also names the pod if exactly one uses the device.
    """
    out: dict[str, list[DeviceAllocation]] = {}
    for c in claims:
        pod = c.pods[0] if len(c.pods) == 1 else None
        for device in c.devices:
            name, namespace, uid = (pod.name, pod.namespace, pod.uid) if pod else ("", "", "")
            names: tuple[str, ...] = ()
            key = (c.claim_namespace, c.claim_name, device)
            if containers is not None and pod is not None:
                names = containers_of_pod(containers, key, pod.namespace, pod.name)
            elif containers is not None and not c.pods:
                namespace, name, names = single_pod_users(containers, key) or ("", "", ())
            out.setdefault(device, []).append(DeviceAllocation(
                device, c.claim_uid, c.claim_name, c.claim_namespace, pod=name, pod_namespace=namespace,
                pod_uid=uid, containers=names))
    return out


@dataclass(frozen=True)
class ProcessVram:
    """One process's memory on one device, with the pod and container it runs in where known."""

    device: str
    pid: int
    used_bytes: int
    pod_uid: str = ""
    container_id: str = ""
    container: str = ""  # container name, when the pod's status could be read


@dataclass(frozen=True)
class ClaimVram:
    """A claim's memory use on one of its devices (all its pods' processes together)."""

    claim: PreparedClaim
    device: str
    used_bytes: int
    requested_bytes: int | None
    processes: tuple[ProcessVram, ...]

    @property
    def over_request(self) -> bool:
        """Whether the claim uses more than it requested (only claims with a request can be over)."""
        return self.requested_bytes is not None and self.used_bytes > self.requested_bytes

    def pod_of(self, process: ProcessVram) -> PodRef | None:
        """The claim's pod that runs ``process``."""
        return next((p for p in self.claim.pods if p.uid == process.pod_uid), None)


@dataclass(frozen=True)
class VramReport:
    """Per-claim usage plus the processes no claim on their device accounts for."""

    claims: tuple[ClaimVram, ...]
    unattributed: tuple[ProcessVram, ...] = field(default_factory=tuple)


def attribute_vram(processes: Mapping[str, Sequence[ProcessVram]], claims: Sequence[PreparedClaim]) -> VramReport:
    """Assign each device's processes to the claims prepared on that device (pure).

    A process belongs to a claim when its pod is one the claim is reserved for. If one pod holds two
    claims on the same device its processes cannot be split; they go to the claim with the smaller UID.
    """
    out: list[ClaimVram] = []
    taken: set[tuple[str, int]] = set()
    for claim in sorted(claims, key=lambda c: c.claim_uid):
        pod_uids = {p.uid for p in claim.pods}
        for device in claim.devices:
            mine = tuple(p for p in processes.get(device, ()) if p.pod_uid and p.pod_uid in pod_uids
                         and (device, p.pid) not in taken)
            taken.update((device, p.pid) for p in mine)
            out.append(ClaimVram(claim=claim, device=device, used_bytes=sum(p.used_bytes for p in mine),
                                 requested_bytes=claim.requested_for(device), processes=mine))
    unattributed = tuple(p for device, procs in sorted(processes.items()) for p in procs
                         if (device, p.pid) not in taken)
    return VramReport(claims=tuple(out), unattributed=unattributed)


def over_request_message(usage: ClaimVram, node: str = "") -> str:
    """The Event text: the largest process, its VRAM, the claim's total and its request."""
    top = max(usage.processes, key=lambda p: p.used_bytes)
    who = f"process {top.pid}" + (f" in container {top.container}" if top.container else "")
    total = "" if len(usage.processes) == 1 else f" (claim total {_gib(usage.used_bytes)})"
    where = f" on node {node}" if node else ""
    return (f"{who} uses {_gib(top.used_bytes)} of VRAM on {usage.device}{where}{total}, more than the "
            f"{_gib(usage.requested_bytes or 0)} claim {usage.claim.claim_namespace}/{usage.claim.claim_name} "
            f"requested; other claims sharing this GPU may run out of memory")


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


class VramAccountant:
    """Reads NVML and /proc, attributes VRAM to claims, and warns pods that use more than they asked.

    ``claims_provider`` returns the plugin's prepared claims. ``core_api`` (a
    ``kubernetes.client.CoreV1Api``) is used for Events and container names; without it nothing is
    written. ``proc_root`` is where the host's /proc is visible (``/host/proc`` in the DaemonSet).
    ``pod_resources`` returns the kubelet's PodResources map (a
    :class:`~kubelet_plugin.metrics.pod_resources_client.PodResourcesCache`), or None when not available: a
    process's container is named from it when exactly one container of its pod uses the claim's
    device, else from the pod's container statuses (an API read, keyed by the cgroup's container ID).
    """

    def __init__(self, nvml: Any, devices_provider: Callable[[], NodeDevices],
                 claims_provider: Callable[[], Sequence[PreparedClaim]], *, core_api: Any = None,
                 proc_root: str | Path = "/proc", node: str = "",
                 component: str = "gpuready-kubelet-plugin",
                 pod_resources: Callable[[], ContainerMap | None] | None = None) -> None:
        self._nvml = nvml
        self._pod_resources = pod_resources
        self._devices = devices_provider
        self._claims = claims_provider
        self._core = core_api
        self._proc_root = Path(proc_root)
        self._node = node
        self._component = component
        self._reported: set[tuple[str, str]] = set()  # (claim uid, device) currently warned about
        self._container_names: dict[str, dict[str, str]] = {}  # pod uid -> container id -> name
        self._lock = threading.Lock()
        self._loop: Periodic | None = None  # the check's loop, once started

    # --- reading ------------------------------------------------------------------------------
    def device_processes(self) -> dict[str, list[ProcessVram]]:
        """device name -> processes on it, each with its pod and container from /proc."""
        from kubelet_plugin.nvml import read_processes

        out: dict[str, list[ProcessVram]] = {}
        identities: dict[int, CgroupIdentity | None] = {}

        def proc(device: str, pid: int, used: int | None) -> ProcessVram:
            if pid not in identities:
                identities[pid] = read_process_identity(pid, self._proc_root)
            ident = identities[pid]
            return ProcessVram(device=device, pid=pid, used_bytes=used or 0,
                               pod_uid=ident.pod_uid if ident else "",
                               container_id=ident.container_id if ident else "")

        for gpu in self._devices().gpus:
            if gpu.mig_mode == MigMode.ENABLED:
                for mig in gpu.mig_devices:
                    on_mig = read_processes(self._nvml, mig.uuid).processes
                    out[mig.name] = [proc(mig.name, p.pid, p.used_bytes) for p in on_mig]
            else:
                on_gpu = read_processes(self._nvml, gpu.uuid).processes
                out[gpu.name] = [proc(gpu.name, p.pid, p.used_bytes) for p in on_gpu]
        return out

    def report(self) -> VramReport:
        """Current per-claim VRAM use on this node."""
        report = attribute_vram(self.device_processes(), self._claims())
        if self._core is None and self._pod_resources is None:
            return report
        containers = self._pod_resources() if self._pod_resources is not None else None
        named = tuple(self._with_container_names(c, containers) for c in report.claims)
        return VramReport(claims=named, unattributed=report.unattributed)

    # --- warning ------------------------------------------------------------------------------
    def check(self, report: VramReport | None = None) -> list[ClaimVram]:
        """Emit an Event for each claim newly over its request; return every claim now over.

        A claim is warned about once per crossing: it is warned again only after its use has fallen
        back under the request (or the claim went away) and risen over it again.
        """
        if report is None and not self._claims():
            # Nothing prepared, nothing can be over its request: an idle node reads no GPU's
            # processes and asks the kubelet for nothing every interval.
            with self._lock:
                self._reported = set()
            return []
        report = report or self.report()
        over = [c for c in report.claims if c.over_request and c.processes]
        keys = {(c.claim.claim_uid, c.device) for c in over}
        with self._lock:
            new = [c for c in over if (c.claim.claim_uid, c.device) not in self._reported]
            self._reported = keys
        for usage in new:
            self._emit(usage)
        return over

    def _emit(self, usage: ClaimVram) -> None:
        message = over_request_message(usage, self._node)
        top = max(usage.processes, key=lambda p: p.used_bytes)
        pod = usage.pod_of(top) or (usage.claim.pods[0] if usage.claim.pods else None)
        log.warning("vram_over_request", claim_uid=usage.claim.claim_uid, device=usage.device, node=self._node,
                    pid=top.pid, used_bytes=usage.used_bytes, requested_bytes=usage.requested_bytes)
        if self._core is None or pod is None:
            return
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{pod.name}.{time.time_ns():x}", "namespace": pod.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod.name,
                               "namespace": pod.namespace, "uid": pod.uid},
            "reason": EVENT_REASON, "message": message, "type": "Warning",
            "source": {"component": self._component, "host": self._node},
            "reportingComponent": self._component, "reportingInstance": self._node or self._component,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            self._core.create_namespaced_event(pod.namespace, body)
        except Exception as exc:  # an Event is advisory: never let it break accounting
            log.error("vram_event_failed", claim_uid=usage.claim.claim_uid, device=usage.device,
                      node=self._node, error=str(exc))
            with self._lock:
                self._reported.discard((usage.claim.claim_uid, usage.device))  # try again next round

    def _with_container_names(self, usage: ClaimVram, containers: ContainerMap | None) -> ClaimVram:
        if not usage.processes:
            return usage
        procs = []
        key = (usage.claim.claim_namespace, usage.claim.claim_name, usage.device)
        for p in usage.processes:
            pod = usage.pod_of(p)
            name = ""
            if pod is not None and containers is not None:
                # PodResources names containers per claim device, not per process: it decides only
                # when one container of the pod uses the device (else the container ID decides).
                users = containers_of_pod(containers, key, pod.namespace, pod.name)
                name = users[0] if len(users) == 1 else ""
            if not name and pod is not None and p.container_id and self._core is not None:
                name = self._container_name(pod, p.container_id)
            procs.append(ProcessVram(p.device, p.pid, p.used_bytes, p.pod_uid, p.container_id, name))
        return ClaimVram(usage.claim, usage.device, usage.used_bytes, usage.requested_bytes, tuple(procs))

    def _container_name(self, pod: PodRef, container_id: str) -> str:
        names = self._container_names.get(pod.uid)
        if names is None or container_id not in names:
            try:
                obj = self._core.read_namespaced_pod(pod.name, pod.namespace)
                statuses = list(obj.status.container_statuses or []) + list(obj.status.init_container_statuses or [])
                names = {(s.container_id or "").split("://")[-1]: s.name for s in statuses if s.container_id}
            except Exception as exc:
                log.debug("vram_pod_read_failed", node=self._node, pod=pod.name, error=str(exc))
                names = {}
            self._container_names[pod.uid] = names
        return names.get(container_id, "")

    # --- running ------------------------------------------------------------------------------
    def start(self, interval_s: float = 15.0, on_failure: Callable[[str], None] | None = None) -> Periodic:
        """Check every ``interval_s`` seconds on a supervised daemon thread until :meth:`stop`."""
        # Metrics only: a failing check (the API server down) is counted and logged, never NotReady.
        self._loop = Periodic("vram-accounting", interval_s, self.check, on_failure, self._node or "",
                              gates_readiness=False)
        self._loop.start()
        return self._loop

    def stop(self) -> None:
        """Stop the loop started by :meth:`start`."""
        if self._loop is not None:
            self._loop.stop()

    def collector(self) -> Collector:
        """A collector exporting per-claim VRAM at scrape time (register it in the plugin's registry)."""
        return ClaimVramCollector(self, self._node)


class ClaimVramCollector(Collector):
    """``gpuready_claim_vram_used_bytes``, ``..._requested_bytes`` and ``gpuready_unattributed_vram_used_bytes``."""

    def __init__(self, accountant: VramAccountant, node: str = "") -> None:
        self._accountant = accountant
        self._node = node

    def describe(self) -> list[Metric]:
        """Families without reading NVML."""
        return list(self._families())

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return CLAIM_VRAM_USED.fresh(), CLAIM_VRAM_REQUESTED.fresh(), UNATTRIBUTED_VRAM_USED.fresh()

    def collect(self) -> Iterator[Metric]:
        """Read once, export per claim."""
        used, requested, unattributed = self._families()
        try:
            report = self._accountant.report()
        except Exception as exc:
            log.error("vram_report_failed", node=self._node, error=str(exc))
            return
        for c in report.claims:
            pods = ",".join(sorted({p.name for p in c.claim.pods}))
            values = [self._node, c.claim.claim_namespace, c.claim.claim_name, pods, c.device]
            used.add_metric(values, c.used_bytes)
            if c.requested_bytes is not None:
                requested.add_metric(values, c.requested_bytes)
        per_device: dict[str, int] = {}
        for p in report.unattributed:
            per_device[p.device] = per_device.get(p.device, 0) + p.used_bytes
        for device, n in sorted(per_device.items()):
            unattributed.add_metric([self._node, device], n)
        yield from (used, requested, unattributed)
