"""How long gpuready's controller takes from its start to ready over a fleet of N nodes (issue 44):
a micro-benchmark of its load path, no real API server.

The fleet is bench_fleet's (``fleet_slices``: gpuready's own slice builder over the simulated NVML
profiles, a quarter each of h100-static, h200-whole, h200-dynamic and h200-shared nodes, every GPU
with a UUID of its own) and N Nodes as bench_fleet makes them, each object with the metadata and
managed fields the API server adds. A stand-in list server in a process of its own serves them as
kube-apiserver does (``limit`` and ``continue`` pages of compact JSON, the whole list in one answer
without ``limit``, items without a kind of their own, watches that stay open, 404 for the rest),
from bytes prepared beforehand: so the figures are the controller's own work (HTTP,
decoding, parsing, the inventory build), with the server's CPU on the other core, as on a real
control plane; the real API server's own encoding of the list is not in them (bench_fleet's
``controller_at_scale`` has it).

Figures: wall time from starting ``python -m dra_driver controller`` (webhook off, no leader
election) until its ``/readyz`` answers 200, the CPU seconds the process had used by then, and its
own clock from the informers' start to the first inventory (what ``/readyz`` says); median of
``--runs``.

Run: ``python -m benchmarks.bench_controller_start [--nodes 5000] [--runs 3] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from benchmarks.bench_fleet import CLASS, fleet_slices, node_kinds
from benchmarks.common import BenchResult, report, summarize
from benchmarks.fleet_controller import cpu_seconds

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 5.0  # issue 44: start to ready at most 5 s at 5,000 nodes
_MANAGED = [{"manager": "gpuready", "operation": "Update", "apiVersion": "resource.k8s.io/v1",
             "time": "2026-12-06T21:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {".": {}}}}]


def _with_metadata(obj: dict[str, Any], i: int) -> dict[str, Any]:
    meta = obj.setdefault("metadata", {})
    meta.update({"uid": f"0b5e6c3a-0000-4000-8000-{i:012x}", "resourceVersion": str(1000 + i),
                 "creationTimestamp": "2026-12-06T21:00:00Z", "managedFields": _MANAGED})
    return obj


def fleet_objects(n: int) -> dict[str, list[bytes]]:
    """Each list path's objects as compact JSON, as the API server keeps them."""
    names = {f"fleet-{i:05d}": f"uid-{i:05d}" for i in range(n)}
    slices = [s for per_node in fleet_slices(names, node_kinds()).values() for s in per_node]
    nodes = [{"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "gpuready.e2e/fake": "true"}},
              "spec": {},
              "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "FakeNode", "message": "fleet bench"}],
                         "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                         "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}} for name in names]
    vram = yaml.safe_load((ROOT / "deploy/deviceclasses/vram.gpu.nvidia.com.yaml").read_text())

    def encoded(objs: list[dict[str, Any]]) -> list[bytes]:
        # As kube-apiserver lists a built-in kind: the items carry no kind or apiVersion of their own.
        return [json.dumps({k: v for k, v in _with_metadata(o, i).items() if k not in ("kind", "apiVersion")},
                           separators=(",", ":")).encode() for i, o in enumerate(objs)]

    return {"/apis/resource.k8s.io/v1/resourceslices": encoded(slices), "/api/v1/nodes": encoded(nodes),
            "/apis/resource.k8s.io/v1/deviceclasses": encoded([dict(CLASS), vram])}


class _ListHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        if query.get("watch") == "true":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            bookmark = b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"999999"}}}\n'
            self.wfile.write(b"%x\r\n%s\r\n" % (len(bookmark), bookmark))
            self.wfile.flush()
            time.sleep(float(query.get("timeoutSeconds", "300")))  # nothing changes: a quiet watch
            self.wfile.write(b"0\r\n\r\n")
            return
        items = self.server.objects.get(url.path)
        if items is None:
            if url.path.startswith(("/apis/resource.k8s.io/v1/", "/api/v1/")) and url.path.count("/") <= 4:
                items = []  # an empty collection (claims, pods, templates, taint rules)
            else:
                self._send(404, b'{"kind":"Status","code":404,"message":"not found"}')
                return
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or 0) or len(items) or 1
        end = start + limit
        token = str(end) if end < len(items) else ""
        body = (b'{"kind":"List","apiVersion":"v1","metadata":{"resourceVersion":"999999","continue":"'
                + token.encode() + b'"},"items":[' + b",".join(items[start:end]) + b"]}")
        self._send(200, body)

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # Events
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(201, b"{}")


class _Server(ThreadingHTTPServer):
    daemon_threads = True


def _serve(objects: dict[str, list[bytes]], port_out: Any) -> None:
    server = _Server(("127.0.0.1", 0), _ListHandler)
    server.objects = objects  # type: ignore[attr-defined]
    port_out.send(server.server_address[1])
    server.serve_forever()


