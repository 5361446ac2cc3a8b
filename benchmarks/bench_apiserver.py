"""The local API server under the real kubernetes client: create/get/list latency, concurrent create
throughput and watch delivery latency (create sent -> event decoded by a watching client).

Objects are node-local ResourceSlices with 8 GPUs (the size gpuready publishes for an 8-GPU node). The
server is in the same process as the clients, on 127.0.0.1, so figures include both sides' Python cost.

The server's own write path is measured apart, with the largest slice gpuready writes (one of the four
device slices of an 8 x H200 dynamic-MIG pool, ~70 KB) sent as raw HTTP by a client that neither builds
nor decodes objects, to 4 open watches: PUT answered, and the event in every watcher's socket.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client, watch

from benchmarks.common import BenchResult, report, summarize
from testbed.apiserver import LocalApiServer
from testbed.apiserver.slice_samples import slice_body


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


def _mig_slice() -> dict[str, Any]:
    """The largest slice of the 8 x H200 dynamic-MIG pool bench_publish publishes."""
    from benchmarks.bench_publish import DRIVER, DYNAMIC, eight_h200
    from dra_driver.slices import build_pool

    slices = [s.to_k8s(1, None) for s in build_pool(eight_h200(), "big-node", DRIVER, DYNAMIC)]
    return max(slices, key=lambda o: len(json.dumps(o)))


def _server_write_path(srv: LocalApiServer, rounds: int) -> list[float]:
    """PUT the big slice at generation+1 (pre-encoded, answer not decoded) with 4 raw watchers open; each
    sample ends when every watcher has read the event's line."""
    conn = http.client.HTTPConnection(srv.host, srv.port)
    path = "/apis/resource.k8s.io/v1/resourceslices"
    body = _mig_slice()
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    stored = json.loads(conn.getresponse().read())
    name, rv = stored["metadata"]["name"], stored["metadata"]["resourceVersion"]
    lines = [0] * 4
    cond = threading.Condition()

    def watcher(i: int) -> None:
        wc = http.client.HTTPConnection(srv.host, srv.port)
        wc.request("GET", f"{path}?watch=true&resourceVersion={rv}&fieldSelector=metadata.name%3D{name}")
        resp = wc.getresponse()
        try:
            while resp.readline():
                with cond:
                    lines[i] += 1
                    cond.notify_all()
        except (OSError, ValueError, http.client.HTTPException):
            return

    for i in range(4):
        threading.Thread(target=watcher, args=(i,), daemon=True).start()
    time.sleep(0.2)
    samples = []
    for gen in range(2, rounds + 2):
        body["metadata"]["resourceVersion"] = rv
        body["spec"]["pool"]["generation"] = gen
        data = json.dumps(body).encode()
        t0 = time.perf_counter()
        conn.request("PUT", f"{path}/{name}", data, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        answer = resp.read()
        with cond:
            cond.wait_for(lambda gen=gen: min(lines) >= gen - 1, timeout=10)
        samples.append(_ms(t0))
        assert resp.status == 200, answer[:200]
        rv = json.loads(answer)["metadata"]["resourceVersion"]
    conn.close()
    return samples


def run(quick: bool = False) -> list[BenchResult]:
    """Measure; ``quick`` uses fewer objects."""
    n = 100 if quick else 500
    results: list[BenchResult] = []
    with LocalApiServer() as srv:
        api = client.ResourceV1Api(srv.api_client())
        create, get = [], []
        for i in range(n):
            t0 = time.perf_counter()
            api.create_resource_slice(slice_body(f"s-{i:05d}", node=f"node-{i:05d}", devices=8))
            create.append(_ms(t0))
        for i in range(n):
            t0 = time.perf_counter()
            api.read_resource_slice(f"s-{i:05d}")
            get.append(_ms(t0))
        results.append(summarize("create ResourceSlice (8 devices), kubernetes client", create,
                                 target="median < 10 ms", median_max=10.0))
        results.append(summarize("get ResourceSlice, kubernetes client", get,
                                 target="median < 5 ms", median_max=5.0))
        lst = []
        for _ in range(10 if quick else 30):
            t0 = time.perf_counter()
            items = api.list_resource_slice(field_selector=f"spec.nodeName=node-{n // 2:05d}").items
            lst.append(_ms(t0))
            assert len(items) == 1
        results.append(summarize(f"list with field selector over {n} slices", lst,
                                 target="median < 50 ms", median_max=50.0))
        full = []
        for _ in range(5 if quick else 15):
            t0 = time.perf_counter()
            assert len(api.list_resource_slice().items) == n
            full.append(_ms(t0))
        results.append(summarize(f"list all {n} slices (8 devices each), deserialised", full, target=""))

        # Concurrent creates from 4 client threads, each with its own connection pool.
        rates = []
        for rnd in range(3):
            per_thread = n // 4

            def worker(t: int, rnd: int = rnd, per_thread: int = per_thread) -> None:
                a = client.ResourceV1Api(srv.api_client())
                for j in range(per_thread):
                    a.create_resource_slice(slice_body(f"c{rnd}-{t}-{j}", node=f"cn-{t}", devices=8))

            t0 = time.perf_counter()
            with ThreadPoolExecutor(4) as ex:
                list(ex.map(worker, range(4)))
            rates.append(4 * per_thread / (time.perf_counter() - t0))
        rate = summarize("concurrent creates, 4 client threads", rates, unit="ops/s", target="median > 100 ops/s")
        results.append(dataclasses.replace(rate, met=rate.median > 100))

        # Watch delivery: time from the write returning to the watcher receiving the event.
        received: dict[str, float] = {}
        ready = threading.Event()
        rv = api.list_resource_slice(limit=1).metadata.resource_version
        w = watch.Watch()

        def watcher() -> None:
            wa = client.ResourceV1Api(srv.api_client())
            ready.set()
            for ev in w.stream(wa.list_resource_slice, resource_version=rv, timeout_seconds=120):
                received[ev["raw_object"]["metadata"]["name"]] = time.perf_counter()

        th = threading.Thread(target=watcher, daemon=True)
        th.start()
        ready.wait()
        time.sleep(0.2)
        sent: dict[str, float] = {}
        m = 100 if quick else 300
        for i in range(m):
            name = f"w-{i}"
            sent[name] = time.perf_counter()
            api.create_resource_slice(slice_body(name, node="wn", devices=8))
            time.sleep(0.002)
        deadline = time.monotonic() + 30
        while len([k for k in sent if k in received]) < m and time.monotonic() < deadline:
            time.sleep(0.01)
        # End the stream from the server side (Watch.stop() shuts the socket down under the reader).
        srv.faults.drop_watches()
        th.join(timeout=10)
        delivery = [max(0.0, (received[k] - sent[k]) * 1000) for k in sent if k in received]
        results.append(summarize("watch delivery (create sent -> event decoded by a watcher)", delivery,
                                 target="p99 < 50 ms", p99_max=50.0))
        results.append(summarize("server write path: PUT a 70 KB MIG ResourceSlice (64 devices) raw, event "
                                 "read by 4 watchers", _server_write_path(srv, 20 if quick else 100),
                                 target="median < 10 ms", median_max=10.0))
    return results


if __name__ == "__main__":
    report(run(quick="--quick" in sys.argv))
