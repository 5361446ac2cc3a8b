"""The DRA node service (``DRAPlugin`` v1 and v1beta1) over a :class:`~kubelet_plugin.prepare.Preparer`.

One servicer class serves both packages: the messages are identical except that v1beta1's
``Device`` has no ``share_id``. Every claim in a request gets an entry in the answer; an error in
one claim is reported in that claim's ``error`` and never fails the others (a gRPC error status
would fail the whole batch in the kubelet).
"""

from __future__ import annotations

import time
from typing import Any

import grpc

from dra_driver.logs import get_logger
from kubelet_plugin.prepare import Preparer

log = get_logger(__name__)


class DraServicer:
    """``NodePrepareResources`` / ``NodeUnprepareResources`` for one proto package."""

    def __init__(self, preparer: Preparer, pb2: Any, metrics: Any = None) -> None:
        self.preparer = preparer
        self.pb2 = pb2
        self.metrics = metrics  # dra_driver.metrics.PluginMetrics or None
        self.has_share_id = "share_id" in pb2.Device.DESCRIPTOR.fields_by_name

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        """Prepare every claim of the request; per-claim errors."""
        response = self.pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            start = time.perf_counter()
            outcome = self.preparer.prepare(claim.namespace, claim.name, claim.uid)
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
        for claim in request.claims:
            start = time.perf_counter()
            outcome = self.preparer.unprepare(claim.namespace, claim.name, claim.uid)
            entry = response.claims[claim.uid]
            if outcome.error:
                entry.error = outcome.error
            if self.metrics is not None:
                self.metrics.observe_unprepare(time.perf_counter() - start, not outcome.error, outcome.reason)
        self._count_prepared()
        return response

    def _count_prepared(self) -> None:
        if self.metrics is not None:
            self.metrics.set_prepared_claims(len(self.preparer.checkpoint.records()))
