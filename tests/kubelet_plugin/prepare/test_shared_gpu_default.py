"""A "whole GPU" claim never becomes a sliver of a shared GPU; claims that size by VRAM still pack.

The ``gpu.nvidia.com`` DeviceClass matches shared GPUs too, and a request that names no capacity
consumes the request policy's ``default`` (resource.k8s.io/v1 DeviceCapacity.requestPolicy), so the default of a
shared GPU's ``memory`` must be the whole GPU. Checked on the pure builder, and on the local API
server with the planner as the allocator (slices and claims written and read back over HTTP with
the real ``kubernetes`` client, allocations written through ``/status`` as a scheduler does).
"""

from __future__ import annotations

import json
import pathlib
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import yaml
from kubernetes import client

from controller.planning import allocate_and_reserve, build_inventory, explain
from dra_driver.devices import GIB, MIB, MigMode
from dra_driver.quantity import parse_quantity
from dra_driver.slices import SliceOptions, build_pool, shared_memory_policy
from kubelet_plugin.nvml import discover, open_nvml
from testbed.apiserver import LocalApiServer

DRIVER = "gpu.nvidia.com"
VRAM = "vram.gpu.nvidia.com"
H200 = 143771 * MIB  # what NVML reports for an H200 141GB: 140.4 GiB
CLASSES = [yaml.safe_load(p.read_text()) for p in sorted(
    (pathlib.Path(__file__).resolve().parents[3] / "deploy" / "deviceclasses").glob("*.yaml"))]


def _upstream_policy_problems(value: int, policy: dict[str, Any]) -> list[str]:
    """The checks kube-apiserver makes on a validRange requestPolicy (validateRequestPolicyRange)."""
    rng = policy["validRange"]
    default, minimum = parse_quantity(policy["default"]), parse_quantity(rng["min"])
    problems = []
    if minimum > value:
        problems.append("min is larger than capacity value")
    if default < minimum:
        problems.append("default is less than min")
    if default > value:
        problems.append("default is larger than capacity value")
    if "step" in rng:
        step = parse_quantity(rng["step"])
        if minimum + step > value:
            problems.append("one step is larger than capacity value")
        if (default - minimum) % step:
            problems.append("default is not a multiple of a given step from min")
    return problems


# ---- (a) the pure slice builder ---------------------------------------------------------------------


@pytest.mark.parametrize(("memory", "minimum", "step", "default"), [
    pytest.param(H200, GIB, GIB, 140 * GIB, id="h200-140.4GiB-to-140Gi"),
    pytest.param(81559 * MIB, GIB, GIB, 79 * GIB, id="h100-79.6GiB-to-79Gi"),
    pytest.param(H200, 2 * GIB, GIB, 140 * GIB, id="min-2Gi"),
    pytest.param(H200, GIB, 4 * GIB, 137 * GIB, id="step-4Gi-1+34x4"),
    pytest.param(80 * GIB, GIB, GIB, 80 * GIB, id="exact-multiple"),
])
def test_policy_default_is_the_whole_gpu_rounded_down_to_the_step(memory: int, minimum: int, step: int,
                                                                  default: int) -> None:
    policy = shared_memory_policy(memory, minimum, step)
    assert (policy.default, policy.min, policy.step) == (default, minimum, step)
    assert memory - policy.default < step  # what is left over is less than one step
    assert _upstream_policy_problems(memory, policy.to_k8s(binary=True)) == []


def test_a_gpu_smaller_than_min_plus_step_gets_its_exact_memory_and_no_step() -> None:
    policy = shared_memory_policy(1536 * MIB, GIB, GIB)
    assert (policy.default, policy.min, policy.step) == (1536 * MIB, GIB, None)
    assert _upstream_policy_problems(1536 * MIB, policy.to_k8s(binary=True)) == []
    tiny = shared_memory_policy(512 * MIB, GIB, GIB)  # min capped at the GPU
    assert (tiny.default, tiny.min, tiny.step) == (512 * MIB, 512 * MIB, None)
    with pytest.raises(ValueError, match="positive"):
        shared_memory_policy(H200, GIB, 0)


@pytest.mark.parametrize("profile", ["sim:h200-141gb", "sim:8xh100", "sim:a100-40gb", "sim:l40s-48gb"])
def test_published_shared_gpus_default_to_all_their_memory(profile: str) -> None:
    devices = discover(open_nvml(profile))
    slices = [s.to_k8s(1, None) for s in build_pool(devices, "n", DRIVER, SliceOptions(shared_gpus=True))]
    whole = {d["name"]: d for s in slices for d in s["spec"].get("devices", [])
             if d["attributes"]["type"]["string"] == "gpu"}
    # Every GPU published whole is shared (one whose MIG mode is on shows its MIG devices instead).
    assert whole and set(whole) == {g.name for g in devices.gpus if g.mig_mode != MigMode.ENABLED}
    for gpu in (g for g in devices.gpus if g.name in whole):
        dev = whole[gpu.name]
        assert dev["allowMultipleAllocations"] is True
        memory = dev["capacity"]["memory"]
        assert memory["requestPolicy"]["validRange"] == {"min": "1Gi", "step": "1Gi"}
        assert memory["requestPolicy"]["default"] == f"{gpu.memory_bytes // GIB}Gi", gpu.name
        assert _upstream_policy_problems(gpu.memory_bytes, memory["requestPolicy"]) == []


