"""The DRA socket: the DRA node service (``DRAPlugin`` v1 and v1beta1) over a
:class:`~kubelet_plugin.kubelet.driver.DraDriver`, and the health stream (v1 and v1alpha1), on one
Unix socket served by the plugin's :class:`~kubelet_plugin.kubelet.grpc_loop.GrpcLoop` (handlers on
its pool of worker threads). Imported only when the plugin is ready to serve (after its first
ResourceSlice is on its way), so gRPC's import does not delay the slice.

A prepare of one claim, in order: the reference is checked (:func:`request_entries`), the driver is
asked for a recorded answer (a repeated prepare reads nothing), the claim is read
(:class:`~kubelet_plugin.kubelet.claims.KubeClaims`; API failures become per-claim errors with their
own reason, :func:`~kubelet_plugin.kubelet.claims.api_failure`), and the driver prepares it.

One servicer class serves both packages: the messages are identical except that v1beta1's
``Device`` has no ``share_id``. Every claim in a request gets an entry in the answer; an error in
one claim is reported in that claim's ``error`` and never fails the others (a gRPC error status
would fail the whole batch in the kubelet). Each claim reference is checked first
(:func:`claim_problem`): a malformed one gets an error naming ``claims[i].<field>`` and never
reaches the API server.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, replace
from typing import Any

import grpc

from dra_driver.logs import get_logger
from kubelet_plugin.kubelet.claims import KubeClaims
from kubelet_plugin.kubelet.driver import UID_MAX, UID_RE, ClaimOutcome, ClaimRef, DraDriver, uid_problem
from kubelet_plugin.kubelet.grpc_loop import GrpcLoop
from kubelet_plugin.kubelet.health_stream import HealthBroadcaster, HealthServicer
from kubelet_plugin.kubelet.sockets import remove_stale_socket
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

log = get_logger(__name__)


# What the kubelet sends in each field (NodePrepareResourcesRequest.claims[i], the kubelet's DRA v1 proto).
_FIELD_MEANING = {
    "uid": "the ResourceClaim's metadata.uid",
    "namespace": "the ResourceClaim's namespace (the pod's namespace)",
    "name": "the ResourceClaim's metadata.name",
}
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def claim_problem(index: int, uid: str, namespace: str, name: str) -> str | None:
    """Why ``claims[index]`` of a request cannot be a claim reference, or None when it can.

    Checked before anything else, so a malformed request never reaches the API server: an empty
    name would otherwise read the whole collection, a name with ``/`` another path; the UID names
    files and locks, so it must look like a UID (:mod:`kubelet_plugin.kubelet.driver`: no NUL, no ``/``, bounded).
    """
    for field, value in (("uid", uid), ("namespace", namespace), ("name", name)):
        if not value:
            return (f"claims[{index}].{field} is empty: the kubelet must send {_FIELD_MEANING[field]}; "
                    "nothing was prepared or unprepared for this entry")
    # The common case in one regular expression; the reason is worked out only for a UID that fails it.
    problem = None if len(uid) <= UID_MAX and UID_RE.match(uid) else uid_problem(uid)
    if problem:
        return (f"claims[{index}].uid {problem}; the kubelet must send {_FIELD_MEANING['uid']} (letters, digits "
                f"and '-', at most {UID_MAX} characters); nothing was prepared or unprepared for this entry")
    if len(namespace) > 63 or not _DNS_LABEL.match(namespace):
        return (f"claims[{index}].namespace {namespace!r} is not a namespace name (a DNS label of at most 63 "
                f"characters); the kubelet must send {_FIELD_MEANING['namespace']}")
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        return (f"claims[{index}].name {name!r} is not a ResourceClaim name (a DNS subdomain of at most 253 "
                f"characters); the kubelet must send {_FIELD_MEANING['name']}")
    return None


@dataclass(frozen=True)
class _Entry:
    """One distinct claim of a request: what to do, or why not."""

    uid: str
    namespace: str
    name: str
    error: str = ""


def request_entries(claims: Any) -> list[_Entry]:
    """The request's claims, checked, one entry per UID (the answer is a map keyed by UID).

    A UID listed twice for the same claim is answered once (preparing it twice would list its devices
    and CDI IDs twice); a UID listed for two different claims is an error for that UID.
    """
    entries: dict[str, _Entry] = {}
    for i, claim in enumerate(claims):
        uid, namespace, name = claim.uid, claim.namespace, claim.name
        problem = claim_problem(i, uid, namespace, name)
        seen = entries.get(uid)
        if seen is not None:
            if not seen.error and not problem and (seen.namespace, seen.name) != (namespace, name):
                entries[uid] = replace(seen, error=(
                    f"claims[{i}] names ResourceClaim {namespace}/{name} with UID {uid}, which an earlier "
                    f"entry gives to {seen.namespace}/{seen.name}: a UID names one claim; nothing was done "
                    "for this UID"))
            continue  # the same claim again: one answer
        entries[uid] = _Entry(uid, namespace, name, problem or "")
    return list(entries.values())


class DraServicer:
    """``NodePrepareResources`` / ``NodeUnprepareResources`` for one proto package."""

    def __init__(self, driver: DraDriver, claims: KubeClaims, pb2: Any, metrics: Any = None) -> None:
        self.driver = driver
        self.claims = claims
        self.pb2 = pb2
        self.metrics = metrics  # kubelet_plugin.metrics.PluginMetrics or None
        self.has_share_id = "share_id" in pb2.Device.DESCRIPTOR.fields_by_name

    def _refused(self, call: str, entry: _Entry) -> ClaimOutcome:
        log.warning("claim_request_invalid", call=call, claim_uid=entry.uid[:UID_MAX] or None,  # bounded log line
                    claim=f"{entry.namespace}/{entry.name}", node=self.driver.pool, error=entry.error)
        return ClaimOutcome(error=entry.error, reason="invalid_request")

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        """Prepare every claim of the request; per-claim errors."""
        response = self.pb2.NodePrepareResourcesResponse()
        for claim in request_entries(request.claims):
            start = time.perf_counter()
            if claim.error:
                outcome = self._refused("NodePrepareResources", claim)
            else:
                # The driver reads the claim (self.claims) only when it has no recorded answer.
                outcome = self.driver.prepare(ClaimRef(claim.uid, claim.namespace, claim.name), self.claims)
            entry = response.claims[claim.uid]
            if outcome.error:
                entry.error = outcome.error
            else:
                for d in outcome.devices:
                    device = entry.devices.add(request_names=d.request_names, pool_name=d.pool_name,
                                               device_name=d.device_name, cdi_device_ids=d.cdi_device_ids)
                    if d.share_id and self.has_share_id:
                        device.share_id = d.share_id
            if self.metrics is not None:
                self.metrics.observe_prepare(time.perf_counter() - start, not outcome.error, outcome.reason)
        self._count_prepared()
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        """Unprepare every claim of the request; per-claim errors."""
        response = self.pb2.NodeUnprepareResourcesResponse()
        for claim in request_entries(request.claims):
            start = time.perf_counter()
            if claim.error:
                outcome = self._refused("NodeUnprepareResources", claim)
            else:
                outcome = self.driver.unprepare(ClaimRef(claim.uid, claim.namespace, claim.name))
            entry = response.claims[claim.uid]
            if outcome.error:
                entry.error = outcome.error
            if self.metrics is not None:
                self.metrics.observe_unprepare(time.perf_counter() - start, not outcome.error, outcome.reason)
        self._count_prepared()
        return response

    def _count_prepared(self) -> None:
        if self.metrics is not None:
            self.metrics.set_prepared_claims(self.driver.prepared_count())


def serve_dra(loop: GrpcLoop, socket_path: str, driver: DraDriver, claims: KubeClaims, broadcaster: HealthBroadcaster, metrics: Any, *,
              health_stream: bool, node: str) -> grpc.aio.Server:
    """Start serving on ``socket_path`` (a stale socket file is replaced); returns the running server."""
    os.makedirs(os.path.dirname(socket_path), exist_ok=True)
    remove_stale_socket(socket_path)
    return loop.serve(socket_path, lambda server: _add_servicers(server, driver, claims, broadcaster, metrics,
                                                                 health_stream, node))


def _add_servicers(server: grpc.aio.Server, driver: DraDriver, claims: KubeClaims, broadcaster: HealthBroadcaster, metrics: Any,
                   health_stream: bool, node: str) -> None:
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(DraServicer(driver, claims, dra_v1_pb2, metrics), server)
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(DraServicer(driver, claims, dra_v1beta1_pb2, metrics), server)
    if health_stream:
        on_stream = metrics.health_stream_clients
        health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            HealthServicer(broadcaster, health_v1_pb2, on_stream, node=node), server)
        health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            HealthServicer(broadcaster, health_v1alpha1_pb2, on_stream, node=node), server)
