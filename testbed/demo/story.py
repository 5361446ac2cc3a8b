"""The demo's first half: start the cluster, show the inventory, place the pods, explain the misfit,
prepare the devices. Each step checks what it shows and raises DemoFailure when it does not hold."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from testbed.demo.cluster import DRIVER, NAMESPACE, NODES, DemoCluster, DemoNode, wait_for
from testbed.demo.output import Printer, expect
from testbed.demo.workloads import GIB, Allocated, Workload, device_memory, device_type, workloads


@dataclass
class Placement:
    """Where a pod's claim landed."""

    workload: Workload
    node: str
    claim: dict[str, Any]
    devices: list[Allocated]
    prepared: list[dict[str, Any]] = field(default_factory=list)  # PreparedDevice dicts

    @property
    def claim_name(self) -> str:
        """The ResourceClaim's name."""
        return str(self.claim["metadata"]["name"])

    @property
    def claim_uid(self) -> str:
        """The ResourceClaim's UID."""
        return str(self.claim["metadata"]["uid"])


@dataclass
class StoryState:
    """What the steps hand on to each other."""

    placements: dict[str, Placement] = field(default_factory=dict)  # pod -> placement
    unfit_pod: str = ""
    warnings: dict[str, list[str]] = field(default_factory=dict)  # object name -> admission warnings


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.1f}"


def _profile(device: dict[str, Any]) -> str:
    attrs = device.get("attributes") or {}
    return str((attrs.get("profile") or {}).get("string", "-"))


def _health_of(node: DemoNode) -> dict[str, str]:
    monitor = node.plugin.health_monitor
    if monitor is None:
        return {}
    return {name: h.state.value for name, h in monitor.snapshot().devices.items()}


# --- 1. start -------------------------------------------------------------------------------------
def start_cluster(p: Printer, c: DemoCluster, metrics: bool) -> None:
    """Start the API server, both nodes (plugins + kubelets) and the controller; wait until published."""
    p.step("Start a local cluster: API server, two GPU nodes, controller", "start the cluster")
    p.say("A local Kubernetes API server (real HTTP; every part uses the real kubernetes client), two "
          "simulated GPU nodes each running the real gpuready kubelet plugin, a kubelet emulator per node "
          "that registers the plugin over its Unix socket and calls it over gRPC like the kubelet does, "
          "and the gpuready controller, whose planner is this cluster's allocator (it has no "
          "kube-scheduler). Only NVML is simulated.")
    c.start_api()
    p.info(f"  work directory: {c.workdir}")
    p.info(f"  component logs: {c.log_path}")
    for spec in NODES:
        c.start_node(spec)
    c.start_controller(metrics)
    for node in c.nodes.values():
        _wait_published(c, node)
    rows = []
    for name, node in c.nodes.items():
        rows.append((name, node.spec.summary, f"{node.registered.dra_service} at "
                     f"{os.path.relpath(node.registered.endpoint, c.workdir)}"))
    p.blank()
    p.table(["NODE", "GPUS", "DRA SERVICE (registered with the kubelet)"], rows)
    p.done(f"{len(c.nodes)} nodes registered, every GPU validated and published, controller leading")


def _wait_published(c: DemoCluster, node: DemoNode) -> None:
    """Wait for GPUReady=True (every device validated) and the slices to hold every healthy device."""
    def ready() -> bool:
        cond = c.gpu_ready(node.name)
        return bool(cond and cond.get("status") == "True")
    wait_for(ready, f"{node.name} to validate its GPUs (GPUReady=True)", timeout=30)
    # GPUReady is written after the slices are asked for: wait until the server holds them.
    expect(node.plugin.kubelet.publisher is not None and node.plugin.kubelet.publisher.wait_until_synced(15),
           f"{node.name}'s ResourceSlices were not written within 15 s")


# --- 2. inventory ---------------------------------------------------------------------------------
def _inventory_rows(node: DemoNode, published: dict[str, dict[str, Any]]) -> list[tuple[str, ...]]:
    health = _health_of(node)
    rows: list[tuple[str, ...]] = []
    placements: dict[tuple[str, int], list[str]] = {}
    for name, dev in published.items():
        if dev.get("consumesCounters") and device_type(dev) == "mig":
            # Dynamic MIG: every profile x placement is a device; one row per profile and size.
            placements.setdefault((_profile(dev), device_memory(dev)), []).append(name)
            continue
        shared = " (shared)" if dev.get("allowMultipleAllocations") else ""
        rows.append((name, device_type(dev) + shared, _gib(device_memory(dev)), _profile(dev),
                     health.get(name, "Healthy")))
    for (profile, memory), names in placements.items():
        gpus = sorted({n.split("-mig-")[0] for n in names})
        label = f"{'/'.join(gpus)}: {len(names)} placements"
        states = {health.get(n, "Healthy") for n in names}
        rows.append((label, "mig (dynamic)", _gib(memory), profile, ", ".join(sorted(states))))
    return rows


