"""The demo's second half: a fault on a GPU in use, what everyone sees, recovery, pods finishing.

The fault hits the GPU of the 70 GiB pod. Withdrawal is measured from the injection to the moment
the device is gone from the ResourceSlices as the API server serves them (what a scheduler sees).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from testbed.demo.cluster import DRIVER, NAMESPACE, DemoCluster, wait_for
from testbed.demo.output import DemoFailure, Printer, expect
from testbed.demo.scenarios import Scenario
from testbed.demo.story import Placement, StoryState, _spec_path, _wrap

FAULT_POD = "llm-70gi"
_DEVICE_FAMILIES = ("gpuready_device_health_state", "gpuready_device_unhealthy_reason", "gpuready_xid_errors_total")
STAYS_FOR = 1.5  # seconds an ignored XID must leave the device published (XID 79 takes ~10 ms)


@dataclass
class FaultResult:
    """What the fault step measured, for the recovery step and the summary."""

    node: str
    device: str
    gpu_index: int
    withdrawn_ms: float | None = None


def _claim_condition(c: DemoCluster, pl: Placement, device: str) -> dict[str, Any] | None:
    for entry in (c.claim(pl.claim_name).get("status") or {}).get("devices") or []:
        if entry.get("driver") == DRIVER and entry.get("device") == device:
            for cond in entry.get("conditions") or []:
                if cond.get("type") == "Ready" and cond.get("status") == "False":
                    return dict(cond)
    return None


def _event(c: DemoCluster, name: str, reason: str, after: int = 0) -> dict[str, Any] | None:
    events = [e for e in c.events(name) if e.get("reason") == reason]
    return events[-1] if len(events) > after else None


def _count(c: DemoCluster, name: str, reason: str) -> int:
    return sum(1 for e in c.events(name) if e.get("reason") == reason)


def _event_lines(where: str, event: dict[str, Any]) -> list[str]:
    head = f"  Event on {where}: {event.get('type')} {event.get('reason')}:"
    return [head] + [f"    {line}" for line in _wrap(str(event.get("message", "")), 94)]


def _condition_lines(what: str, cond: dict[str, Any]) -> list[str]:
    head = f"  {what}: status={cond.get('status')} reason={cond.get('reason')}"
    return [head] + [f"    {line}" for line in _wrap(str(cond.get("message", "")), 94)]


def fault(p: Printer, c: DemoCluster, state: StoryState, scenario: Scenario) -> FaultResult:
    """Inject the scenario's fault on the 70 GiB pod's GPU; check and show what follows."""
    pl = state.placements[FAULT_POD]
    pool, dev, _ = pl.devices[0]
    node = c.nodes[pool]
    result = FaultResult(pool, dev["name"], node.gpu_index(dev["name"]))
    p.step(f"Fault: {scenario.title}", f"fault: {scenario.name}")
    p.say(f"{scenario.explanation} It hits {pool}/{result.device}, the GPU of pod {FAULT_POD}.")
    before = {reason: _count(c, pool, reason) for reason in ("GPUUnhealthy",)}
    pod_before = _count(c, FAULT_POD, "DeviceUnhealthy")
    started = time.monotonic()
    scenario.inject(node.plugin.nvml, result.gpu_index)
    if not scenario.withdraws:
        _device_stays(p, c, result, scenario)
        return result
    wait_for(lambda: result.device not in c.published(pool),
             f"{result.device} to leave {pool}'s ResourceSlices", timeout=10, interval=0.002)
    result.withdrawn_ms = (time.monotonic() - started) * 1000
    # Scraped now, while the device is Unhealthy: on a loaded machine the waits below can outlast the
    # short demo hold-down, and the plugin then already reports it Recovering.
    scraped = _metrics(c, pool, result.device)
    p.blank()
    p.wrapped([f"{result.device} left {pool}'s ResourceSlices {result.withdrawn_ms:.0f} ms after the fault "
               f"(found by: {scenario.detection}). No new claim can be allocated on it."], indent=2)

    def not_ready() -> dict[str, Any] | None:
        cond = c.gpu_ready(pool)
        return cond if cond and cond.get("status") == "False" and result.device in str(cond.get("message")) else None
    cond = wait_for(not_ready, f"{pool}'s GPUReady condition to turn False naming {result.device}", timeout=10)
    node_event = wait_for(lambda: _event(c, pool, "GPUUnhealthy", before["GPUUnhealthy"]),
                          f"a GPUUnhealthy Event on node {pool}", timeout=10)
    claim_cond = wait_for(lambda: _claim_condition(c, pl, result.device),
                          f"claim {pl.claim_name}'s status to mark {result.device} unhealthy", timeout=15)
    pod_event = wait_for(lambda: _event(c, FAULT_POD, "DeviceUnhealthy", pod_before),
                         f"a DeviceUnhealthy Event on pod {FAULT_POD}", timeout=15)
    report = wait_for(lambda: _unhealthy_report(node.health.report(result.device)),
                      f"the kubelet health stream to report {result.device} unhealthy", timeout=10)
    node_ready = c.condition(pool, "Ready") or {}
    expect(node_ready.get("status") == "True",
           f"node {pool} should still be Ready (only its GPU is not); its Ready condition: {node_ready or 'none'}")
    p.blank()
    p.say("The node is still Ready: only its GPU is not. The Node, the claim and the pod say so:")
    p.blank()
    p.lines(_condition_lines(f"Node {pool} condition GPUReady", cond))
    p.lines(_event_lines(f"node/{pool}", node_event))
    p.lines(_condition_lines(f"claim {pl.claim_name} status.devices[{result.device}] Ready", claim_cond))
    p.lines(_event_lines(f"pod/{FAULT_POD}", pod_event))
    p.lines([f"  kubelet health stream ({node.registered.health_service}): {result.device} {report.health}: "
             f"{report.message}"])
    _show_metrics(p, c, pool, result.device, 'state="Unhealthy"} 1.0', scraped)
    p.done(f"{result.device} withdrawn in {result.withdrawn_ms:.0f} ms; GPUReady=False, claim and pod told")
    return result


def _metrics(c: DemoCluster, node: str, device: str) -> list[str]:
    """The lines of the node plugin's /metrics text that say what happened to ``device``."""
    from prometheus_client import generate_latest

    text = generate_latest(c.nodes[node].plugin.metrics.registry).decode()
    keep = []
    for line in text.splitlines():
        if line.startswith(("gpuready_published_devices", "gpuready_withdrawn_devices")):
            keep.append(line)
        elif f'device="{device}"' in line and line.startswith(_DEVICE_FAMILIES) and not (
                line.startswith("gpuready_device_health_state") and line.endswith(" 0.0")):
            keep.append(line)  # of the per-state gauges, only the state the device is in
    return keep


