"""Older clusters: a server that drops fields of features it has switched off (1.34/1.35 defaults).

The local API server keeps every field, so this uses a stand-in that behaves like a kube-apiserver
with DRADeviceTaints off: it silently drops device taints on write.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from typing import Any

import pytest

from dra_driver.slices import SliceOptions, build_pool
from kubelet_plugin.kubelet.slice_publisher import SlicePublisher
from kubelet_plugin.kubelet.slice_requests import ApiError
from testbed.device_samples import eight_h200

DRIVER = "gpu.nvidia.com"
NODE = "node-old"


class TaintlessServer:
    """Keeps slices like an API server whose DRADeviceTaints gate is off."""

    def __init__(self) -> None:
        self.objs: dict[str, dict[str, Any]] = {}
        self.writes = 0
        self.rv = 0
        self.lock = threading.Lock()

    def request(self, method: str, path: str, query: Any = None, body: Any = None) -> Any:
        with self.lock:
            if method == "GET" and path.endswith("/resourceslices"):
                return {"metadata": {"resourceVersion": str(self.rv)},
                        "items": copy.deepcopy(list(self.objs.values()))}
            if method == "GET":
                return {"metadata": {"name": NODE, "uid": "uid-1"}}
            if method in ("POST", "PUT"):
                obj = json.loads(json.dumps(body))
                for device in obj["spec"].get("devices", []):
                    device.pop("taints", None)
                self.rv += 1
                obj["metadata"]["resourceVersion"] = str(self.rv)
                self.objs[obj["metadata"]["name"]] = obj
                self.writes += 1
                return copy.deepcopy(obj)
            self.objs.pop(path.rsplit("/", 1)[-1], None)
            return {}

    def open_stream(self, path: str, query: Any, read_timeout: float) -> Any:
        raise ApiError("GET", path, 405, "no watch here")


def test_dropped_taints_are_reported_once_and_not_rewritten_forever(caplog: pytest.LogCaptureFixture) -> None:
    server = TaintlessServer()
    pub = SlicePublisher(None, NODE, DRIVER, resync_seconds=60.0)
    pub._http = server  # type: ignore[assignment]
    pub._watch.informer.api = server  # type: ignore[assignment]
    caplog.set_level(logging.ERROR, logger="kubelet_plugin.kubelet.slice_publisher")
    pub.start()
    try:
        pub.set_desired(build_pool(eight_h200(), NODE, DRIVER, SliceOptions(health_mode="taint"),
                                   unhealthy={"gpu-1": "XID 79"}))
        assert pub.wait_until_synced(10)
        writes = server.writes
        for _ in range(3):
            passes = pub.stats().passes
            pub.resync()
            for _ in range(200):
                if pub.stats().passes > passes:
                    break
                time.sleep(0.05)
            assert pub.stats().passes > passes
        assert server.writes == writes  # adopted what the server kept: no write loop
    finally:
        pub.stop()
    dropped = [r for r in caplog.records if r.getMessage() == "slice_fields_dropped"]
    assert len(dropped) == 1
    assert dropped[0].kv["feature_gates"] == "DRADeviceTaints"  # type: ignore[attr-defined]
