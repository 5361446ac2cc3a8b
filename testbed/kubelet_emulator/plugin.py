"""A registered DRA plugin as the kubelet sees it: a gRPC connection to its DRA socket.

The calls check the plugin's answers the way the kubelet does (an answer for an unknown claim UID
or a missing answer is an error), so a driver bug shows up here rather than on a real node.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypedDict

import grpc

from dra_driver.logs import get_logger
from proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
)
from testbed.kubelet_emulator.pod_resources import PodResourcesServer, PreparedClaimDevice

log = get_logger(__name__)

# The kubelet's per-call deadline for NodePrepareResources / NodeUnprepareResources.
DEFAULT_CALL_TIMEOUT = 45.0

_DRA_MODULES: dict[str, tuple[Any, Any]] = {
    "v1": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}
_HEALTH_MODULES: dict[str, tuple[Any, Any]] = {
    "v1": (health_v1_pb2, health_v1_pb2_grpc),
    "v1alpha1": (health_v1alpha1_pb2, health_v1alpha1_pb2_grpc),
}

ClaimRef = tuple[str, str, str]  # (namespace, name, uid)


class KubeletError(RuntimeError):
    """The kubelet would fail this operation (and retry it later on a real node)."""


class PluginCallError(KubeletError, grpc.RpcError):
    """A gRPC call to the plugin failed with a status; ``code()`` and ``details()`` as on grpc errors."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{method} failed: {code.name}: {details}")
        self.method = method
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        """The gRPC status code the plugin answered with."""
        return self._code

    def details(self) -> str:
        """The gRPC status message."""
        return self._details


class PreparedDevice(TypedDict):
    """One device of a prepared claim, as the plugin reported it."""

    request_names: list[str]
    pool_name: str
    device_name: str
    cdi_device_ids: list[str]
    share_id: str | None  # None when unset (always None over v1beta1)


@dataclass
class PrepareResult:
    """The plugin's answer for one claim: devices, or a non-empty error."""

    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        """True when the claim was prepared."""
        return not self.error


@dataclass(frozen=True)
class DeviceHealthReport:
    """One device entry of a health snapshot."""

    pool: str
    device: str
    health: str  # "HEALTHY", "UNHEALTHY" or "UNKNOWN"
    last_updated: int  # Unix seconds, as set by the plugin
    health_check_timeout: int  # seconds; <= 0 means the kubelet default (30 s)
    message: str


def _rpc_error(method: str, err: grpc.RpcError) -> PluginCallError:
    code = err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
    details = err.details() if callable(getattr(err, "details", None)) else str(err)
    return PluginCallError(method, code, details or "")


