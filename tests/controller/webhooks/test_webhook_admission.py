"""The admission webhooks over real HTTPS, against a controller watching the local API server.

Cluster: node-a 4x H200 with dynamic MIG (1g.18gb .. 7g.141gb placements), node-b 8x H100 (static
MIG on two GPUs: 1g.10gb, 2g.20gb, 3g.40gb), node-c one whole H200.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from controller.api_client import RESOURCE_V1
from controller.daemon import Controller
from controller.planning.shaping import ORIGINAL_ANNOTATION
from controller.webhooks import config_admission
from testbed.controller_harness import (
    ReviewClient,
    admission_review,
    apply_patch,
    running_controller,
    self_signed_cert,
    simulated_cluster,
    webhook_certificate,
)

GIB = 1024**3

VRAM = "vram.gpu.nvidia.com"


@pytest.fixture(scope="module")
def world() -> Iterator[dict[str, Any]]:
    nodes = {"node-a": "sim:4xh200", "node-b": "sim:8xh100", "node-c": "sim:h200-141gb"}
    with (webhook_certificate() as cert,
          simulated_cluster(nodes, dynamic_mig={"node-a"}) as (srv, api),
          running_controller(srv.api_client(), cert) as ctrl):
        assert ctrl.webhook is not None
        client = ReviewClient(ctrl.webhook.url, cert[0])
        yield {"api": api, "ctrl": ctrl, "client": client, "cert": cert[0]}
        client.close()


def vram_claim(memory: str, name: str = "train", config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": VRAM, "capacity": {"requests": {"memory": memory}}}}]}
    if config is not None:
        devices["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"}, "spec": {"devices": devices}}


def response(world: dict[str, Any], path: str, obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    answer = world["client"].post(path, admission_review(obj, operation))
    assert answer["kind"] == "AdmissionReview" and answer["apiVersion"] == "admission.k8s.io/v1"
    result: dict[str, Any] = answer["response"]
    return result


def webhook_count(ctrl: Controller, webhook: str, outcome: str) -> float:
    value = ctrl.metrics.registry.get_sample_value(
        "gpuready_controller_webhook_requests_total",
        {"webhook": webhook, "kind": "ResourceClaim", "outcome": outcome})
    return value or 0.0


def test_15gib_request_becomes_mig_first_best_fit_list_the_api_server_accepts(world: dict[str, Any]) -> None:
    claim = vram_claim("15Gi")
    resp = response(world, "/mutate", claim)
    assert resp["allowed"] is True and resp["patchType"] == "JSONPatch"
    shaped = apply_patch(claim, resp)
    request = shaped["spec"]["devices"]["requests"][0]
    entries = request["firstAvailable"]
    assert request["name"] == "gpu" and "exactly" not in request
    # Best fit first: devices up to twice the 16 GiB H200 MIG slice, not a whole 80 or 141 GB GPU; then any.
    assert [e["name"] for e in entries] == ["upto-20gi", "any-size"]
    ceiling = re.search(r'compareTo\(quantity\("(\d+)"\)\) <= 0', entries[0]["selectors"][0]["cel"]["expression"])
    assert ceiling and 16 * GIB <= int(ceiling.group(1)) < 32 * GIB, entries[0]
    assert "<= 0" not in entries[1]["selectors"][0]["cel"]["expression"]  # no upper bound in the last tier
    assert all(e["deviceClassName"] == VRAM for e in entries)
    original = json.loads(shaped["metadata"]["annotations"][ORIGINAL_ANNOTATION])
    assert original["gpu"]["exactly"]["capacity"]["requests"]["memory"] == "15Gi"
    # The API server takes the shaped claim as is (firstAvailable limits, CEL, names).
    created = world["api"].request("POST", f"{RESOURCE_V1}/namespaces/default/resourceclaims", body=shaped)
    assert created["spec"]["devices"]["requests"][0]["firstAvailable"] == entries


def test_request_no_device_can_hold_is_admitted_with_a_warning_naming_the_largest(world: dict[str, Any]) -> None:
    before = webhook_count(world["ctrl"], "mutate", "warned")
    resp = response(world, "/mutate", vram_claim("200Gi", name="huge"))
    assert resp["allowed"] is True and "patch" not in resp
    [warning] = resp["warnings"]
    assert "200 GiB" in warning and "NVIDIA H200" in warning and "140.4 GiB" in warning
    assert webhook_count(world["ctrl"], "mutate", "warned") == before + 1


def test_template_is_shaped_and_its_generated_claims_carry_the_original(world: dict[str, Any]) -> None:
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "t", "namespace": "default"},
                "spec": {"spec": vram_claim("100Gi")["spec"]}}
    resp = response(world, "/mutate", template)
    shaped = apply_patch(template, resp)
    entries = shaped["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    # 100 GiB fits only a whole H200 or its 7g MIG slice; the H100s (79.6 GiB) are never listed.
    assert entries and all("h100" not in e["name"] for e in entries)
    assert ORIGINAL_ANNOTATION in shaped["spec"]["metadata"]["annotations"]
    assert ORIGINAL_ANNOTATION in shaped["metadata"]["annotations"]


def test_other_classes_and_updates_pass_unchanged(world: dict[str, Any]) -> None:
    plain = vram_claim("15Gi")
    plain["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu.nvidia.com"
    resp = response(world, "/mutate", plain)
    assert resp["allowed"] is True and "patch" not in resp and "warnings" not in resp
    resp = response(world, "/mutate", vram_claim("15Gi"), operation="UPDATE")
    assert resp["allowed"] is True and "patch" not in resp


def test_bad_opaque_config_is_refused_naming_the_field(world: dict[str, Any]) -> None:
    bad = [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
        "apiVersion": "gpu.nvidia.com/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "Bogus"}}}}]
    resp = response(world, "/validate", vram_claim("15Gi", config=bad))
    assert resp["allowed"] is False
    assert resp["status"]["code"] == 422
    message = resp["status"]["message"]
    assert "spec.devices.config[0].opaque.parameters.sharing.strategy" in message
    assert "TimeSlicing, MPS" in message  # and the fix
    # The same config in a DeviceClass, and in a template, is refused at its own path.
    cls = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "x"},
           "spec": {"config": [{"opaque": bad[0]["opaque"]}]}}
    resp = response(world, "/validate", cls, operation="UPDATE")
    assert resp["allowed"] is False and "spec.config[0].opaque.parameters.sharing.strategy" in resp["status"]["message"]
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "t", "namespace": "default"}, "spec": {"spec": vram_claim("1Gi", config=bad)["spec"]}}
    resp = response(world, "/validate", template)
    assert resp["allowed"] is False and "spec.spec.devices.config[0]" in resp["status"]["message"]


def test_good_and_foreign_opaque_configs_are_allowed(world: dict[str, Any]) -> None:
    config = [
        {"opaque": {"driver": "gpu.nvidia.com", "parameters": {
            "apiVersion": "gpu.nvidia.com/v1alpha1", "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50}}}}},
        {"opaque": {"driver": "nic.example.com", "parameters": {"anything": "goes"}}},
    ]
    assert response(world, "/validate", vram_claim("15Gi", config=config))["allowed"] is True


NV = "resource.nvidia.com/v1beta1"


def class_claim(device_class: str, parameters: dict[str, Any], name: str = "nv") -> dict[str, Any]:
    """A claim for one device of ``device_class`` with one opaque config for gpu.nvidia.com."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}],
                                 "config": [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com",
                                                                             "parameters": parameters}}]}}}


