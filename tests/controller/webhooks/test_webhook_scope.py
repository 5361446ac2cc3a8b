"""The webhooks are called only for the claims they act on (the chart's matchConditions).

The validating webhook has ``failurePolicy: Fail``; unscoped, a controller that is down would block
every ResourceClaim in the cluster, other drivers' too. Scoped, with the controller down: other
drivers' claims and this driver's claims without an opaque config are admitted at once; a claim that
carries this driver's config, or asks this driver's classes for a VRAM amount that is not positive,
is refused (never admitted unchecked). With the controller up, that
claim is checked as before. Registered in the local API server exactly as the chart renders them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from kubernetes.client.exceptions import ApiException

from testbed.apiserver import LocalApiServer
from testbed.apiserver.webhook_configs import gpuready_webhook_configurations
from testbed.controller_harness import webhook_certificate

DEAD = "https://127.0.0.1:9"  # the discard port: the controller is down, nothing answers
OURS = "gpu.nvidia.com"


def _claim(name: str, device_class: str, driver_config: str | None = None, bad: bool = False) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}
    if driver_config:
        sharing = {"strategy": "Bogus" if bad else "TimeSlicing"}
        devices["config"] = [{"opaque": {"driver": driver_config, "parameters": {
            "apiVersion": f"{driver_config}/v1alpha1", "kind": "GpuConfig", "sharing": sharing}}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": devices}}


def _template(name: str, claim: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": claim["spec"]}}


@pytest.fixture(scope="module")
def down() -> Iterator[tuple[Any, Any]]:
    """A cluster whose gpuready webhooks are registered while the controller is not running."""
    with LocalApiServer() as srv:
        client = srv.api_client()
        admission = kubernetes.client.AdmissionregistrationV1Api(client)
        with webhook_certificate() as (cert, _key), open(cert, "rb") as f:
            mutating, validating = gpuready_webhook_configurations(DEAD, f.read(), OURS)
        admission.create_mutating_webhook_configuration(mutating)
        admission.create_validating_webhook_configuration(validating)
        yield kubernetes.client.ResourceV1Api(client), admission


def test_other_drivers_claims_are_admitted_at_once_while_the_controller_is_down(down: tuple[Any, Any]) -> None:
    resource, _ = down
    started = time.monotonic()
    resource.create_namespaced_resource_claim("default", _claim("theirs", "fpga.example.com", "fpga.example.com"))
    resource.create_namespaced_resource_claim("default", _claim("ours-plain", OURS))  # ours, no config
    resource.create_namespaced_resource_claim_template(
        "default", _template("theirs-template", _claim("t", "fpga.example.com", "fpga.example.com", bad=True)))
    assert time.monotonic() - started < 2.0  # no webhook was even called (its timeout is 5 s)


def test_a_claim_with_this_drivers_config_is_never_admitted_unchecked(down: tuple[Any, Any]) -> None:
    resource, _ = down
    for create, obj in ((resource.create_namespaced_resource_claim, _claim("ours-config", OURS, OURS)),
                        (resource.create_namespaced_resource_claim_template,
                         _template("ours-template", _claim("t", OURS, OURS)))):
        with pytest.raises(ApiException) as err:
            create("default", obj)
        assert err.value.status == 500
        assert f'failed calling webhook "validate.{OURS}"' in json.loads(err.value.body)["message"]


def test_a_vram_claim_is_admitted_unshaped_while_the_controller_is_down(down: tuple[Any, Any]) -> None:
    resource, _ = down
    claim = _claim("vram", f"vram.{OURS}")
    claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"memory": "15Gi"}}
    created = resource.create_namespaced_resource_claim("default", claim, _preload_content=False)
    assert created.status == 201  # the mutating webhook was called, failed, and failed open


def _vram(name: str, memory: str, device_class: str = f"vram.{OURS}") -> dict[str, Any]:
    claim = _claim(name, device_class)
    claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"memory": memory}}
    return claim


def test_a_claim_asking_no_vram_is_never_admitted_unchecked(down: tuple[Any, Any]) -> None:
    resource, _ = down
    sub = _claim("sub", OURS)
    sub["spec"]["devices"]["requests"] = [{"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": f"mig.{OURS.split('.', 1)[1]}", "capacity": {"requests": {"memory": "0"}}}]}]
    for claim in (_vram("minus", "-1Gi"), _vram("zero", "0", OURS), _vram("zero-mi", "0.0Mi"), sub):
        with pytest.raises(ApiException) as err:
            resource.create_namespaced_resource_claim("default", claim)
        assert err.value.status == 500
        assert f'failed calling webhook "validate.{OURS}"' in json.loads(err.value.body)["message"], claim
    for name, memory in (("half", "0.5Gi"), ("ten", "10Gi"), ("tiny", "1")):  # positive: no validation call
        resource.create_namespaced_resource_claim("default", _vram(name, memory, OURS))
    resource.create_namespaced_resource_claim("default", _vram("theirs-zero", "0", "fpga.example.com"))


def test_with_the_controller_up_this_drivers_bad_config_is_refused_and_others_pass() -> None:
    from controller.api_client import KubeApi
    from controller.daemon import Controller, ControllerConfig

    with LocalApiServer() as srv, webhook_certificate() as (cert, key):
        client = srv.api_client()
        ctrl = Controller(ControllerConfig(webhook_port=0, webhook_host="127.0.0.1", cert_file=cert, key_file=key,
                                           leader_elect=False), client).start()
        try:
            assert ctrl.wait_ready(20), ctrl.ready()
            assert ctrl.webhook is not None
            with open(cert, "rb") as f:
                mutating, validating = gpuready_webhook_configurations(ctrl.webhook.url, f.read(), OURS)
            admission = kubernetes.client.AdmissionregistrationV1Api(client)
            admission.create_mutating_webhook_configuration(mutating)
            admission.create_validating_webhook_configuration(validating)
            resource = kubernetes.client.ResourceV1Api(client)
            with pytest.raises(ApiException) as err:
                resource.create_namespaced_resource_claim("default", _claim("bad", OURS, OURS, bad=True))
            assert err.value.status == 422 and "sharing.strategy" in json.loads(err.value.body)["message"]
            resource.create_namespaced_resource_claim("default", _claim("good", OURS, OURS))
            with pytest.raises(ApiException) as err:
                resource.create_namespaced_resource_claim("default", _vram("no-vram", "-1Gi"))
            assert err.value.status == 422
            assert ("spec.devices.requests[0].exactly.capacity.requests.memory: -1Gi asks for no VRAM"
                    in json.loads(err.value.body)["message"])
            # Another driver's config that would be "bad" for gpuready is not gpuready's business.
            resource.create_namespaced_resource_claim("default", _claim("theirs", "fpga.example.com",
                                                                        "fpga.example.com", bad=True))
            assert KubeApi(client)  # the controller's own client works against this server
        finally:
            ctrl.stop()