def _show_metrics(p: Printer, c: DemoCluster, node: str, device: str, must: str,
                  lines: list[str] | None = None) -> None:
    lines = _metrics(c, node, device) if lines is None else lines
    expect(any(must in line for line in lines), f"{node}'s /metrics should have {must} for {device}; "
                                                f"it has: {' | '.join(lines)}")
    p.lines([f"  {node} plugin /metrics (excerpt):"] + [f"    {line}" for line in lines])


def _unhealthy_report(report: Any) -> Any:
    return report if report is not None and report.health != "HEALTHY" else None


def _device_stays(p: Printer, c: DemoCluster, result: FaultResult, scenario: Scenario) -> None:
    from kubelet_plugin.health.xid import classify_xid

    deadline = time.monotonic() + STAYS_FOR
    while time.monotonic() < deadline:
        expect(result.device in c.published(result.node),
               f"{result.device} was withdrawn, but {scenario.name} must leave it published")
        time.sleep(0.05)
    cond = c.gpu_ready(result.node) or {}
    expect(cond.get("status") == "True", f"GPUReady on {result.node} should stay True; it is {cond}")
    decision = classify_xid(13)
    p.blank()
    p.wrapped([f"XID catalogue: {decision.reason} -> {decision.action.value}",
               f"{result.device} is still published {STAYS_FOR:.1f} s later (a withdrawing XID takes "
               f"milliseconds); GPUReady on {result.node} is still True: {cond.get('message')}"], indent=2)
    _show_metrics(p, c, result.node, result.device, 'state="Healthy"} 1.0')
    p.done(f"{result.device} stayed published; GPUReady stayed True")