NVIDIA_FORMS = [
    ("gpu.nvidia.com", {"apiVersion": NV, "kind": "GpuConfig"}),
    ("gpu.nvidia.com", {"apiVersion": NV, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}),
    ("gpu.nvidia.com", {"apiVersion": NV, "kind": "GpuConfig", "sharing": {
        "strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}}),
    ("gpu.nvidia.com", {"apiVersion": NV, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {
        "defaultActiveThreadPercentage": 30, "defaultPinnedDeviceMemoryLimit": "10Gi"}}}),
    ("mig.nvidia.com", {"apiVersion": NV, "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing"}}),
    ("mig.nvidia.com", {"apiVersion": NV, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS", "mpsConfig": {
        "defaultActiveThreadPercentage": 100, "defaultPinnedDeviceMemoryLimit": "4Gi"}}}),
]


@pytest.mark.parametrize(("device_class", "parameters"), NVIDIA_FORMS)
def test_every_nvidia_config_form_is_admitted_without_a_warning(world: dict[str, Any], device_class: str,
                                                                parameters: dict[str, Any]) -> None:
    resp = response(world, "/validate", class_claim(device_class, parameters))
    assert resp["allowed"] is True, resp
    assert "warnings" not in resp


def test_nvidias_zero_percent_is_admitted_with_a_warning_that_it_sets_no_limit(world: dict[str, Any]) -> None:
    parameters = {"apiVersion": NV, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {
        "defaultActiveThreadPercentage": 0}}}
    resp = response(world, "/validate", class_claim("gpu.nvidia.com", parameters))
    assert resp["allowed"] is True
    [warning] = resp["warnings"]
    assert "sharing.mpsConfig.defaultActiveThreadPercentage: 0 sets no limit" in warning