def show_inventory(p: Printer, c: DemoCluster) -> dict[str, dict[str, dict[str, Any]]]:
    """Print what each node publishes; check static MIG hides its parents and node-b's special GPUs."""
    p.step("What the nodes publish (ResourceSlices)", "inventory")
    p.say("Each plugin published only GPUs that passed validation (NVML answers, the compute probe ran). "
          "Devices are listed smallest first on every node, so the scheduler's first fit is a best fit "
          "by VRAM. Memory is what NVML reports: an \"80GB\" H100 has 79.6 GiB.")
    inventory = {name: c.published(name) for name in c.nodes}
    for name, node in c.nodes.items():
        p.blank()
        p.lines([f"  {name}: {node.spec.summary}"])
        p.table(["DEVICE", "TYPE", "MEMORY GiB", "PROFILE", "HEALTH"], _inventory_rows(node, inventory[name]))
    a, b = inventory["node-a"], inventory["node-b"]
    expect("gpu-6" not in a and "gpu-7" not in a and any(n.startswith("gpu-7-mig-") for n in a),
           "node-a should publish gpu-6/gpu-7's MIG devices and hide the two parent GPUs (static MIG)")
    expect(bool(b.get("gpu-3", {}).get("allowMultipleAllocations")),
           "node-b should publish gpu-3 as a shared GPU (allowMultipleAllocations)")
    expect(any(d.get("consumesCounters") for d in b.values()),
           "node-b should publish dynamic MIG placements that consume shared counters")
    p.blank()
    p.say("node-a hides gpu-6 and gpu-7 (their MIG mode is on: their instances are published instead). "
          "node-b publishes every MIG profile x placement it could create; they share counters, so "
          "taking one makes the overlapping ones unavailable.")
    total = sum(len(v) for v in inventory.values())
    p.done(f"{total} devices published ({', '.join(f'{n}: {len(v)}' for n, v in inventory.items())})")
    return inventory


# --- 3. pods --------------------------------------------------------------------------------------
def _allocated(claim: dict[str, Any], inventory: dict[str, dict[str, dict[str, Any]]]) -> list[Allocated]:
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    out: list[Allocated] = []
    for r in results:
        if r.get("driver") != DRIVER:
            continue
        dev = inventory.get(str(r.get("pool")), {}).get(str(r.get("device")))
        expect(dev is not None, f"claim {claim['metadata']['name']} got {r.get('pool')}/{r.get('device')}, "
                                "which is not published")
        assert dev is not None
        out.append((str(r["pool"]), dev, r))
    return out


def place_pods(p: Printer, c: DemoCluster, inventory: dict[str, dict[str, dict[str, Any]]],
               state: StoryState) -> None:
    """Create the pods and claims; the controller allocates and binds; check each placement."""
    p.step("Pods ask for GPUs; the controller places them", "placement by VRAM")
    fitting = [w for w in workloads() if w.fits]
    unfit = [w.pod for w in workloads() if not w.fits]
    p.say(f"{len(workloads())} pods, each with a ResourceClaim (or a template that makes one per pod), as a "
          "user would kubectl apply them. The controller creates the template claims, plans each claim with "
          "its VRAM-aware planner (binpack: the smallest device that fits, on the busiest node), writes "
          f"status.allocation and reservedFor, and binds the pod. {len(fitting)} of them fit; "
          f"{', '.join(unfit)} cannot (the next step says why).")
    for w in workloads():
        for obj in w.objects:
            state.warnings[obj["metadata"]["name"]] = c.create(obj)
    c.controller.kick()
    rows = []
    for w in workloads():
        if not w.fits:
            state.unfit_pod = w.pod
            continue

        def bound(w: Workload = w) -> dict[str, Any] | None:
            pod = c.pod(w.pod)
            return pod if (pod.get("spec") or {}).get("nodeName") else None
        pod = wait_for(bound, f"pod {w.pod} to be bound by the controller", timeout=20)
        claims = c.pod_claims(pod)
        expect(len(claims) == 1, f"pod {w.pod} should have one claim, has {len(claims)}")
        got = _allocated(claims[0], inventory)
        problem = w.check(got) if w.check else None
        expect(problem is None, f"pod {w.pod} ({w.asks}): {problem}")
        placement = Placement(w, pod["spec"]["nodeName"], claims[0], got)
        state.placements[w.pod] = placement
        for pool, dev, result in got:
            share = (result.get("consumedCapacity") or {}).get("memory")
            what = f"{device_type(dev)}, {_gib(device_memory(dev))} GiB" + (f", {share} of it" if share else "")
            rows.append((w.pod, w.asks, f"{pool}/{dev['name']}", what))
    p.blank()
    p.table(["POD", "ASKS FOR", "GOT", "DEVICE"], rows)
    p.blank()
    for w in workloads():
        if w.fits:
            p.say(f"{w.pod}: {w.why}.")
    _show_shaping(p, c, "vram-15gi")
    infer = state.placements["infer-15gi"].devices[0][1]
    expect(len(state.placements) == len(fitting), f"{len(fitting)} pods should be placed, {len(state.placements)} are")
    p.done(f"{len(state.placements)} of {len(workloads())} pods placed; the 15 GiB claim got MIG slice "
           f"{infer['name']} ({_gib(device_memory(infer))} GiB)")


