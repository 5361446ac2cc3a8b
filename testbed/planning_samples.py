"""Sample published objects for tests, benchmarks and the demo: not part of the planning engine.

Builders of raw Kubernetes JSON (ResourceSlices, claims, classes), so a test or benchmark can plan
against a cluster without running one.

They write exactly what the API server would return (camelCase dicts), in gpuready's vocabulary
(docs/architecture.md): whole GPUs ``gpu-<minor>`` and MIG devices
``gpu-<minor>-mig-<profile>-<giProfileId>-<start>`` with ``memory`` capacity in bytes.
"""

from __future__ import annotations

from typing import Any

from dra_driver.devices import GIB, MIB, dns_safe_profile

DRIVER = "gpu.nvidia.com"

# (profile, giProfileId, memory MiB, memory slices, compute slices, placement starts)
H100_MIG = (
    ("1g.10gb", 19, 9856, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
    ("1g.20gb", 15, 19968, 2, 1, (0, 2, 4, 6)),
    ("2g.20gb", 14, 19968, 2, 2, (0, 2, 4)),
    ("3g.40gb", 9, 40192, 4, 3, (0, 4)),
    ("4g.40gb", 5, 40192, 4, 4, (0,)),
    ("7g.80gb", 0, 80768, 8, 7, (0,)),
)
H100_MEMORY = 81559 * MIB  # what NVML reports for an "80GB" H100: 79.6 GiB
H200_MEMORY = 143771 * MIB  # 140.4 GiB


def gpu_device(minor: int, memory: int = H100_MEMORY, product: str = "NVIDIA H100 80GB HBM3",
               node: str = "node", shared: bool = False, taints: list[dict[str, Any]] | None = None,
               **extra: Any) -> dict[str, Any]:
    """A whole GPU; ``shared`` makes it multi-allocatable with memory as consumable capacity."""
    attrs: dict[str, Any] = {
        "type": {"string": "gpu"},
        "uuid": {"string": f"GPU-{node}-{minor:04d}"},
        "productName": {"string": product},
        "architecture": {"string": "Hopper"},
        "minor": {"int": minor},
        "index": {"int": minor},
        "driverVersion": {"version": "580.95.5"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{minor // 2:02x}"},  # two GPUs per root
    }
    attrs.update({k: v for k, v in extra.items()})
    capacity: dict[str, Any] = {"memory": {"value": str(memory)}}
    dev: dict[str, Any] = {"name": f"gpu-{minor}", "attributes": attrs, "capacity": capacity}
    if shared:
        dev["allowMultipleAllocations"] = True
        # As the plugin publishes it: a request that names no memory takes the whole GPU (stepped).
        default = memory // GIB * GIB
        capacity["memory"]["requestPolicy"] = {"default": str(default),
                                               "validRange": {"min": str(GIB), "step": str(GIB)}}
    if taints:
        dev["taints"] = taints
    return dev


def mig_device(minor: int, profile: str, gi_profile_id: int, memory_mib: int, start: int, node: str = "node",
               memory_slices: int | None = None, compute_slices: int | None = None,
               counter_set: str | None = None) -> dict[str, Any]:
    """A MIG device (static) or placement (dynamic, when ``counter_set`` is given)."""
    dev: dict[str, Any] = {
        "name": f"gpu-{minor}-mig-{dns_safe_profile(profile)}-{gi_profile_id}-{start}",
        "attributes": {
            "type": {"string": "mig"},
            "profile": {"string": profile},
            "parentUUID": {"string": f"GPU-{node}-{minor:04d}"},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "giProfileId": {"int": gi_profile_id},
            "placementStart": {"int": start},
            "minor": {"int": minor},
        },
        "capacity": {"memory": {"value": str(memory_mib * MIB)}},
    }
    if counter_set is not None:
        counters = {f"memory-slice-{i}": {"value": "1"} for i in range(start, start + (memory_slices or 1))}
        counters["compute-slices"] = {"value": str(compute_slices or 1)}
        dev["consumesCounters"] = [{"counterSet": counter_set, "counters": counters}]
    return dev


def gpu_counter_set(minor: int) -> dict[str, Any]:
    """The counter set of one MIG-capable GPU: 8 memory slices and 7 compute slices."""
    counters = {f"memory-slice-{i}": {"value": "1"} for i in range(8)}
    counters["compute-slices"] = {"value": "7"}
    return {"name": f"gpu-{minor}-counters", "counters": counters}


def dynamic_mig_devices(minor: int, node: str) -> list[dict[str, Any]]:
    """Every H100 MIG profile x placement of one GPU, consuming the GPU's counter set."""
    return [
        mig_device(minor, prof, gid, mem, start, node, mslices, cslices, counter_set=f"gpu-{minor}-counters")
        for prof, gid, mem, mslices, cslices, starts in H100_MIG
        for start in starts
    ]


def resource_slice(node: str, devices: list[dict[str, Any]] | None = None,
                   counter_sets: list[dict[str, Any]] | None = None, generation: int = 1,
                   slice_count: int = 1, index: int = 0, driver: str = DRIVER) -> dict[str, Any]:
    """A node-local ResourceSlice (pool name = node name)."""
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": node, "generation": generation, "resourceSliceCount": slice_count},
        "nodeName": node,
    }
    if devices is not None:
        spec["devices"] = devices
    if counter_sets is not None:
        spec["sharedCounters"] = counter_sets
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{index:05x}-{driver}-{node}"},
        "spec": spec,
    }


def device_class(name: str = DRIVER, expressions: tuple[str, ...] | None = None,
                 config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A DeviceClass selecting the driver's devices (plus any extra expressions)."""
    exprs = expressions if expressions is not None else (f'device.driver == "{DRIVER}"',)
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": e}} for e in exprs]}
    if config:
        spec["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def claim(name: str, requests: list[dict[str, Any]], namespace: str = "default",
          constraints: list[dict[str, Any]] | None = None, allocation: dict[str, Any] | None = None,
          uid: str | None = None, config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A ResourceClaim; ``allocation`` makes it an allocated one."""
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{namespace}-{name}"},
        "spec": {"devices": devices},
    }
    if allocation is not None:
        obj["status"] = {"allocation": allocation}
    return obj


def exactly(name: str = "gpu", device_class_name: str = DRIVER, selectors: tuple[str, ...] = (),
            count: int | None = None, memory: str | None = None, **more: Any) -> dict[str, Any]:
    """An ``exactly`` request."""
    body: dict[str, Any] = {"deviceClassName": device_class_name}
    if selectors:
        body["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if count is not None:
        body["count"] = count
    if memory is not None:
        body["capacity"] = {"requests": {"memory": memory}}
    body.update(more)
    return {"name": name, "exactly": body}


def allocated(node: str, *devices: str, driver: str = DRIVER, request: str = "gpu",
              **result_fields: Any) -> dict[str, Any]:
    """The ``status.allocation`` of a claim holding ``devices`` on ``node``."""
    return {
        "devices": {
            "results": [
                {"request": request, "driver": driver, "pool": node, "device": d, **result_fields} for d in devices
            ]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
        },
    }