@pytest.mark.parametrize(("options", "memory"), [
    pytest.param(SliceOptions(shared_gpus=True), None, id="default-1Gi-steps"),
    pytest.param(SliceOptions(shared_gpus=True, shared_memory_min_bytes=4 * GIB,
                              shared_memory_step_bytes=512 * MIB), None, id="min-4Gi-step-512Mi"),
    pytest.param(SliceOptions(shared_gpus=True, shared_memory_step_bytes=3 * GIB), None, id="step-3Gi"),
    pytest.param(SliceOptions(shared_gpus=True), 1536 * MIB, id="tiny-gpu-no-step"),
])
def test_the_local_api_server_accepts_every_shared_policy(options: SliceOptions, memory: int | None) -> None:
    devices = discover(open_nvml("sim:8xh100"))
    if memory is not None:
        devices = replace(devices, gpus=tuple(replace(g, memory_bytes=memory) for g in devices.gpus))
    with LocalApiServer() as s:
        api = client.ResourceV1Api(s.api_client())
        for body in build_pool(devices, "node-v", DRIVER, options):
            api.create_resource_slice(body.to_k8s(1, None))  # a 422 would raise ApiException
        stored = [d for sl in json.loads(api.list_resource_slice(_preload_content=False).data)["items"]
                  for d in sl["spec"].get("devices", []) if d.get("allowMultipleAllocations")]
    assert len(stored) == 6  # gpu-0..5; gpu-6 and gpu-7 are in MIG mode (their MIG devices are published)
    for dev in stored:
        value = parse_quantity(dev["capacity"]["memory"]["value"])
        assert _upstream_policy_problems(int(value), dev["capacity"]["memory"]["requestPolicy"]) == []


# ---- (b) on the local API server, the planner as allocator ------------------------------------------


