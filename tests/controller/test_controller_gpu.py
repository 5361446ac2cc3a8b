"""The controller over a real GPU's slices: the webhook shapes a VRAM request by the memory NVML
reports, warns with the real product name, and the allocator's pick prepares on the real plugin.
Never changes GPU settings (whole GPUs or existing MIG devices only)."""

from __future__ import annotations

import functools
import re
import tempfile
from typing import Any

import pytest

from controller.api_client import CORE_V1, RESOURCE_V1, KubeApi, claim_path, pod_path
from controller.daemon import Controller, ControllerConfig
from kubelet_plugin.nvml import open_nvml
from testbed import waiting
from testbed.controller_harness import (
    ReviewClient,
    admission_review,
    apply_patch,
    install_device_classes,
    self_signed_cert,
)
from testbed.plugin_harness import PluginHarness

pytestmark = pytest.mark.gpu

NODE = "gpu-node"
VRAM = "vram.gpu.nvidia.com"


wait_for = functools.partial(waiting.wait_for, timeout=60.0)


def vram_template(memory: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "vram", "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": VRAM, "capacity": {"requests": {"memory": memory}}}}]}}}}


def test_real_gpu_shaped_allocated_and_prepared() -> None:
    tmp = tempfile.mkdtemp(prefix="gr-cg-", dir="/tmp")
    cert, key = self_signed_cert(tmp)
    with PluginHarness() as h:
        api = KubeApi(h.api_client)
        install_device_classes(api)
        plugin = h.start_plugin(NODE, open_nvml("real"), health_mode="off")
        published = wait_for("slices", lambda: api.request("GET", f"{RESOURCE_V1}/resourceslices")["items"])
        memories = {d["name"]: d["capacity"]["memory"]["value"] for s in published for d in s["spec"].get("devices", [])}
        assert memories, "the real GPU published no devices"
        ctrl = Controller(ControllerConfig(webhook_port=0, webhook_host="127.0.0.1", cert_file=cert, key_file=key,
                                           leader_elect=False, allocate=True, resync_s=2.0), h.api_client).start()
        try:
            assert ctrl.wait_ready(30)
            inv = wait_for("inventory", lambda: (i := ctrl.cache.inventory()) and i.devices and i)
            assert ctrl.webhook is not None
            client = ReviewClient(ctrl.webhook.url, cert)
            # Nothing on a real GPU has 100 TiB: the warning names the biggest real device and its memory.
            warn = client.post("/mutate", admission_review(vram_template("100Ti")))["response"]
            biggest = max(inv.devices.values(), key=lambda d: d.memory)
            assert "patch" not in warn and "100 TiB" in warn["warnings"][0]
            what = biggest.attr("profile") if biggest.attr("type") == "mig" else biggest.attr("productName")
            assert str(what) in warn["warnings"][0]
            # 1 GiB fits every device: the list's first tier holds the smallest real device.
            template = vram_template("1Gi")
            shaped = apply_patch(template, client.post("/mutate", admission_review(template))["response"])
            client.close()
            entries = shaped["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
            smallest = min(inv.devices.values(), key=lambda d: d.memory)
            first = entries[0]["selectors"][0]["cel"]["expression"]
            assert 'memory.compareTo(quantity("1Gi")) >= 0' in first
            ceiling = re.search(r'quantity\("(\d+)"\)\) <= 0', first)  # none: one tier, any size
            assert ceiling is None or int(ceiling.group(1)) >= smallest.memory, (first, smallest.memory)
            api.request("POST", f"{RESOURCE_V1}/namespaces/default/resourceclaimtemplates", body=shaped)
            api.request("POST", f"{CORE_V1}/namespaces/default/pods", body={
                "metadata": {"name": "real-job", "namespace": "default"},
                "spec": {"containers": [{"name": "c", "image": "x"}],
                         "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "vram"}]}})
            pod = wait_for("pod bound", lambda: (p := api.get(pod_path("default", "real-job"))) and p["spec"].get("nodeName") and p)
            assert pod["spec"]["nodeName"] == NODE
            claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
            claim = api.get(claim_path("default", claim_name))
            assert claim is not None
            [result] = claim["status"]["allocation"]["devices"]["results"]
            assert result["device"] in plugin.inventory.current().index
            uid = claim["metadata"]["uid"]
            kubelet = h.kubelet(NODE)
            prepared = kubelet.prepare([("default", claim_name, uid)])[uid]
            assert prepared.ok, prepared.error
            assert kubelet.unprepare([("default", claim_name, uid)]) == {uid: ""}
        finally:
            ctrl.stop()