def _ready(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.read().decode() if resp.status == 200 else None
    except Exception:
        return None


def first_reviews(url: str, ca_file: str, claims: int = 200, threads: int = 4) -> list[float]:
    """Milliseconds of each review of ``claims`` 20Gi VRAM claims sent as soon as the controller is
    ready, as the API server sends them: /mutate then /validate per claim, ``threads`` at a time, each
    thread on a kept-alive TLS connection of its own."""
    import concurrent.futures
    import http.client
    import ssl

    from testbed.controller_harness import admission_review

    host, port = urllib.parse.urlsplit(url).hostname or "127.0.0.1", urllib.parse.urlsplit(url).port
    context = ssl.create_default_context(cafile=ca_file)

    def one_thread(names: list[str]) -> list[float]:
        conn = http.client.HTTPSConnection(host, port, context=context, timeout=30)
        took = []
        try:
            for name in names:
                claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                         "metadata": {"name": name, "namespace": "bench"},
                         "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                             "deviceClassName": "vram.gpu.nvidia.com", "capacity": {"requests": {"memory": "20Gi"}}}}]}}}
                body = json.dumps(admission_review(claim)).encode()
                for path in ("/mutate", "/validate"):
                    t0 = time.perf_counter()
                    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                    conn.getresponse().read()
                    took.append((time.perf_counter() - t0) * 1000)
        finally:
            conn.close()
        return took

    names = [f"c-{i:05d}" for i in range(claims)]
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return [t for part in pool.map(one_thread, [names[i::threads] for i in range(threads)]) for t in part]


def start_to_ready(port: int, workdir: str, timeout: float = 300.0, webhook: bool = False
                   ) -> tuple[float, float | None, float, list[float]]:
    """Start the controller against the list server; (wall seconds to /readyz 200, its own clock,
    the CPU seconds it had used by then: on a shared machine, the figure other work moves least,
    and with ``webhook`` the milliseconds of the first reviews after ready: :func:`first_reviews`)."""
    kubeconfig = Path(workdir) / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "bench",
        "clusters": [{"name": "bench", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "bench", "user": {}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}]}))
    from testbed.realcluster.procs import free_port

    health, hook = free_port(), free_port()
    argv = [sys.executable, "-m", "dra_driver", "controller", "--kubeconfig", str(kubeconfig),
            "--health-port", str(health), "--bind-address", "127.0.0.1", "--no-leader-elect"]
    if webhook:
        from testbed.controller_harness import self_signed_cert

        cert, key = self_signed_cert(workdir)
        argv += ["--webhook-port", str(hook), "--webhook-cert", cert, "--webhook-key", key]
    else:
        argv += ["--webhook-port", "0"]
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.monotonic() - t0 < timeout:
            text = _ready(f"http://127.0.0.1:{health}/readyz")
            if text is not None:
                wall = time.monotonic() - t0
                found = re.search(r"ready ([0-9.]+) s after start", text)
                used = cpu_seconds(proc.pid)
                reviews = first_reviews(f"https://127.0.0.1:{hook}", cert) if webhook else []
                return wall, float(found.group(1)) if found else None, used, reviews
            if proc.poll() is not None:
                raise RuntimeError(f"the controller exited ({proc.returncode}) before it was ready")
            time.sleep(0.05)
        raise TimeoutError(f"not ready within {timeout:.0f} s")
    finally:
        proc.terminate()
        proc.wait(10)


def run(quick: bool = False, nodes: int | None = None, runs: int = 3, webhook: bool = False) -> list[BenchResult]:
    """Serve a fleet of ``nodes`` and start the controller ``runs`` times over it."""
    n = nodes or (100 if quick else 1000)
    objects = fleet_objects(n)
    megabytes = sum(len(b) for b in objects["/apis/resource.k8s.io/v1/resourceslices"]) / 1e6
    receive, send = multiprocessing.Pipe(duplex=False)
    server = multiprocessing.get_context("fork").Process(target=_serve, args=(objects, send), daemon=True)
    server.start()
    port = receive.recv()
    del objects
    walls: list[float] = []
    own: list[float] = []
    cpu: list[float] = []
    reviews: list[float] = []
    try:
        with tempfile.TemporaryDirectory() as workdir:
            for _ in range(runs):
                wall, mine, used, took = start_to_ready(port, workdir, webhook=webhook)
                walls.append(wall)
                cpu.append(used)
                reviews += took
                if mine is not None:
                    own.append(mine)
    finally:
        server.terminate()
        server.join(5)
    goal = f"<= {GOAL_S:g} s at 5,000 nodes" if n >= 5000 else ""
    out = [summarize(f"N={n}: controller process start -> /readyz 200 ({megabytes:.0f} MB of slices, list server "
                     "stand-in)", walls, unit="s", target=goal, median_max=GOAL_S if goal else None)]
    out.append(summarize(f"N={n}: controller CPU seconds from its start to ready", cpu, unit="s"))
    if reviews:
        out.append(summarize(f"N={n}: webhook reviews of the first 200 claims after ready (/mutate and /validate, "
                             "4 kept-alive TLS connections), client's clock", reviews, unit="ms",
                             target="p99 < 25 ms", p99_max=25.0))
    if own:
        out.append(summarize(f"N={n}: informers started -> first inventory, the controller's own clock", own, unit="s"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=None, help="fleet size (default 1000; --quick: 100)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--webhook", action="store_true",
                        help="serve the webhook too, and time 200 claims' reviews sent as soon as it is ready")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    report(run(args.quick, args.nodes, args.runs, args.webhook))


if __name__ == "__main__":
    main()