def _show_shaping(p: Printer, c: DemoCluster, template: str) -> None:
    """What the controller's mutating webhook made of a VRAM request: the firstAvailable list."""
    request = c.template(template)["spec"]["spec"]["devices"]["requests"][0]
    entries = request.get("firstAvailable") or []
    expect(bool(entries) and "exactly" not in request,
           f"template {template} should have been shaped by the admission webhook into a firstAvailable list; "
           f"the API server stored: {json.dumps(request)[:200]}")
    names = [str(e.get("name")) for e in entries]
    p.blank()
    p.say(f"The 15 GiB request was shaped at admission: the API server called the controller's mutating "
          f"webhook, which replaced \"capacity.requests.memory: 15Gi\" in template {template} with a "
          f"best-fit firstAvailable list of memory tiers: first the devices up to twice the smallest shape "
          f"that fits (the scheduler prefers a node that has one), then any device that fits:")
    p.lines([f"  firstAvailable: {', '.join(names)}"])


# --- 4. the misfit --------------------------------------------------------------------------------
def explain_unfit(p: Printer, c: DemoCluster, state: StoryState) -> None:
    """The pod that cannot fit: its FailedScheduling Event and what ``gpuready explain`` says."""
    from controller import explain_command

    pod = state.unfit_pod
    p.step(f"A pod that cannot fit: {pod}", "a claim that cannot fit")
    p.say("No device anywhere has 200 GiB. The API server admitted the claim template with a warning "
          "from the controller's mutating webhook (kubectl prints it); the pod stays Pending; the "
          "controller says why in an Event, and gpuready explain shows, device by device, what was "
          "excluded and why.")
    template = next(o["metadata"]["name"] for w in workloads() if w.pod == pod for o in w.objects
                    if o["kind"] == "ResourceClaimTemplate")
    warnings = state.warnings.get(template) or []
    expect(any("200 GiB" in text for text in warnings),
           f"creating template {template} should have returned the webhook's warning that no device has "
           f"200 GiB; warnings: {warnings}")
    p.blank()
    shown = [f"  $ kubectl create -f {template}.yaml"]
    for text in warnings:
        lines = _wrap(f"Warning: {text}", 94)
        shown += [f"    {lines[0]}"] + [f"      {line}" for line in lines[1:]]
    p.lines(shown)

    def failed() -> dict[str, Any] | None:
        return next((e for e in c.events(pod) if e.get("reason") == "FailedScheduling"), None)
    event = wait_for(failed, f"a FailedScheduling Event on pod {pod}", timeout=20)
    expect(not (c.pod(pod).get("spec") or {}).get("nodeName"), f"pod {pod} should not be bound")
    # The webhook, the Event and explain say it in the same words.
    plainly = next((t.removeprefix("gpuready: request 'gpu': ") for t in warnings if "200 GiB" in t), "")
    expect(plainly in str(event.get("message")),
           f"the Event on pod {pod} should say what the webhook said ({plainly!r}); it says: {event.get('message')}")
    p.blank()
    p.lines([f"  Event on pod/{pod}: {event.get('type')} {event.get('reason')}:"] +
            [f"    {line}" for line in _wrap(str(event.get("message", "")), 94)])
    out = io.StringIO()
    args = argparse.Namespace(name=pod, namespace=NAMESPACE, kubeconfig=c.kubeconfig, policy="binpack",
                              controller="")  # the demo cluster has no explain Service: list it
    with contextlib.redirect_stdout(out):
        status = explain_command.run(args)
    report = out.getvalue().rstrip().splitlines()
    expect(status == 1, f"gpuready explain {pod} should exit 1 (cannot be allocated), exited {status}")
    expect(any("No allocation is possible" in line for line in report),
           f"gpuready explain {pod} should say no allocation is possible; said: {' | '.join(report[-3:])}")
    expect(any(line.strip() == plainly for line in report),
           f"gpuready explain {pod} should say {plainly!r}; said: {' | '.join(report[:5])}")
    p.blank()
    p.lines([f"  $ gpuready explain {pod} --kubeconfig {c.kubeconfig}"])
    p.wrapped(report[:18] + ([f"... ({len(report) - 18} more lines)"] if len(report) > 18 else []))
    p.done("Pending with a FailedScheduling Event; explain: no device has 200 GiB")


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width=width) or [""]


