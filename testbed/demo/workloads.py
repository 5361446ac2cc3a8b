"""The pods and claims of the demo, and what each one must get (checked by the story).

Each workload is what a user would ``kubectl apply``: a Pod that references a ResourceClaim or a
ResourceClaimTemplate, in the shapes of ``deploy/examples/`` but never under their names: the
cluster of ``gpuready demo --serve`` stays up for the user to apply those examples, and a demo
object of the same name would make ``kubectl apply`` patch it (a claim's spec is immutable).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dra_driver.quantity import parse_quantity

GIB = 1024**3
IMAGE = "nvcr.io/nvidia/cuda:12.9.0-base-ubuntu24.04"
MEMORY_CLASS = "vram.gpu.nvidia.com"


def _memory_selector(gib: int) -> list[dict[str, Any]]:
    return [{"cel": {"expression": f'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("{gib}Gi")) >= 0'}}]


def _memory_request(gib: int) -> dict[str, Any]:
    # What the admission webhook shapes into a best-fit firstAvailable list (the user asks for VRAM only).
    return {"requests": {"memory": f"{gib}Gi"}}


def _pod(name: str, claim_ref: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "main", "image": IMAGE, "command": ["nvidia-smi", "-L"],
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", **claim_ref}]}}


def _template(name: str, requests: list[dict[str, Any]], constraints: list[dict[str, Any]] | None = None
              ) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "default"}, "spec": {"spec": {"devices": devices}}}


def _claim(name: str, requests: list[dict[str, Any]], constraints: list[dict[str, Any]] | None = None
           ) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"}, "spec": {"devices": devices}}


def device_memory(device: dict[str, Any]) -> int:
    """A published device's memory in bytes (0 when it has none)."""
    value = ((device.get("capacity") or {}).get("memory") or {}).get("value")
    return int(parse_quantity(value)) if value else 0


def device_type(device: dict[str, Any]) -> str:
    """``gpu`` or ``mig``, from the published attribute."""
    return str(((device.get("attributes") or {}).get("type") or {}).get("string", "?"))


# An allocated device as the checks see it: (pool, published device JSON, allocation result).
Allocated = tuple[str, dict[str, Any], dict[str, Any]]


@dataclass(frozen=True)
class Workload:
    """A pod and its claim (or template), what it asks for in words, and the check of what it got."""

    pod: str
    asks: str
    objects: tuple[dict[str, Any], ...]
    check: Callable[[list[Allocated]], str | None] | None  # None: must not fit; returns a problem or None
    why: str = ""

    @property
    def fits(self) -> bool:
        """Whether the story expects an allocation."""
        return self.check is not None


def _one_mig_with(min_gib: int) -> Callable[[list[Allocated]], str | None]:
    def check(got: list[Allocated]) -> str | None:
        if len(got) != 1:
            return f"expected one device, got {len(got)}"
        _, dev, _ = got[0]
        if device_type(dev) != "mig":
            return f"expected a MIG device, got {dev['name']} ({device_type(dev)})"
        if device_memory(dev) < min_gib * GIB:
            return f"{dev['name']} has {device_memory(dev) / GIB:.1f} GiB, less than {min_gib} GiB"
        return None
    return check


def _one_device_with(min_gib: int) -> Callable[[list[Allocated]], str | None]:
    def check(got: list[Allocated]) -> str | None:
        if len(got) != 1:
            return f"expected one device, got {len(got)}"
        _, dev, _ = got[0]
        if device_memory(dev) < min_gib * GIB:
            return f"{dev['name']} has {device_memory(dev) / GIB:.1f} GiB, less than {min_gib} GiB"
        return None
    return check


def _gpus_on_one_node(count: int) -> Callable[[list[Allocated]], str | None]:
    def check(got: list[Allocated]) -> str | None:
        if len(got) != count:
            return f"expected {count} devices, got {len(got)}"
        if len({pool for pool, _, _ in got}) != 1:
            return "the GPUs are on different nodes: " + ", ".join(f"{p}/{d['name']}" for p, d, _ in got)
        if any(device_type(d) != "gpu" for _, d, _ in got):
            return "expected whole GPUs, got " + ", ".join(d["name"] for _, d, _ in got)
        return None
    return check


def _share_of_gpu(gib: int) -> Callable[[list[Allocated]], str | None]:
    def check(got: list[Allocated]) -> str | None:
        if len(got) != 1:
            return f"expected one device, got {len(got)}"
        _, dev, result = got[0]
        if not dev.get("allowMultipleAllocations"):
            return f"expected a shared GPU, got {dev['name']} (not shareable)"
        consumed = ((result.get("consumedCapacity") or {}).get("memory"))
        if consumed is None or int(parse_quantity(consumed)) < gib * GIB:
            return f"expected {gib} GiB of {dev['name']} to be consumed, got {consumed}"
        return None
    return check


def workloads() -> list[Workload]:
    """The story's workloads, in the order they are created."""
    vram = MEMORY_CLASS
    return [
        Workload("infer-15gi", "at least 15 GiB of VRAM (any GPU or MIG slice)",
                 (_template("vram-15gi", [{"name": "gpu", "exactly": {"deviceClassName": vram,
                                                                       "capacity": _memory_request(15)}}]),
                  _pod("infer-15gi", {"resourceClaimTemplateName": "vram-15gi"})),
                 _one_mig_with(15),
                 "the smallest device with 15 GiB is a MIG slice, not a whole 80-141 GiB GPU"),
        Workload("llm-70gi", "at least 70 GiB of VRAM",
                 (_template("vram-70gi", [{"name": "gpu", "exactly": {"deviceClassName": vram,
                                                                       "selectors": _memory_selector(70)}}]),
                  _pod("llm-70gi", {"resourceClaimTemplateName": "vram-70gi"})),
                 _one_device_with(70),
                 "an H100 (79.6 GiB) is the smallest fit; the H200s (140 GiB) stay free for bigger jobs"),
        Workload("train-2gpu", "two whole GPUs of one product on one node",
                 (_claim("train-2gpu-pair", [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}],
                         [{"requests": ["gpu"], "matchAttribute": "gpu.nvidia.com/productName"}]),
                  _pod("train-2gpu", {"resourceClaimName": "train-2gpu-pair"})),
                 _gpus_on_one_node(2),
                 "both GPUs on the node that is already busiest (binpack)"),
        Workload("notebook-20gi", "20 GiB of a shared GPU",
                 (_claim("notebook-share-20gi", [{"name": "gpu", "exactly": {
                     "deviceClassName": "gpu.nvidia.com",
                     "selectors": [{"cel": {"expression": "device.allowMultipleAllocations"}}],
                     "capacity": {"requests": {"memory": "20Gi"}}}}]),
                  _pod("notebook-20gi", {"resourceClaimName": "notebook-share-20gi"})),
                 _share_of_gpu(20),
                 "node-b's gpu-3 is shared: the claim consumes 20 GiB of its memory, others can take the rest"),
        Workload("giant-200gi", "at least 200 GiB of VRAM on one device",
                 (_template("vram-200gi", [{"name": "gpu", "exactly": {"deviceClassName": vram,
                                                                        "capacity": _memory_request(200)}}]),
                  _pod("giant-200gi", {"resourceClaimTemplateName": "vram-200gi"})),
                 None,
                 "no GPU in the cluster has 200 GiB"),
    ]
