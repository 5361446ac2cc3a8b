"""Which containers use which DRA devices, from the kubelet's PodResources API (v1, gRPC).

The kubelet serves ``v1.PodResourcesLister`` on ``/var/lib/kubelet/pod-resources/kubelet.sock``.
Since Kubernetes 1.34 (feature gate ``KubeletPodResourcesDynamicResources``, on by default) its
``List`` answer names, per container, the DRA devices of the claims that container references
(``dynamic_resources``: claim name and namespace, driver, pool, device). That is the only place the
container names of a claim's device can be read from: a claim's ``status.reservedFor`` names pods,
never containers. The plugin uses it for the ``container`` label of the DCGM-named series and to
name the container of a process in VRAM accounting.

Layers: :class:`PodResourcesReader` is the gRPC edge (protobuf in, typed dataclasses out);
:func:`claim_device_containers` is the pure mapping; :class:`PodResourcesCache` adds a short TTL
(scrapes must not hammer the kubelet) and says once, in a structured log line, when the API is not
available (no socket, a kubelet without the service, a timeout) and once when it is back. The
answer is advisory: when it is missing, callers fall back to what they knew before.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dra_driver.logs import get_logger

if TYPE_CHECKING:  # the client part imports grpc when it first asks; the mapping helpers need none
    import grpc

log = get_logger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"


@dataclass(frozen=True)
class ClaimDevice:
    """One DRA device a container gets through a claim it references."""

    claim_namespace: str
    claim_name: str
    driver: str
    pool: str
    device: str


@dataclass(frozen=True)
class ContainerResources:
    """A container and the DRA devices the kubelet assigned it."""

    name: str
    devices: tuple[ClaimDevice, ...] = ()


@dataclass(frozen=True)
class PodResources:
    """A pod on this node as the kubelet's PodResources API reports it."""

    name: str
    namespace: str
    containers: tuple[ContainerResources, ...] = ()


@dataclass(frozen=True, order=True)
class ContainerRef:
    """A container of a pod, the unit a device's users are named in."""

    pod_namespace: str
    pod_name: str
    container: str


ClaimDeviceKey = tuple[str, str, str]  # (claim namespace, claim name, device)
ContainerMap = Mapping[ClaimDeviceKey, tuple[ContainerRef, ...]]


class PodResourcesUnavailable(RuntimeError):
    """The kubelet's PodResources API cannot be asked now; ``reason`` is a short machine word."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def pods_from_response(response: Any) -> list[PodResources]:
    """Typed pods from a ``ListPodResourcesResponse`` message (any object with its fields).

    A claim namespace the kubelet left empty is the pod's own (a pod can only use claims in its
    namespace), so older answers without ``claim_namespace`` still map.
    """
    pods: list[PodResources] = []
    for pod in response.pod_resources:
        containers = []
        for c in pod.containers:
            devices = tuple(
                ClaimDevice(claim_namespace=dyn.claim_namespace or pod.namespace, claim_name=dyn.claim_name,
                            driver=res.driver_name, pool=res.pool_name, device=res.device_name)
                for dyn in getattr(c, "dynamic_resources", ()) for res in dyn.claim_resources)
            containers.append(ContainerResources(name=c.name, devices=devices))
        pods.append(PodResources(name=pod.name, namespace=pod.namespace, containers=tuple(containers)))
    return pods


def claim_device_containers(pods: Iterable[PodResources], driver: str, pool: str) -> dict[ClaimDeviceKey,
                                                                                          tuple[ContainerRef, ...]]:
    """(claim namespace, claim name, device) -> the containers using it, for ``driver``'s devices in ``pool``.

    Pure. Devices of other drivers, and of other pools (a network-attached pool another node
    publishes), are left out. Each value is sorted and free of duplicates.
    """
    found: dict[ClaimDeviceKey, set[ContainerRef]] = {}
    for pod in pods:
        for container in pod.containers:
            for d in container.devices:
                if d.driver != driver or d.pool != pool:
                    continue
                found.setdefault((d.claim_namespace, d.claim_name, d.device), set()).add(
                    ContainerRef(pod.namespace, pod.name, container.name))
    return {key: tuple(sorted(refs)) for key, refs in found.items()}


def containers_of_pod(containers: ContainerMap, key: ClaimDeviceKey, pod_namespace: str,
                      pod_name: str) -> tuple[str, ...]:
    """Names of ``pod``'s containers that use the claim device ``key`` (sorted)."""
    return tuple(r.container for r in containers.get(key, ())
                 if r.pod_namespace == pod_namespace and r.pod_name == pod_name)


def single_pod_users(containers: ContainerMap, key: ClaimDeviceKey) -> tuple[str, str, tuple[str, ...]] | None:
    """(pod namespace, pod name, container names) when exactly one pod uses the claim device ``key``."""
    refs = containers.get(key, ())
    pods = {(r.pod_namespace, r.pod_name) for r in refs}
    if len(pods) != 1:
        return None
    (namespace, name), = pods
    return namespace, name, tuple(r.container for r in refs)