# --- 5. prepare -----------------------------------------------------------------------------------
def prepare(p: Printer, c: DemoCluster, state: StoryState) -> None:
    """The kubelet of each pod's node calls NodePrepareResources; show CDI IDs and a trimmed spec."""
    p.step("The kubelet prepares each pod's devices (NodePrepareResources -> CDI)", "prepare (CDI)")
    p.say("Each node's kubelet (the emulator) calls the plugin over gRPC for the pods bound to it. The "
          "plugin checks the claim's allocation, writes a CDI spec for the claim, records it in its "
          "checkpoint, and answers with CDI device IDs the container runtime injects. On node-b the MIG "
          "instance is created now (dynamic MIG).")
    rows = []
    for pod, pl in state.placements.items():
        node = c.nodes[pl.node]
        results = node.registered.prepare([(NAMESPACE, pl.claim_name, pl.claim_uid)])
        result = results.get(pl.claim_uid)
        expect(result is not None and result.ok, f"prepare of claim {pl.claim_name} on {pl.node} failed: "
                                                  f"{getattr(result, 'error', 'no answer')}")
        assert result is not None
        pl.prepared = [dict(d) for d in result.devices]
        for d in result.devices:
            expect(bool(d["cdi_device_ids"]), f"claim {pl.claim_name}: no CDI device ID for {d['device_name']}")
            rows.append((pod, pl.node, d["device_name"], ", ".join(d["cdi_device_ids"])))
        expect(os.path.exists(_spec_path(node, pl.claim_uid)), f"no CDI spec file for claim {pl.claim_name}")
    p.blank()
    p.table(["POD", "NODE", "DEVICE", "CDI DEVICE IDS"], rows)
    pl = state.placements["infer-15gi"]
    node = c.nodes[pl.node]
    with open(_spec_path(node, pl.claim_uid)) as f:
        spec = json.load(f)
    p.blank()
    p.lines([f"  CDI spec for claim {pl.claim_name} ({os.path.relpath(_spec_path(node, pl.claim_uid), c.workdir)}),"
             " trimmed:"] + ["    " + line for line in _trim_spec(spec)])
    mig_uuids = re.findall(r"MIG-[0-9a-f-]{36}", json.dumps(spec))
    if pl.node == "node-b":
        expect(bool(mig_uuids), f"the CDI spec of {pl.claim_name} should name the MIG instance created for it")
        p.blank()
        p.say(f"The MIG instance {mig_uuids[0]} was created for this claim at prepare time; it is destroyed "
              "again at unprepare.")
    p.done(f"{len(rows)} devices prepared on {len({pl.node for pl in state.placements.values()})} nodes, "
           "one CDI spec per claim")


def _spec_path(node: DemoNode, claim_uid: str) -> str:
    from kubelet_plugin.cdi.cdi_spec import spec_file_name

    return os.path.join(node.dirs.cdi, spec_file_name(DRIVER, claim_uid))


def _trim_spec(spec: dict[str, Any]) -> list[str]:
    """The spec's kind, device names and each device's first edits: enough to see what is injected."""
    lines = [f"cdiVersion: {spec.get('cdiVersion')}", f"kind: {spec.get('kind')}", "devices:"]
    for dev in spec.get("devices") or []:
        edits = dev.get("containerEdits") or {}
        lines.append(f"- name: {dev.get('name')}")
        env = edits.get("env") or []
        if env:
            lines.append("  env: " + ", ".join(env[:3]) + (" ..." if len(env) > 3 else ""))
        nodes = [n.get("path") for n in edits.get("deviceNodes") or []]
        if nodes:
            lines.append("  deviceNodes: " + ", ".join(str(n) for n in nodes[:4]) + (" ..." if len(nodes) > 4 else ""))
    common = spec.get("containerEdits") or {}
    if common:
        lines.append(f"containerEdits: {len(common.get('deviceNodes') or [])} device nodes, "
                     f"{len(common.get('mounts') or [])} driver mounts, {len(common.get('hooks') or [])} hooks")
    return lines
