"""gpuready's controller over a whole fleet on the real control plane (issue 28; run by bench_fleet).

With the fleet of :mod:`benchmarks.bench_fleet` in place and the pods of its scenarios bound:

- the controller's resident memory and CPU seconds once it has read the fleet, and again after
  5,000 more ResourceClaims (the informers keep every claim of the cluster);
- the admission latency of its mutating webhook, as the API server measures it
  (``apiserver_admission_webhook_admission_duration_seconds``) and as the controller does
  (``gpuready_controller_webhook_duration_seconds``), bucket bounds of p50 / p99;
- ``kubectl gpuready explain`` for a claim no device can hold (200Gi of VRAM): wall time of the
  command, a fresh process as a user runs it, answered by the running controller through the API
  server's service proxy, and (for comparison) by listing the whole fleet itself;
- a device fault reaching the pod: the device is withdrawn from its node's ResourceSlice, as the
  kubelet plugin withdraws an unhealthy GPU, and the time until the Warning Event ``DeviceUnhealthy``
  on the pod that holds it is seen through a watch.

The numbers are bucket bounds where they come from histograms (their buckets are coarse); n = 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult, summarize

_API_HOOK = "apiserver_admission_webhook_admission_duration_seconds"
_OUR_HOOK = "gpuready_controller_webhook_duration_seconds"
CLAIMS_AT_SCALE = 5000


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """Resident memory of a process, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def histogram(text: str, family: str, labels: dict[str, str]) -> dict[float, float]:
    """Cumulative bucket counts (upper bound -> count) of one histogram family, summed over the
    series whose labels include ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    buckets: dict[float, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != family:
            continue
        for s in fam.samples:
            if s.name.endswith("_bucket") and all(s.labels.get(k) == v for k, v in labels.items()):
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
    return buckets


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """The upper bound (seconds) of the bucket holding the q-quantile (0..1) of what was counted
    between two readings of a cumulative histogram."""
    bounds = sorted(after)
    delta = [after[b] - before.get(b, 0.0) for b in bounds]
    total = delta[-1] if delta else 0.0
    for bound, count in zip(bounds, delta, strict=True):
        if total and count >= q * total:
            return bound
    return float("nan")


class WebhookLatency:
    """Two readings of the API server's and the controller's webhook histograms around some creates."""

    def __init__(self, cluster: Any, controller_metrics_url: str, hook_name: str) -> None:
        self.cluster = cluster
        self.url = controller_metrics_url
        self.labels = {"name": hook_name, "type": "admit", "operation": "CREATE"}
        self.before = self._read()

    def _read(self) -> tuple[dict[float, float], dict[float, float]]:
        import urllib.request

        api = self.cluster.https_get(f"{self.cluster.api_url}/metrics", timeout=60).decode()
        with urllib.request.urlopen(self.url, timeout=10) as resp:
            ours = resp.read().decode()
        return (histogram(api, _API_HOOK, self.labels),
                histogram(ours, _OUR_HOOK, {"webhook": "mutate", "kind": "ResourceClaim"}))

    def results(self, prefix: str) -> list[BenchResult]:
        """p50 / p99 bucket bounds of each side since construction."""
        after = self._read()
        out = []
        for (before, now), who in zip(zip(self.before, after, strict=True),
                                      ("the API server's admission metric", "the controller's own metric"),
                                      strict=True):
            n = int(max(now.values(), default=0) - max(before.values(), default=0))
            p50, p99 = (bucket_quantile(before, now, q) * 1000 for q in (0.5, 0.99))
            out.append(BenchResult(name=f"{prefix}: mutating webhook latency per claim, {who} (bucket bound)",
                                   unit="ms", n=n, median=p50, p95=float("nan"), p99=p99,
                                   machine=summarize("x", [0.0]).machine))
        return out


def explain_seconds(cluster: Any, namespace: str, claim: str, root: Path, via_controller: bool = True) -> float:
    """Wall time of ``kubectl gpuready explain`` for one claim, a fresh process as a user runs it:
    answered by the controller through the API server's service proxy (``via_controller``; fails
    if the command fell back to listing), or by listing the whole fleet (``--controller ''``)."""
    argv = [sys.executable, "-m", "controller.kubectl_plugin", "explain", f"resourceclaim/{claim}", "-n", namespace,
            "--kubeconfig", cluster.kubeconfig]
    t0 = time.monotonic()
    out = subprocess.run(argv if via_controller else [*argv, "--controller", ""], capture_output=True, text=True,
                         timeout=300, cwd=str(root), check=False)
    took = time.monotonic() - t0
    if "200 GiB" not in out.stdout or (via_controller and "did not answer" in out.stderr):
        raise RuntimeError(f"gpuready explain did not say why 200 GiB cannot fit{' from the controller' * via_controller} "
                           f"(rc {out.returncode}): {out.stdout[-600:]} {out.stderr[-600:]}")
    return took


def explain_service(bench: Any, health_port: int) -> None:
    """The chart's explain Service (``gpuready/gpuready-controller-explain``, port ``explain``) for the
    controller running on this host (``testbed/realcluster/host_service.py``)."""
    from testbed.realcluster.host_service import expose_on_this_host

    expose_on_this_host(bench.core.api_client, "gpuready", "gpuready-controller-explain", "explain", health_port)


def fault_to_event_seconds(bench: Any, namespace: str, pod: str, timeout: float = 120.0) -> float:
    """Withdraw the device a bound pod's claim holds from its node's slice (as the plugin withdraws an
    unhealthy GPU) and return the seconds until the pod's ``DeviceUnhealthy`` Event is seen."""
    core, resource = bench.core, bench.resource
    spec = core.read_namespaced_pod(pod, namespace).spec
    claim_name = spec.resource_claims[0].resource_claim_name
    [result] = resource.read_namespaced_resource_claim(claim_name, namespace).status.allocation.devices.results
    node, device = result.pool, result.device
    [owner] = [s for s in resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items
               if any(d.name == device for d in (s.spec.devices or []))]
    body = resource.api_client.sanitize_for_serialization(owner)
    body["spec"]["devices"] = [d for d in body["spec"]["devices"] if d["name"] != device]
    since = core.list_namespaced_event(namespace).metadata.resource_version
    t0 = time.monotonic()
    resource.replace_resource_slice(owner.metadata.name, body)
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        resp = core.list_namespaced_event(namespace, watch=True, resource_version=since, _preload_content=False,
                                          timeout_seconds=max(1, int(deadline - time.monotonic())))
        try:
            for line in resp:
                obj = json.loads(line).get("object", {})
                since = obj.get("metadata", {}).get("resourceVersion", since)
                if obj.get("reason") == "DeviceUnhealthy" and (obj.get("involvedObject") or {}).get("name") == pod:
                    return time.monotonic() - t0
        finally:
            resp.release_conn()
    raise TimeoutError(f"no DeviceUnhealthy Event on {namespace}/{pod} within {timeout:.0f} s of withdrawing "
                       f"{node}/{device}")


def create_claims(bench: Any, namespace: str, count: int, request: dict[str, Any]) -> float:
    """Create ``count`` claims of one request in a new namespace; seconds it took."""
    bench.core.create_namespace({"metadata": {"name": namespace}})
    names = [f"c-{i:05d}" for i in range(count)]
    t0 = time.monotonic()
    bench._parallel(lambda n: bench.resource.create_namespaced_resource_claim(namespace, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": n},
        "spec": {"devices": {"requests": [request]}}}), names)
    return time.monotonic() - t0