def recover(p: Printer, c: DemoCluster, state: StoryState, scenario: Scenario, result: FaultResult) -> None:
    """Clear the fault (a GPU reset); the device returns only after validations over the hold-down."""
    pl = state.placements[FAULT_POD]
    node = c.nodes[result.node]
    p.step("Recovery: the GPU is reset and comes back", "recovery")
    if not scenario.withdraws:
        node.plugin.nvml.faults.clear(result.gpu_index)
        p.say("Nothing was withdrawn, so nothing has to come back.")
        expect(result.device in c.published(result.node), f"{result.device} should still be published")
        p.done(f"{result.device} was never withdrawn")
        return
    p.say(f"The fault is cleared (what a GPU reset does). The plugin does not trust the GPU at once: it "
          f"must pass the validation probe {c.recovery_passes} times over a hold-down of {c.hold_down:.0f} s "
          "(shortened for the demo; 60 s by default) so a flapping GPU stays out.")
    recovered_before = _count(c, result.node, "GPURecovered")
    started = time.monotonic()
    node.plugin.nvml.faults.clear(result.gpu_index)
    wait_for(lambda: result.device in c.published(result.node),
             f"{result.device} to return to {result.node}'s ResourceSlices", timeout=30, interval=0.01)
    back_s = time.monotonic() - started
    cond = wait_for(lambda: _ready(c.gpu_ready(result.node)), f"GPUReady on {result.node} to turn True", timeout=10)
    event = wait_for(lambda: _event(c, result.node, "GPURecovered", recovered_before),
                     f"a GPURecovered Event on node {result.node}", timeout=10)
    wait_for(lambda: _claim_condition(c, pl, result.device) is None,
             f"claim {pl.claim_name}'s unhealthy condition to be removed", timeout=15)
    wait_for(lambda: _healthy_report(node.health.report(result.device)),
             f"the kubelet health stream to report {result.device} healthy", timeout=10)
    p.blank()
    p.lines([f"  {result.device} is published again {back_s:.1f} s after the reset."])
    p.lines(_condition_lines(f"Node {result.node} condition GPUReady", cond))
    p.lines(_event_lines(f"node/{result.node}", event))
    p.lines([f"  claim {pl.claim_name}: the DeviceUnhealthy condition is removed; the health stream says HEALTHY."])
    p.done(f"{result.device} back after {back_s:.1f} s; GPUReady=True")


def _ready(cond: dict[str, Any] | None) -> dict[str, Any] | None:
    return cond if cond and cond.get("status") == "True" else None


def _healthy_report(report: Any) -> bool:
    return report is not None and report.health == "HEALTHY"


def finish(p: Printer, c: DemoCluster, state: StoryState) -> None:
    """Pods end: the kubelet unprepares (CDI specs removed), the controller frees the devices."""
    p.step("Pods finish: devices are unprepared and freed", "unprepare and free")
    p.say("The pods are deleted. Each kubelet calls NodeUnprepareResources: the plugin removes the CDI "
          "spec and the checkpoint entry (and destroys node-b's MIG instance). The controller removes the "
          "pods from reservedFor and deallocates the claims, so the devices return to the pool.")
    for pod, pl in state.placements.items():
        errors = c.nodes[pl.node].registered.unprepare([(NAMESPACE, pl.claim_name, pl.claim_uid)])
        expect(not errors.get(pl.claim_uid), f"unprepare of claim {pl.claim_name} failed: {errors.get(pl.claim_uid)}")
        expect(not os.path.exists(_spec_path(c.nodes[pl.node], pl.claim_uid)),
               f"the CDI spec of claim {pl.claim_name} is still there after unprepare")
        c.delete_pod(pod)
    c.delete_pod(state.unfit_pod)
    c.controller.kick()
    for pl in state.placements.values():
        def released(pl: Placement = pl) -> bool:
            return _released(c, pl)
        wait_for(released, f"claim {pl.claim_name} to be deallocated or deleted", timeout=20)
    for name, node in c.nodes.items():
        expect(not node.plugin.checkpoint.records(), f"{name}'s checkpoint still lists prepared claims")
    p.done(f"{len(state.placements)} claims unprepared and freed; no CDI specs left")


def _released(c: DemoCluster, pl: Placement) -> bool:
    import kubernetes

    try:
        claim = c.claim(pl.claim_name)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return True
        raise DemoFailure(f"reading claim {pl.claim_name}: {exc.reason}") from exc
    return not (claim.get("status") or {}).get("allocation")
