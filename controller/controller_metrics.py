"""The controller's metrics: planning, webhooks, placements, unfit claims, reconciler, leadership.

Like :mod:`kubelet_plugin.metrics.plugin_metrics`, every family is declared once in the class body
(:mod:`dra_driver.metric_families` registers them) and nothing uses the global default registry.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from prometheus_client import CollectorRegistry

from dra_driver import __version__
from dra_driver.metric_families import CounterFamily, GaugeFamily, HistogramFamily, MetricSet

# Planning over a cluster inventory is pure CPU work: tens of microseconds for one node, tens of
# milliseconds for thousands of devices. A webhook call must answer well inside the API server's
# 10 s timeout (chart default 5 s), so its buckets reach that far.
PLANNING_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)
WEBHOOK_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

WEBHOOK_OUTCOMES: tuple[str, ...] = ("mutated", "unchanged", "allowed", "denied", "warned", "error")


class ControllerMetrics(MetricSet):
    """The metric families of one controller replica."""

    build_info = GaugeFamily(
        "gpuready_controller_build_info", "gpuready version of this controller (value 1).", ("version", "driver_name"))
    is_leader = GaugeFamily(
        "gpuready_controller_is_leader", "1 while this replica holds the leader Lease (runs reconcilers and placement).")
    planning_duration = HistogramFamily(
        "gpuready_controller_planning_duration_seconds",
        "Time to plan one claim (best-fit search over the inventory), by policy and result.",
        ("policy", "result"), PLANNING_BUCKETS)
    webhook_duration = HistogramFamily(
        "gpuready_controller_webhook_duration_seconds",
        "Time to answer one admission review, by webhook (mutate, validate) and object kind.",
        ("webhook", "kind"), WEBHOOK_BUCKETS)
    webhook_requests = CounterFamily(
        "gpuready_controller_webhook_requests",
        "Admission reviews answered, by webhook, kind and outcome (mutated, unchanged, allowed, denied, warned, error).",
        ("webhook", "kind", "outcome"))
    placements = CounterFamily(
        "gpuready_controller_placements", "Claims the controller placed itself (placement mode), by policy and result.",
        ("policy", "result"))
    unfit_verdicts = CounterFamily(
        "gpuready_controller_unfit_verdicts",
        "Times a claim was found to fit no device, by reason (memory, selector, counters, taints, ...).", ("reason",))
    unfit_claims = GaugeFamily(
        "gpuready_controller_unfit_claims", "Pending claims that currently fit no device in the cluster, by reason.",
        ("reason",))
    reconciler_actions = CounterFamily(
        "gpuready_controller_reconciler_actions",
        "Actions of the claim health reconciler (condition_set, event, evict, ...), by result.", ("action", "result"))
    inventory_devices = GaugeFamily(
        "gpuready_controller_inventory_devices",
        "Devices in the controller's inventory of published ResourceSlices, by state.", ("state",))
    readiness_taint_changes = CounterFamily(
        "gpuready_controller_readiness_taint_changes",
        "Readiness taints the leader removed from or added to Nodes (GPUReady gates the node), by result.",
        ("action", "result"))
    readiness_tainted_nodes = GaugeFamily(
        "gpuready_controller_readiness_tainted_nodes",
        "Nodes carrying the readiness taint now (they take no pods that do not tolerate it).")
    plugin_down_changes = CounterFamily(
        "gpuready_controller_plugin_down_changes",
        "Plugin-down taints the leader added to (taint) or lifted from (lift) nodes whose kubelet plugin "
        "stopped renewing its heartbeat, by result.", ("action", "result"))
    plugin_down = GaugeFamily(
        "gpuready_controller_plugin_down",
        "1 for each node whose kubelet plugin is down now (its GPUs are offered to no new claim).", ("node",))

    def __init__(self, registry: CollectorRegistry | None = None, driver_name: str = "gpu.nvidia.com") -> None:
        super().__init__(registry)
        self.build_info.labels(__version__, driver_name).set(1)
        self.is_leader.set(0)

    def set_leader(self, leader: bool) -> None:
        """Record whether this replica holds the leader Lease."""
        self.is_leader.set(1 if leader else 0)

    def observe_planning(self, seconds: float, policy: str, ok: bool) -> None:
        """Record one planning run; ``ok`` False when no plan was found."""
        self.planning_duration.labels(policy, "fit" if ok else "unfit").observe(seconds)

    def observe_webhook(self, webhook: str, kind: str, seconds: float, outcome: str) -> None:
        """Record one admission review. ``webhook``: mutate|validate; ``kind``: ResourceClaim|...."""
        if outcome not in WEBHOOK_OUTCOMES:
            raise ValueError(f"webhook outcome {outcome!r} is not one of {', '.join(WEBHOOK_OUTCOMES)}")
        self.webhook_duration.labels(webhook, kind).observe(seconds)
        self.webhook_requests.labels(webhook, kind, outcome).inc()

    def observe_placement(self, policy: str, ok: bool) -> None:
        """Count one placement attempt (placement mode)."""
        self.placements.labels(policy, "placed" if ok else "failed").inc()

    def observe_unfit(self, reason: str) -> None:
        """Count one 'fits nowhere' verdict."""
        self.unfit_verdicts.labels(reason).inc()

    def set_unfit_claims(self, counts: Mapping[str, int]) -> None:
        """Replace the current unfit-claims-by-reason snapshot (reasons not given drop to absent)."""
        self.unfit_claims.clear()
        for reason, n in counts.items():
            self.unfit_claims.labels(reason).set(n)

    def reconciler_action(self, action: str, ok: bool = True) -> None:
        """Count one reconciler action."""
        self.reconciler_actions.labels(action, "success" if ok else "error").inc()

    def readiness_taint_change(self, action: str, ok: bool) -> None:
        """Count one readiness taint write (``action``: add | remove)."""
        self.readiness_taint_changes.labels(action, "success" if ok else "error").inc()

    def set_readiness_tainted_nodes(self, count: int) -> None:
        """Record how many Nodes carry the readiness taint after a pass."""
        self.readiness_tainted_nodes.set(count)

    def set_inventory(self, counts: Mapping[str, int]) -> None:
        """Record inventory size by state (e.g. {'published': 64, 'tainted': 1, 'allocated': 12})."""
        self.inventory_devices.clear()
        for state, n in counts.items():
            self.inventory_devices.labels(state).set(n)

    def plugin_down_change(self, action: str, ok: bool) -> None:
        """Count one plugin-down write (``action``: taint | lift)."""
        self.plugin_down_changes.labels(action, "success" if ok else "error").inc()

    def set_plugin_down_nodes(self, nodes: Collection[str]) -> None:
        """Replace the set of nodes whose plugin is down (nodes not given drop to absent)."""
        self.plugin_down.clear()
        for node in nodes:
            self.plugin_down.labels(node).set(1)