class Cluster:
    """One node whose only GPU (an H200) is shared, on the local API server."""

    def __init__(self, srv: LocalApiServer, namespace: str) -> None:
        self.api = srv.api_client()
        self.core = client.CoreV1Api(self.api)
        self.resource = client.ResourceV1Api(self.api)
        self.ns = namespace

    def publish(self, node: str) -> None:
        created = self.core.create_node({"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}})
        devices = discover(open_nvml(f"sim:h200-141gb@{node}"))
        for s in build_pool(devices, node, DRIVER, SliceOptions(shared_gpus=True)):
            self.resource.create_resource_slice(s.to_k8s(1, created.metadata.uid))

    def _json(self, resp: Any) -> Any:
        return json.loads(resp.data)["items"]

    def claim(self, name: str, device_class: str, memory: str | None = None) -> None:
        exactly: dict[str, Any] = {"deviceClassName": device_class}
        if memory is not None:
            exactly["capacity"] = {"requests": {"memory": memory}}
        self.resource.create_namespaced_resource_claim(self.ns, {
            "metadata": {"name": name}, "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}})

    def inventory(self) -> Any:
        """What the scheduler sees now, read back from the API server."""
        slices = self._json(self.resource.list_resource_slice(_preload_content=False))
        claims = self._json(self.resource.list_resource_claim_for_all_namespaces(_preload_content=False))
        classes = self._json(self.resource.list_device_class(_preload_content=False))
        return build_inventory(slices, claims, classes)

    def get(self, name: str) -> dict[str, Any]:
        resp = self.resource.read_namespaced_resource_claim(name, self.ns, _preload_content=False)
        out: dict[str, Any] = json.loads(resp.data)
        return out

    def allocate(self, name: str) -> tuple[dict[str, Any] | None, list[str]]:
        """Plan the claim against the cluster as it is and write the allocation (None when it does not fit)."""
        pod = {"metadata": {"name": f"pod-{name}", "uid": str(uuid.uuid4())}}
        out = allocate_and_reserve(self.get(name), self.inventory(), pod)
        if out.patch is None:
            return None, out.reasons
        self.resource.patch_namespaced_resource_claim_status(name, self.ns, out.patch)
        [result] = self.get(name)["status"]["allocation"]["devices"]["results"]
        return result, []

    def explain(self, name: str) -> str:
        return explain(self.get(name), self.inventory()).render()


@pytest.fixture
def srv() -> Iterator[LocalApiServer]:
    with LocalApiServer() as s:
        api = client.ResourceV1Api(s.api_client())
        for body in CLASSES:
            api.create_device_class(body)
        yield s


def _line(text: str, start: str) -> str:
    found = [line for line in text.splitlines() if line.strip().startswith(start)]
    assert found, f"no line starting {start!r} in:\n{text}"
    return found[0]


def test_a_plain_gpu_claim_takes_all_of_a_shared_gpu_and_nothing_else_fits_beside_it(srv: LocalApiServer) -> None:
    c = Cluster(srv, "default")
    c.publish("node-whole")
    c.claim("whole", DRIVER)  # deploy/examples/one-gpu.yaml: no capacity request
    result, reasons = c.allocate("whole")
    assert result is not None, reasons
    assert (result["pool"], result["device"]) == ("node-whole", "gpu-0")
    # The whole GPU (its memory rounded down to the 1 GiB step), never the 1 GiB minimum.
    assert result["consumedCapacity"] == {"memory": "140Gi"} and result["shareID"]
    # A 20 GiB VRAM claim, and a second plain claim, find no room on it, and explain says why.
    for name, device_class, memory in (("vram-20", VRAM, "20Gi"), ("whole-2", DRIVER, None)):
        c.claim(name, device_class, memory)
        result, reasons = c.allocate(name)
        assert result is None and reasons, name
        text = c.explain(name)
        line = _line(text, "excluded, too little shared memory left")
        needed = "20 GiB" if memory else "140 GiB"
        assert "gpu-0 on node-whole" in line, text
        assert f"(411 MiB of 140.4 GiB left, {needed} needed; used by default/whole)" in line, text
        assert "No allocation is possible now" in text


def test_vram_sized_claims_still_pack_on_one_shared_gpu(srv: LocalApiServer) -> None:
    c = Cluster(srv, "default")
    c.publish("node-pack")
    shares = []
    for name in ("a-20", "b-20"):
        c.claim(name, VRAM, "20Gi")
        result, reasons = c.allocate(name)
        assert result is not None, reasons
        shares.append(result)
    # Both on the node's one GPU, 20 GiB each, as distinct shares.
    assert {(r["pool"], r["device"]) for r in shares} == {("node-pack", "gpu-0")}
    assert [r["consumedCapacity"] for r in shares] == [{"memory": "20Gi"}] * 2
    assert shares[0]["shareID"] != shares[1]["shareID"]
    # Now a plain whole-GPU claim no longer fits on that GPU: 100.4 GiB left, 140 GiB needed.
    c.claim("whole", DRIVER)
    result, reasons = c.allocate("whole")
    assert result is None and reasons
    line = _line(c.explain("whole"), "excluded, too little shared memory left")
    assert "gpu-0 on node-pack" in line
    assert "(100.4 GiB of 140.4 GiB left, 140 GiB needed; used by default/a-20, default/b-20)" in line
    # More 20 GiB shares fit until the memory runs out: 7 x 20 GiB in all, then 0.4 GiB is left.
    for i in range(5):
        c.claim(f"more-{i}", VRAM, "20Gi")
        result, reasons = c.allocate(f"more-{i}")
        assert result is not None and result["device"] == "gpu-0", reasons
    c.claim("one-too-many", VRAM, "20Gi")
    assert c.allocate("one-too-many")[0] is None


@pytest.mark.gpu
def test_real_gpus_published_shared_default_to_their_whole_memory_and_the_server_accepts_them() -> None:
    devices = discover(open_nvml("real"))  # read-only: nothing on the GPU changes
    assert devices.gpus
    # Dynamic MIG mode publishes a shared GPU whole whatever its MIG mode, so every GPU is checked.
    options = SliceOptions(mig_mode="dynamic", shared_gpus=True)
    with LocalApiServer() as s:
        api = client.ResourceV1Api(s.api_client())
        for body in CLASSES:
            api.create_device_class(body)
        c = Cluster(s, "default")
        created = c.core.create_node({"metadata": {"name": "gpu-node"}})
        for sl in build_pool(devices, "gpu-node", DRIVER, options):
            api.create_resource_slice(sl.to_k8s(1, created.metadata.uid))  # a 422 would raise
        c.claim("whole", DRIVER, None)
        result, reasons = c.allocate("whole")
        assert result is not None, reasons
        gpu = next(g for g in devices.gpus if g.name == result["device"])
        assert parse_quantity(result["consumedCapacity"]["memory"]) == gpu.memory_bytes // GIB * GIB
        # Nothing else fits on that GPU now: a 1 GiB share lands on another GPU, or nowhere.
        c.claim("small", VRAM, "1Gi")
        small, _ = c.allocate("small")
        assert small is None or small["device"] != gpu.name
