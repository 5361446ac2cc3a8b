"""One quantity grammar everywhere: the table of testbed/quantity_samples.py fed to every reader.

The API server's answers are the table's; each gpuready component must agree with them: the shared
parser, the opaque config (MPS pinned memory), the planner's claim parsing, VRAM accounting and the
local API server's validation.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from controller.planning.parse import SpecError
from controller.planning.requests import parse_requests
from dra_driver.opaque_config import OpaqueConfigError, parse_config
from dra_driver.quantity import QuantityError, format_quantity, parse_quantity, parse_whole_quantity
from kubelet_plugin.metrics.vram_accounting import prepared_claim_from_api
from testbed.apiserver.validation.quantity import is_quantity
from testbed.quantity_samples import SAMPLES, QuantitySample

IDS = [repr(s.text) for s in SAMPLES]


@pytest.mark.parametrize("sample", SAMPLES, ids=IDS)
def test_the_shared_parser_accepts_what_the_api_server_accepts(sample: QuantitySample) -> None:
    if sample.value is None:
        with pytest.raises(QuantityError, match="is not a Kubernetes quantity"):
            parse_quantity(sample.text)
    else:
        assert parse_quantity(sample.text) == sample.value


@pytest.mark.parametrize("sample", SAMPLES, ids=IDS)
def test_the_local_api_server_validates_with_the_same_grammar(sample: QuantitySample) -> None:
    assert is_quantity(sample.text) is (sample.value is not None)


def _mps_limit(text: str) -> int | None:
    config = parse_config({"apiVersion": "gpu.nvidia.com/v1alpha1", "kind": "GpuConfig",
                           "sharing": {"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": text}}})
    assert config.config.sharing is not None
    return config.config.sharing.mps.pinned_memory_limit_bytes


@pytest.mark.parametrize("sample", SAMPLES, ids=IDS)
def test_opaque_config_sizes_accept_every_spelling_of_a_whole_number_of_bytes(sample: QuantitySample) -> None:
    value = sample.value
    if value is not None and value.denominator == 1 and value >= 1024**2:
        assert _mps_limit(sample.text) == value
        return
    with pytest.raises(OpaqueConfigError) as err:
        _mps_limit(sample.text)
    assert err.value.path.endswith("sharing.mps.defaultPinnedDeviceMemoryLimit")
    if value is not None and value.denominator == 1 and value >= 0:
        assert "is below 1Mi" in str(err.value)  # read fine; the MPS daemon's own minimum refuses it
    else:  # not a quantity, a fraction of a byte, or negative: says how to write one
        assert "is not a size in bytes" in str(err.value) and "20Gi" in str(err.value)


def _claim(memory: str) -> dict[str, object]:
    return {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "vram.gpu.nvidia.com", "capacity": {"requests": {"memory": memory}}}}]}}}


@pytest.mark.parametrize("sample", SAMPLES, ids=IDS)
def test_the_planner_reads_claim_capacity_requests_with_the_same_grammar(sample: QuantitySample) -> None:
    if sample.value is None:
        with pytest.raises(SpecError, match=r"spec\.devices\.requests\[0\]\.exactly\.capacity\.requests\[memory\]"):
            parse_requests(_claim(sample.text))
    else:
        requests, _ = parse_requests(_claim(sample.text))
        assert requests[0].alternatives[0].capacity["memory"] == sample.value


@pytest.mark.parametrize("sample", [s for s in SAMPLES if s.value is not None and s.value >= 0], ids=repr)
def test_vram_accounting_reads_consumed_capacity_with_the_same_grammar(sample: QuantitySample) -> None:
    claim = {"metadata": {"uid": "u", "name": "c", "namespace": "ns"}, "status": {"allocation": {"devices": {
        "results": [{"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0", "request": "gpu",
                     "consumedCapacity": {"memory": sample.text}}]}}}}
    prepared = prepared_claim_from_api(claim, "gpu.nvidia.com", "n1")
    assert sample.value is not None
    whole = -((-sample.value.numerator) // sample.value.denominator)  # a fraction of a byte rounds up
    # A share that consumed no memory (shares or unlimited mode, no memory asked) has no request: a
    # request of 0 bytes would make every process on it "use more VRAM than requested".
    assert prepared.requested_memory == ((("gpu-0", whole),) if whole else ())


def test_whole_quantities_name_what_is_wrong() -> None:
    assert parse_whole_quantity("1.5Gi") == 3 * 1024**3 // 2
    with pytest.raises(QuantityError, match="not a whole number"):
        parse_whole_quantity("1500m")
    with pytest.raises(QuantityError, match="below 0"):
        parse_whole_quantity("-1Gi")


@pytest.mark.parametrize(("value", "binary", "text"), [
    (40 * 1024**3, True, "40Gi"), (143771 * 1024**2, True, "143771Mi"), (1000, True, "1k"), (1000, False, "1k"),
    (1024, False, "1024"), (7, True, "7"), (0, True, "0"), (Fraction(3, 2), True, "1500m"),
    (Fraction(1, 3), True, "334m"),
])
def test_one_formatter_writes_the_api_servers_canonical_form(value: Fraction | int, binary: bool, text: str) -> None:
    assert format_quantity(value, binary) == text
    assert parse_quantity(text) >= value  # never rounded down
