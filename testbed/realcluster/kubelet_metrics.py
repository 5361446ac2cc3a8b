"""The kubelet's own view of the driver: ``dra_grpc_operations_duration_seconds`` from its /metrics.

This histogram is what the kubelet measured around each gRPC call to the plugin (NodePrepare-
Resources, NodeUnprepareResources), so it includes the gRPC transport and the plugin's whole
handling, as a user's pod start sees it. Benchmarks take two readings and subtract them.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

GRPC_METRIC = "dra_grpc_operations_duration_seconds"


@dataclass(frozen=True)
class Operation:
    """Count and total seconds of one gRPC method's calls, as the kubelet's histogram has them."""

    count: float = 0.0
    sum: float = 0.0

    @property
    def mean(self) -> float:
        """Mean seconds per call (0 with no calls)."""
        return self.sum / self.count if self.count else 0.0

    def __sub__(self, earlier: Operation) -> Operation:
        """The calls made between ``earlier`` and this reading."""
        return Operation(self.count - earlier.count, self.sum - earlier.sum)


def grpc_operations(metrics_text: str, driver: str = "gpu.nvidia.com", status: str | None = "OK") -> dict[str, Operation]:
    """Per short method name (``NodePrepareResources``...), the count and sum for ``driver``.

    ``status`` filters on ``grpc_status_code`` (None: all codes added together).
    """
    out: dict[str, Operation] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != GRPC_METRIC:
            continue
        for sample in family.samples:
            labels = sample.labels
            if labels.get("driver_name") != driver or (status is not None and labels.get("grpc_status_code") != status):
                continue
            method = labels.get("method_name", "").rpartition("/")[2]
            op = out.get(method, Operation())
            if sample.name.endswith("_count"):
                op = Operation(op.count + sample.value, op.sum)
            elif sample.name.endswith("_sum"):
                op = Operation(op.count, op.sum + sample.value)
            out[method] = op
    return out


def grpc_buckets(metrics_text: str, method: str, driver: str = "gpu.nvidia.com") -> dict[float, float]:
    """The kubelet's cumulative histogram buckets (upper bound in seconds -> calls) of one gRPC method
    (``NodePrepareResources``...) of ``driver``, every status code; for quantiles over many calls."""
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name != GRPC_METRIC:
            continue
        for s in family.samples:
            if (s.name == f"{GRPC_METRIC}_bucket" and s.labels.get("driver_name") == driver
                    and s.labels.get("method_name", "").rpartition("/")[2] == method):
                buckets[float(s.labels["le"])] = buckets.get(float(s.labels["le"]), 0.0) + s.value
    return buckets


def registered_plugins(metrics_text: str) -> set[str]:
    """Registration sockets the kubelet's plugin manager has registered (``plugin_manager_total_plugins``
    in its actual state of world): a plugin is registered once its socket is listed here."""
    sockets: set[str] = set()
    for family in text_string_to_metric_families(metrics_text):
        if family.name != "plugin_manager_total_plugins":
            continue
        for sample in family.samples:
            if sample.labels.get("state") == "actual_state_of_world" and sample.value > 0:
                sockets.add(sample.labels.get("socket_path", ""))
    return sockets