class RegisteredPlugin:
    """A plugin instance the emulator registered; call it like the kubelet does."""

    def __init__(
        self,
        driver_name: str,
        endpoint: str,
        dra_service: str,
        versions: list[str],
        health_services: tuple[str, ...],
        registration_socket: str,
        pod_resources: PodResourcesServer | None = None,
    ) -> None:
        self.driver_name = driver_name
        # The emulated kubelet's PodResources API: it lists what this plugin prepared.
        self.pod_resources = pod_resources
        self.endpoint = endpoint
        self.dra_service = dra_service
        self.versions = list(versions)
        # Health versions the plugin advertised, most preferred first (empty: none advertised).
        self.advertised_health = health_services
        # The version watch_health last streamed from (None until it connects).
        self.health_service: str | None = None
        self.registration_socket = registration_socket
        self.registered_at = time.monotonic()
        self._channel = grpc.insecure_channel(f"unix://{endpoint}")
        self._lock = threading.Lock()
        self._closed = False
        self._streams: set[Any] = set()

    def __repr__(self) -> str:
        return f"RegisteredPlugin({self.driver_name!r}, endpoint={self.endpoint!r}, dra_service={self.dra_service!r})"

    @property
    def closed(self) -> bool:
        """True once the plugin was deregistered or closed."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise KubeletError(f"plugin {self.driver_name} at {self.endpoint} is no longer registered")

    def prepare(
        self, claims: list[ClaimRef], timeout: float = DEFAULT_CALL_TIMEOUT
    ) -> dict[str, PrepareResult]:
        """Call NodePrepareResources for ``(namespace, name, uid)`` claims; return results by claim UID.

        Raises PluginCallError when the call fails as a whole, KubeletError when the answer leaves a
        claim out or names a claim that was not asked for (the kubelet treats both as failures).
        """
        self._check_open()
        pb, grpc_mod = _DRA_MODULES[self.dra_service]
        request = pb.NodePrepareResourcesRequest(
            claims=[pb.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )
        try:
            response = grpc_mod.DRAPluginStub(self._channel).NodePrepareResources(request, timeout=timeout)
        except grpc.RpcError as err:
            raise _rpc_error("NodePrepareResources", err) from None
        results: dict[str, PrepareResult] = {}
        for uid, answer in response.claims.items():
            devices: list[PreparedDevice] = [
                {
                    "request_names": list(d.request_names),
                    "pool_name": d.pool_name,
                    "device_name": d.device_name,
                    "cdi_device_ids": list(d.cdi_device_ids),
                    "share_id": d.share_id if self.dra_service == "v1" and d.HasField("share_id") else None,
                }
                for d in answer.devices
            ]
            results[uid] = PrepareResult(devices=[] if answer.error else devices, error=answer.error)
        _check_answered("NodePrepareResources", [uid for _, _, uid in claims], results)
        if self.pod_resources is not None:
            for ns, name, uid in claims:
                if results[uid].ok:
                    self.pod_resources.record_prepared(self.driver_name, ns, name, uid, [
                        PreparedClaimDevice(self.driver_name, d["pool_name"], d["device_name"],
                                            tuple(d["cdi_device_ids"])) for d in results[uid].devices])
        log.info(
            "kubelet_prepared",
            driver=self.driver_name,
            claims=len(claims),
            failed=sum(1 for r in results.values() if r.error),
        )
        return results

    def unprepare(self, claims: list[ClaimRef], timeout: float = DEFAULT_CALL_TIMEOUT) -> dict[str, str]:
        """Call NodeUnprepareResources; return claim UID -> error ("" on success). Raises like prepare."""
        self._check_open()
        pb, grpc_mod = _DRA_MODULES[self.dra_service]
        request = pb.NodeUnprepareResourcesRequest(
            claims=[pb.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )
        try:
            response = grpc_mod.DRAPluginStub(self._channel).NodeUnprepareResources(request, timeout=timeout)
        except grpc.RpcError as err:
            raise _rpc_error("NodeUnprepareResources", err) from None
        results = {uid: answer.error for uid, answer in response.claims.items()}
        _check_answered("NodeUnprepareResources", [uid for _, _, uid in claims], results)
        if self.pod_resources is not None:
            for uid, error in results.items():
                if not error:
                    self.pod_resources.forget_prepared(self.driver_name, uid)
        return results

    def watch_health(self, timeout: float | None = None) -> Iterator[list[DeviceHealthReport]]:
        """Stream NodeWatchResources snapshots: one list of reports per message the plugin sends.

        Uses the best health API the plugin serves: the advertised ones in the order v1, v1alpha1,
        or (nothing advertised, like a 1.34-1.36 kubelet) v1 then v1alpha1, moving to the next when
        the plugin answers UNIMPLEMENTED. The stream ends when the plugin ends it, when ``timeout``
        seconds have passed (quietly), or when the plugin is closed; other failures raise
        PluginCallError. Closing the iterator early cancels the call.
        """
        self._check_open()
        candidates = self.advertised_health or ("v1", "v1alpha1")
        deadline = None if timeout is None else time.monotonic() + timeout
        for index, version in enumerate(candidates):
            pb, grpc_mod = _HEALTH_MODULES[version]
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            call = grpc_mod.DRAResourceHealthStub(self._channel).NodeWatchResources(
                pb.NodeWatchResourcesRequest(), timeout=remaining
            )
            with self._lock:
                self._streams.add(call)
            try:
                first = True
                for message in call:
                    if first:
                        self.health_service = version
                        log.info("kubelet_health_stream_started", driver=self.driver_name, version=version)
                        first = False
                    yield [_health_report(pb, entry) for entry in message.devices]
                return
            except grpc.RpcError as err:
                code = err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
                if code == grpc.StatusCode.UNIMPLEMENTED and index + 1 < len(candidates):
                    continue
                if code == grpc.StatusCode.DEADLINE_EXCEEDED and deadline is not None:
                    return
                if code == grpc.StatusCode.CANCELLED and self._closed:
                    return
                raise _rpc_error(f"{version}.DRAResourceHealth/NodeWatchResources", err) from None
            finally:
                call.cancel()
                with self._lock:
                    self._streams.discard(call)

    def close(self) -> None:
        """Drop the connection (ends any open health streams). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            streams = list(self._streams)
        for call in streams:
            call.cancel()
        self._channel.close()


def _health_report(pb: Any, entry: Any) -> DeviceHealthReport:
    # An enum value this API version does not define reads as unknown, as in the kubelet.
    known = entry.health in pb.HealthStatus.values()
    return DeviceHealthReport(
        pool=entry.device.pool_name,
        device=entry.device.device_name,
        health=pb.HealthStatus.Name(entry.health) if known else "UNKNOWN",
        last_updated=entry.last_updated_time,
        health_check_timeout=entry.health_check_timeout_seconds,
        message=entry.message,
    )


def _check_answered(method: str, requested: list[str], answered: dict[str, Any]) -> None:
    """Fail like the kubelet when the plugin's map does not match the claims it was asked about."""
    unknown = sorted(set(answered) - set(requested))
    if unknown:
        raise KubeletError(f"{method}: plugin answered for claim UIDs it was not asked about: {unknown}")
    missing = [uid for uid in requested if uid not in answered]
    if missing:
        raise KubeletError(f"{method} skipped {len(missing)} ResourceClaims: {missing}")