class PodResourcesReader:
    """A client of the kubelet's PodResources API on a Unix socket.

    One gRPC channel, opened on first use and kept (grpc reconnects by path when the kubelet
    restarts). Every failure is a :class:`PodResourcesUnavailable`, never a gRPC error.
    """

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_s: float = 2.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._channel: grpc.Channel | None = None
        self._lock = threading.Lock()

    def list_pods(self) -> list[PodResources]:
        """Every pod on the node with its containers' DRA devices (``List``)."""
        import grpc

        from proto import podresources_v1_pb2, podresources_v1_pb2_grpc

        self._check_socket()
        with self._lock:
            if self._channel is None:
                self._channel = grpc.insecure_channel(f"unix://{self.socket_path}")
            channel = self._channel
        stub = podresources_v1_pb2_grpc.PodResourcesListerStub(channel)
        try:
            response = stub.List(podresources_v1_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as err:
            code = err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
            details = err.details() if callable(getattr(err, "details", None)) else str(err)
            reason = {grpc.StatusCode.UNIMPLEMENTED: "unimplemented",
                      grpc.StatusCode.DEADLINE_EXCEEDED: "timeout",
                      grpc.StatusCode.UNAVAILABLE: "unavailable"}.get(code, "error")
            raise PodResourcesUnavailable(reason, f"{LIST_METHOD} on {self.socket_path}: {code.name}: "
                                                  f"{details}") from None
        return pods_from_response(response)

    def _check_socket(self) -> None:
        # Checked before dialing so a node without the socket (PodResources off, wrong mount)
        # answers at once and names the fix, instead of a gRPC connect error.
        try:
            mode = os.stat(self.socket_path).st_mode
        except FileNotFoundError:
            raise PodResourcesUnavailable(
                "no_socket", f"{self.socket_path} does not exist: mount the kubelet's pod-resources "
                "directory into the plugin, or set --pod-resources-socket (empty turns it off)") from None
        except OSError as exc:
            raise PodResourcesUnavailable("no_socket", f"{self.socket_path}: {exc}") from None
        if not stat.S_ISSOCK(mode):
            raise PodResourcesUnavailable("no_socket", f"{self.socket_path} is not a Unix socket")

    def close(self) -> None:
        """Close the channel (a later call opens a new one)."""
        with self._lock:
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()


class PodResourcesCache:
    """The claim-device -> containers map of this driver and pool, cached for ``ttl_s`` seconds.

    Callable: returns the map, or None while the API is not available. A failure is remembered for
    ``retry_s`` seconds (a missing socket is not: checking costs one ``stat``), and is logged once
    per reason (``pod_resources_unavailable``); recovery logs ``pod_resources_available``.
    Thread-safe: scrapes and the VRAM check thread call it concurrently.
    """

    def __init__(self, reader: PodResourcesReader, driver: str, pool: str, *, ttl_s: float = 5.0,
                 retry_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.reader = reader
        self._driver = driver
        self._pool = pool
        self._ttl = ttl_s
        self._retry = retry_s
        self._clock = clock
        self._lock = threading.Lock()
        self._value: dict[ClaimDeviceKey, tuple[ContainerRef, ...]] | None = None
        self._expires = float("-inf")
        self._failed_reason = ""  # the reason last logged; "" while available
        self.calls = 0  # List calls made (tests check the TTL)

    def __call__(self) -> ContainerMap | None:
        """The current map (cached), or None when the kubelet cannot be asked."""
        with self._lock:
            if self._clock() < self._expires:
                return self._value
            self.calls += 1
            try:
                value: dict[ClaimDeviceKey, tuple[ContainerRef, ...]] | None = claim_device_containers(
                    self.reader.list_pods(), self._driver, self._pool)
            except Exception as exc:  # advisory data: nothing here may fail a scrape or the VRAM check
                unavailable = exc if isinstance(exc, PodResourcesUnavailable) else PodResourcesUnavailable(
                    "error", f"{type(exc).__name__}: {exc}")
                if unavailable.reason != self._failed_reason:
                    log.warning("pod_resources_unavailable", node=self._pool, reason=unavailable.reason,
                                socket=self.reader.socket_path, error=unavailable.detail, retry_s=self._retry)
                self._failed_reason = unavailable.reason
                # A missing socket costs one stat: look again at the next call (the kubelet may be
                # starting). A kubelet that timed out or lacks the service is asked again later.
                retry = 0.0 if unavailable.reason == "no_socket" else self._retry
                self._value, self._expires = None, self._clock() + retry
                return None
            if self._failed_reason:
                log.info("pod_resources_available", node=self._pool, socket=self.reader.socket_path)
                self._failed_reason = ""
            self._value, self._expires = value, self._clock() + self._ttl
            return value

    def close(self) -> None:
        """Close the reader's channel."""
        self.reader.close()