def test_a_per_claim_multi_user_setting_is_admitted_with_a_warning_and_per_device_limits_without(
        world: dict[str, Any]) -> None:
    parameters = {"apiVersion": NV, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {
        "defaultPinnedDeviceMemoryLimit": "10Gi", "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi"},
        "multiUser": True}}}
    resp = response(world, "/validate", class_claim("gpu.nvidia.com", parameters))
    assert resp["allowed"] is True
    multi_user, = resp["warnings"]  # per-device limits are applied at prepare: nothing to warn about
    assert "sharing.mpsConfig.multiUser is decided per node" in multi_user and "MPS_MULTIUSER" in multi_user


@pytest.mark.parametrize("interval", ["Short", "Medium", "Long"])
def test_a_timeslice_interval_the_admin_has_not_allowed_is_admitted_with_a_warning(
        world: dict[str, Any], interval: str) -> None:
    parameters = {"apiVersion": NV, "kind": "GpuConfig",
                  "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}}
    resp = response(world, "/validate", class_claim("gpu.nvidia.com", parameters))
    assert resp["allowed"] is True
    [warning] = resp["warnings"]
    assert "spec.devices.config[0].opaque.parameters.sharing.timeSlicingConfig.interval" in warning
    assert f"{interval} is not applied" in warning and "timeSliceInterval" in warning
    webhook = world["ctrl"].webhook
    webhook.allow_timeslice = True  # the chart's timeSliceInterval: apply
    try:
        resp = response(world, "/validate", class_claim("gpu.nvidia.com", parameters))
    finally:
        webhook.allow_timeslice = False
    assert resp["allowed"] is True and "warnings" not in resp


@pytest.mark.parametrize(
    ("device_class", "parameters", "fragments"),
    [
        # issue 40: values no device of the class can honour
        ("gpu.nvidia.com", {"apiVersion": NV, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {
            "defaultPinnedDeviceMemoryLimit": "1e30"}}},
         ("sharing.mpsConfig.defaultPinnedDeviceMemoryLimit", "more memory than any device of DeviceClass "
          "gpu.nvidia.com", "set at most 143771Mi")),
        ("mig.nvidia.com", {"apiVersion": NV, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS", "mpsConfig": {
            "defaultPerDevicePinnedMemoryLimit": {"0": "200Gi"}}}},
         ("sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.0", "DeviceClass mig.nvidia.com")),
        ("gpu.nvidia.com", {"apiVersion": "gpu.nvidia.com/v1alpha1", "kind": "GpuConfig", "sharing": {
            "strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "1e30"}}},
         ("sharing.mps.defaultPinnedDeviceMemoryLimit", "set at most")),
        # issue 40: a config kind that does not fit the request's class
        ("gpu.nvidia.com", {"apiVersion": NV, "kind": "MigDeviceConfig"},
         ("parameters.kind: MigDeviceConfig applies to request 'gpu'", "only gpu devices", "use kind: GpuConfig")),
        ("mig.nvidia.com", {"apiVersion": NV, "kind": "GpuConfig"},
         ("only mig devices", "use kind: MigDeviceConfig")),
        # issue 40: control characters in env values
        ("gpu.nvidia.com", {"apiVersion": "gpu.nvidia.com/v1alpha1", "kind": "GpuConfig", "env": {"A": "x\u0000"}},
         ("parameters.env.A", "control character U+0000")),
        # NVIDIA's field names and ranges
        ("gpu.nvidia.com", {"apiVersion": NV, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {
            "defaultActiveThreadPercentage": 101}}},
         ("sharing.mpsConfig.defaultActiveThreadPercentage", "101 is out of range", "0 to 100")),
        # dialects mixed
        ("gpu.nvidia.com", {"apiVersion": NV, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mps": {}}},
         ("parameters.sharing.mps", "other configuration dialect", "spells it sharing.mpsConfig")),
    ],
)
def test_config_prepare_would_refuse_is_refused_at_admission(world: dict[str, Any], device_class: str,
                                                             parameters: dict[str, Any],
                                                             fragments: tuple[str, ...]) -> None:
    resp = response(world, "/validate", class_claim(device_class, parameters))
    assert resp["allowed"] is False and resp["status"]["code"] == 422
    message = resp["status"]["message"]
    assert "spec.devices.config[0].opaque.parameters" in message
    for fragment in fragments:
        assert fragment in message, message


