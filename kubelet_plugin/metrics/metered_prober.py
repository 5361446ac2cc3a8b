"""A validation prober that reports every probe to the plugin's metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubelet_plugin.metrics.plugin_metrics import PluginMetrics


class MeteredProber:
    """A validation prober that reports each probe's duration and result to the plugin's metrics.

    Recorded per probed device (``target.label``: the GPU, or the MIG device probed), not per name
    the result decides, so a dynamic-MIG GPU's dozens of placements do not multiply the series.
    """

    def __init__(self, inner: Any, metrics: PluginMetrics) -> None:
        self.inner = inner
        self.metrics = metrics

    def probe(self, target: Any, timeout_s: float) -> Any:
        """Probe through the wrapped prober, then record the result."""
        result = self.inner.probe(target, timeout_s)
        step = "" if result.ok else ("timeout" if result.code == "ProbeTimedOut" else "cuda")
        self.metrics.observe_validation(target.label, result.seconds, result.ok, step)
        return result
