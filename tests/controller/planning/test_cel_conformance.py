"""The DRA CEL environment gives the results the Kubernetes documentation gives.

Examples come from the Kubernetes DRA documentation (ResourceClaim / DeviceClass selectors), the
Kubernetes CEL library documentation (quantity and semver libraries) and the NVIDIA DRA driver's
documented selectors, each with the documented result for the device described.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from controller.planning.cel import compile_selector
from controller.planning.cel_types import CelSemver
from controller.planning.device_view import DeviceView

GIB = 1024**3


def _device(driver: str, attrs: dict[str, object], capacity: dict[str, int], multi: bool = False) -> DeviceView:
    return DeviceView(
        driver=driver,
        pool="node-1",
        name="gpu-0",
        node="node-1",
        attributes={k if "/" in k else f"{driver}/{k}": v for k, v in attrs.items()},  # type: ignore[misc]
        capacity={k if "/" in k else f"{driver}/{k}": Fraction(v) for k, v in capacity.items()},
        allow_multiple_allocations=multi,
    )


# A device like the ones in the Kubernetes documentation's examples.
EXAMPLE = _device(
    "driver.example.com",
    {"model": "A100", "type": "gpu", "sharing": True, "mig": False, "driverVersion": CelSemver.parse("1.3.0"),
     "resource.kubernetes.io/pcieRoot": "pci0000:00"},
    {"memory": 80 * GIB},
)
NVIDIA = _device(
    "gpu.nvidia.com",
    {"type": "gpu", "productName": "NVIDIA H100 80GB HBM3", "architecture": "Hopper",
     "cudaComputeCapability": CelSemver.parse("9.0.0"), "driverVersion": CelSemver.parse("580.95.5")},
    {"memory": 81559 * 1024**2},
)
LISTS = _device("driver.example.com", {"resource.kubernetes.io/numaNode": (0, 1)}, {})

DOCUMENTED = [
    # the kube-scheduler's DRA CEL environment (Kubernetes DRA docs)
    (EXAMPLE, 'device.driver == "driver.example.com"', True),
    (EXAMPLE, 'device.driver == "gpu.example.com"', False),
    (EXAMPLE, 'device.attributes["driver.example.com"].model == "A100"', True),
    (EXAMPLE, 'device.attributes["driver.example.com"]["model"] == "A100"', True),
    (EXAMPLE, 'device.capacity["driver.example.com"].memory.compareTo(quantity("40Gi")) >= 0', True),
    (EXAMPLE, 'device.capacity["driver.example.com"].memory.compareTo(quantity("100Gi")) >= 0', False),
    (EXAMPLE, 'device.attributes["driver.example.com"].driverVersion.isGreaterThan(semver("1.2.0"))', True),
    (EXAMPLE, 'cel.bind(g, device.attributes["driver.example.com"], g.sharing && g.mig)', False),
    (EXAMPLE, 'cel.bind(g, device.attributes["driver.example.com"], g.sharing && !g.mig)', True),
    (EXAMPLE, 'device.attributes["driver.example.com"].type == "gpu" && '
              'device.capacity["driver.example.com"].memory.compareTo(quantity("64Gi")) >= 0', True),
    (EXAMPLE, 'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00"', True),
    # NVIDIA DRA driver documentation
    (NVIDIA, 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"', True),
    (NVIDIA, 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0', True),
    (NVIDIA, 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) >= 0', False),
    (NVIDIA, 'device.attributes["gpu.nvidia.com"].architecture == "Hopper"', True),
    (NVIDIA, 'device.attributes["gpu.nvidia.com"].cudaComputeCapability.isGreaterThan(semver("8.0.0"))', True),
    (NVIDIA, "device.attributes['gpu.nvidia.com'].productName.matches('H100')", True),
    # Kubernetes CEL quantity library documentation
    (EXAMPLE, 'isQuantity("1.3G")', True),
    (EXAMPLE, 'isQuantity("1.3Gi")', True),
    (EXAMPLE, 'isQuantity("1,3G")', False),
    (EXAMPLE, 'quantity("50k").asInteger() == 50000', True),
    (EXAMPLE, 'quantity("200M").compareTo(quantity("0.2G")) == 0', True),
    (EXAMPLE, 'quantity("50k").add(quantity("20k")) == quantity("70k")', True),
    (EXAMPLE, 'quantity("50k").sub(20000) == quantity("30k")', True),
    (EXAMPLE, 'quantity("50k").add(20).isGreaterThan(quantity("50k"))', True),
    (EXAMPLE, 'quantity("50k").isLessThan(quantity("100M"))', True),
    (EXAMPLE, 'quantity("1.5G").asApproximateFloat() == 1500000000.0', True),
    (EXAMPLE, 'quantity("1.5").isInteger()', False),
    (EXAMPLE, 'quantity("-5").sign() == -1', True),
    # Kubernetes CEL semver library documentation
    (EXAMPLE, 'isSemver("1.0.0")', True),
    (EXAMPLE, 'isSemver("v1.0")', False),
    (EXAMPLE, 'isSemver("v1.0", true)', True),
    (EXAMPLE, 'semver("1.0.0").major() == 1', True),
    (EXAMPLE, 'semver("1.2.3").minor() == 2 && semver("1.2.3").patch() == 3', True),
    (EXAMPLE, 'semver("1.2.3").isLessThan(semver("1.3.0"))', True),
    (EXAMPLE, 'semver("1.2.3").compareTo(semver("2.0.0")) == -1', True),
    (EXAMPLE, 'semver("1.0.0-alpha").isLessThan(semver("1.0.0"))', True),
    (EXAMPLE, 'semver("1.0.0-alpha.1").isLessThan(semver("1.0.0-alpha.beta"))', True),
    (EXAMPLE, 'semver("1.0.0+build.5") == semver("1.0.0")', True),
    # Standard CEL and the extended strings library
    (EXAMPLE, '"model" in device.attributes["driver.example.com"]', True),
    (EXAMPLE, 'has(device.attributes["driver.example.com"].serial)', False),
    (EXAMPLE, 'has(device.attributes["other.example.com"].model)', False),
    (EXAMPLE, 'device.attributes["driver.example.com"].model.lowerAscii() == "a100"', True),
    (EXAMPLE, '"a,b".split(",").size() == 2', True),
    (EXAMPLE, '["A100", "H100"].exists(m, m == device.attributes["driver.example.com"].model)', True),
    (EXAMPLE, "device.allowMultipleAllocations", False),
    # DRA list-type attributes (1.36+): includes() on a list, and on a scalar as a one-element list
    (LISTS, 'device.attributes["resource.kubernetes.io"].numaNode.includes(1)', True),
    (LISTS, 'device.attributes["resource.kubernetes.io"].numaNode.includes(3)', False),
    (EXAMPLE, 'device.attributes["driver.example.com"].model.includes("A100")', True),
]


@pytest.mark.parametrize(("device", "expression", "expected"), DOCUMENTED, ids=[e for _, e, _ in DOCUMENTED])
def test_documented_result(device: DeviceView, expression: str, expected: bool) -> None:
    result = compile_selector(expression).evaluate(device)
    assert result.error is None, result.error
    assert result.matched is expected


def test_unknown_attribute_is_a_runtime_error_that_does_not_match() -> None:
    # Kubernetes: an unknown key inside a known domain is "no such key" and the device does not match.
    result = compile_selector('device.attributes["driver.example.com"].serial == "x"').evaluate(EXAMPLE)
    assert result.matched is False
    assert result.error is not None and "no such key" in result.error and "serial" in result.error


def test_unknown_domain_is_an_empty_map() -> None:
    # Kubernetes: an unknown domain gives an empty map, so lookups inside it fail (not the domain).
    result = compile_selector('device.attributes["other.example.com"].model == "A100"').evaluate(EXAMPLE)
    assert result.matched is False and result.error is not None and "model" in result.error
    assert compile_selector('device.attributes["other.example.com"].size() == 0').matches(EXAMPLE)