def test_a_device_classs_own_config_must_fit_the_devices_it_selects(world: dict[str, Any]) -> None:
    def device_class(parameters: dict[str, Any], device_type: str = "gpu") -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "team-gpus"},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "gpu.nvidia.com" && '
                                                              f'device.attributes["gpu.nvidia.com"].type == "{device_type}"'}}],
                         "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": parameters}}]}}

    resp = response(world, "/validate", device_class({"apiVersion": NV, "kind": "MigDeviceConfig"}))
    assert resp["allowed"] is False
    message = resp["status"]["message"]
    assert "spec.config[0].opaque.parameters.kind: MigDeviceConfig applies to every request of DeviceClass " \
           "team-gpus, which holds only gpu devices" in message and "use kind: GpuConfig" in message
    resp = response(world, "/validate", device_class({"apiVersion": NV, "kind": "MigDeviceConfig", "sharing": {
        "strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "200Gi"}}}, "mig"))
    assert resp["allowed"] is False  # the largest MIG device here is node-a's 7g.141gb placement
    message = resp["status"]["message"]
    assert "spec.config[0].opaque.parameters.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: 200 GiB is more " \
           "memory than any device of DeviceClass team-gpus has" in message, message
    ok = response(world, "/validate", device_class({"apiVersion": NV, "kind": "GpuConfig", "sharing": {
        "strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "8Gi"}}}))
    assert ok["allowed"] is True


def test_a_class_holding_fitting_devices_is_not_refused(world: dict[str, Any]) -> None:
    # The VRAM class holds whole GPUs and MIG devices: a MigDeviceConfig may well land on a MIG device.
    resp = response(world, "/validate", class_claim(VRAM, {"apiVersion": NV, "kind": "MigDeviceConfig"}))
    assert resp["allowed"] is True


def test_mutation_fails_open_on_an_internal_error(world: dict[str, Any]) -> None:
    ctrl: Controller = world["ctrl"]
    assert ctrl.webhook is not None
    before = webhook_count(ctrl, "mutate", "error")
    saved = ctrl.webhook.inventory

    def broken() -> Any:
        raise RuntimeError("inventory exploded")
    ctrl.webhook.inventory = broken
    try:
        resp = response(world, "/mutate", vram_claim("15Gi"))
    finally:
        ctrl.webhook.inventory = saved
    assert resp["allowed"] is True and "patch" not in resp
    assert "inventory exploded" in resp["warnings"][0] and "admitted unchanged" in resp["warnings"][0]
    assert webhook_count(ctrl, "mutate", "error") == before + 1


def test_validation_fails_closed_on_an_internal_error(world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("validator exploded")
    monkeypatch.setattr(config_admission, "parse_config", broken)
    config = [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {}}}]
    resp = response(world, "/validate", vram_claim("15Gi", config=config))
    assert resp["allowed"] is False and resp["status"]["code"] == 500
    assert "validator exploded" in resp["status"]["message"]


def test_not_an_admission_review_gets_400_and_tls_is_required(world: dict[str, Any]) -> None:
    client: ReviewClient = world["client"]
    with pytest.raises(RuntimeError, match=r"HTTP 400.*AdmissionReview"):
        client.post("/mutate", {"kind": "Pod"})
    url = world["ctrl"].webhook.url.replace("https://", "http://") + "/healthz"
    with pytest.raises((OSError, http.client.HTTPException)):
        urllib.request.urlopen(url, timeout=5)  # plain HTTP to a TLS port fails



def test_rotated_certificate_is_served_without_a_restart(world: dict[str, Any]) -> None:
    ctrl: Controller = world["ctrl"]
    webhook = ctrl.webhook
    assert webhook is not None
    originals = {}
    for path in (webhook.cert_file, webhook.key_file):
        with open(path, "rb") as f:
            originals[path] = f.read()
    new_cert, new_key = self_signed_cert(tempfile.mkdtemp(prefix="gr-wh2-", dir="/tmp"))
    webhook.cert_check_s = 0.0
    try:
        # cert-manager rewrites the mounted files in place.
        shutil.copyfile(new_key, webhook.key_file)
        shutil.copyfile(new_cert, webhook.cert_file)
        client = ReviewClient(webhook.url, new_cert)  # trusts only the new certificate
        answer = client.post("/validate", admission_review(vram_claim("1Gi")))
        client.close()
        assert answer["response"]["allowed"] is True
    finally:
        for path, data in originals.items():
            with open(path, "wb") as f:
                f.write(data)
        restored = ReviewClient(webhook.url, world["cert"])  # the original is served again
        restored.post("/validate", admission_review(vram_claim("1Gi")))
        restored.close()
        webhook.cert_check_s = 5.0


def test_allocation_mode_all_with_memory_is_left_as_written(world: dict[str, Any]) -> None:
    # "All matching devices with >= 15 GiB" must not become "all devices of one shape" (a best-fit list).
    alone = vram_claim("15Gi", name="everything")
    alone["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] = "All"
    resp = response(world, "/mutate", alone)
    assert resp["allowed"] is True and "patch" not in resp

    mixed = vram_claim("15Gi", name="mixed")
    all_request = {"name": "all", "exactly": {"deviceClassName": VRAM, "allocationMode": "All",
                                              "capacity": {"requests": {"memory": "15Gi"}}}}
    mixed["spec"]["devices"]["requests"].append(all_request)
    shaped = apply_patch(mixed, response(world, "/mutate", mixed))
    first, second = shaped["spec"]["devices"]["requests"]
    assert first["firstAvailable"], "the ordinary request next to it is still shaped"
    assert second == all_request


@pytest.mark.parametrize("memory", ["-1Gi", "0"])
def test_a_vram_request_that_is_not_positive_is_refused_naming_the_field(world: dict[str, Any], memory: str) -> None:
    claim = vram_claim(memory)
    mutated = response(world, "/mutate", claim)
    assert mutated["allowed"] is True and "patch" not in mutated  # left as written for validation to see
    resp = response(world, "/validate", claim)
    assert resp["allowed"] is False and resp["status"]["code"] == 422
    message = resp["status"]["message"]
    assert f"spec.devices.requests[0].exactly.capacity.requests.memory: {memory} asks for no VRAM" in message
    assert "request a positive amount, e.g. 16Gi" in message


def test_a_not_positive_memory_on_a_whole_gpu_or_in_a_template_is_refused_too(world: dict[str, Any]) -> None:
    shared = vram_claim("0")
    shared["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu.nvidia.com"
    assert response(world, "/validate", shared)["allowed"] is False
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "t", "namespace": "default"},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
                    {"name": "big", "deviceClassName": VRAM, "capacity": {"requests": {"memory": "-8Gi"}}}]}]}}}}
    resp = response(world, "/validate", template)
    assert resp["allowed"] is False
    assert "spec.spec.devices.requests[0].firstAvailable[0].capacity.requests.memory: -8Gi" in resp["status"]["message"]


def test_memory_requests_of_other_drivers_and_positive_ones_pass(world: dict[str, Any]) -> None:
    foreign = vram_claim("0")
    foreign["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "fpga.example.com"
    assert response(world, "/validate", foreign)["allowed"] is True
    assert response(world, "/validate", vram_claim("16Gi"))["allowed"] is True
