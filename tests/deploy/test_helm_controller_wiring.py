"""The chart's webhook configurations and probes, followed to the real controller.

The controller runs with the configuration the chart gives it (its container's environment through
its own flag parser; only the ports become free ones and the certificate a self-signed one). Each
webhook rule of the chart is then sent the AdmissionReview the API server would send, at the path
the chart names, and each probe path is fetched from the port the probe names: a rule or probe the
controller does not serve, or a kind the controller checks that the chart never sends it, fails here.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

helm = pytest.importorskip("helm_python")

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gpuready"
RELEASE, NAMESPACE, DRIVER = "gpuready", "gpu-system", "gpu.nvidia.com"
VRAM_CLASS = f"vram.{DRIVER}"
KIND_OF = {"resourceclaims": "ResourceClaim", "resourceclaimtemplates": "ResourceClaimTemplate",
           "deviceclasses": "DeviceClass"}
BAD_CONFIG = {"driver": DRIVER, "parameters": {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuConfig",
                                               "sharing": {"strategy": "Bogus"}}}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    out = helm.Chart.load(str(CHART)).render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return [d for p, t in out.items() if not p.endswith("NOTES.txt") for d in yaml.safe_load_all(t) if d]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [obj] = [o for o in objs if o["kind"] == kind]
    return obj


@pytest.fixture(scope="module")
def world() -> Iterator[dict[str, Any]]:
    from controller import controller_command as command
    from controller.api_client import KubeApi
    from controller.daemon import Controller
    from testbed.apiserver import LocalApiServer
    from testbed.controller_harness import (
        ReviewClient,
        install_device_classes,
        publish_node,
        self_signed_cert,
    )

    objs = render({})
    container = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    downward = {"metadata.name": "gpuready-controller-abc", "metadata.namespace": NAMESPACE}
    mp = pytest.MonkeyPatch()
    for e in container["env"]:
        mp.setenv(e["name"], e["value"] if "value" in e else downward[e["valueFrom"]["fieldRef"]["fieldPath"]])
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    chart_config = command.config_from_args(parser.parse_args([]))
    mp.undo()
    tmp = tempfile.mkdtemp(prefix="gr-hw-", dir="/tmp")
    cert, key = self_signed_cert(tmp)
    # Free ports on this shared machine; leader election off (not what is under test here).
    config = dataclasses.replace(chart_config, webhook_port=0, health_port=0, metrics_port=None, cert_file=cert,
                                 key_file=key, webhook_host="127.0.0.1", bind_host="127.0.0.1", leader_elect=False)
    with LocalApiServer() as srv:
        api = KubeApi(srv.api_client())
        install_device_classes(api)
        publish_node(api, "node-a", "sim:4xh200", mig_mode="dynamic")
        ctrl = Controller(config, srv.api_client()).start()
        try:
            assert ctrl.webhook is not None
            client = ReviewClient(ctrl.webhook.url, cert)
            yield {"objs": objs, "container": container, "chart_config": chart_config, "ctrl": ctrl,
                   "client": client}
            client.close()
        finally:
            ctrl.stop()
            shutil.rmtree(tmp, ignore_errors=True)


def _object(kind: str, config: list[dict[str, Any]] | None = None, memory: str = "") -> dict[str, Any]:
    request: dict[str, Any] = {"name": "gpu", "exactly": {"deviceClassName": VRAM_CLASS}}
    if memory:
        request["exactly"]["capacity"] = {"requests": {"memory": memory}}
    devices: dict[str, Any] = {"requests": [request]}
    if config:
        devices["config"] = config
    meta = {"name": "x", "namespace": "default"}
    if kind == "ResourceClaim":
        return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": meta, "spec": {"devices": devices}}
    if kind == "ResourceClaimTemplate":
        return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": meta,
                "spec": {"spec": {"devices": devices}}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": {"name": "x"},
            "spec": {"config": [{"opaque": c["opaque"]} for c in config or []]}}


def _routes(objs: list[dict[str, Any]], kind: str) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(path, resource, operation, webhook) for every rule of the chart's webhook configuration."""
    out = []
    for hook in one(objs, kind)["webhooks"]:
        for rule in hook["rules"]:
            assert rule["apiGroups"] == ["resource.k8s.io"] and rule["apiVersions"] == ["v1"]
            for resource in rule["resources"]:
                for op in rule["operations"]:
                    out.append((hook["clientConfig"]["service"]["path"], resource, op, hook))
    return out


def test_the_chart_sends_the_controller_every_kind_and_operation_it_checks(world: dict[str, Any]) -> None:
    from controller.webhooks import admission_decisions as admission

    objs = world["objs"]
    mutating = {(KIND_OF[r], op) for path, r, op, _ in _routes(objs, "MutatingWebhookConfiguration")}
    validating = {(KIND_OF[r], op) for path, r, op, _ in _routes(objs, "ValidatingWebhookConfiguration")}
    assert mutating == {(k, "CREATE") for k in admission.MUTATE_KINDS}
    # Claims and templates: their spec is immutable, so CREATE only (UPDATE would put the scheduler's
    # finalizer writes behind a Fail webhook). DeviceClasses are mutable: CREATE and UPDATE.
    assert validating == ({(k, "CREATE") for k in admission.VALIDATE_KINDS}
                          | {("DeviceClass", "UPDATE")})
    for _path, _r, _op, hook in _routes(objs, "MutatingWebhookConfiguration"):
        assert hook["failurePolicy"] == "Ignore"  # shaping is a convenience: never block claims
    for _path, _r, _op, hook in _routes(objs, "ValidatingWebhookConfiguration"):
        assert hook["failurePolicy"] == "Fail"  # a claim is never admitted unchecked


def test_every_validating_rule_reaches_a_handler_that_refuses_bad_config(world: dict[str, Any]) -> None:
    from testbed.controller_harness import admission_review

    bad = [{"requests": ["gpu"], "opaque": BAD_CONFIG}]
    routes = _routes(world["objs"], "ValidatingWebhookConfiguration")
    assert {path for path, *_ in routes} == {"/validate"}
    for path, resource, op, _hook in routes:
        obj = _object(KIND_OF[resource], bad)
        answer = world["client"].post(path, admission_review(obj, op, old=obj if op == "UPDATE" else None))
        response = answer["response"]
        assert response["allowed"] is False, f"{op} {resource} with bad config admitted"
        assert "opaque.parameters.sharing.strategy" in response["status"]["message"]
        good = _object(KIND_OF[resource])
        answer = world["client"].post(path, admission_review(good, op, old=good if op == "UPDATE" else None))
        assert answer["response"]["allowed"] is True


def test_every_mutating_rule_reaches_the_vram_shaper(world: dict[str, Any]) -> None:
    from testbed.controller_harness import admission_review, apply_patch

    assert world["ctrl"].wait_ready(20)
    routes = _routes(world["objs"], "MutatingWebhookConfiguration")
    assert {path for path, *_ in routes} == {"/mutate"}
    for path, resource, op, _hook in routes:
        obj = _object(KIND_OF[resource], memory="15Gi")
        response = world["client"].post(path, admission_review(obj, op))["response"]
        assert response["allowed"] is True and response.get("patchType") == "JSONPatch", resource
        shaped = apply_patch(obj, response)
        spec = shaped["spec"]["spec"] if resource == "resourceclaimtemplates" else shaped["spec"]
        assert spec["devices"]["requests"][0].get("firstAvailable"), f"{resource} not shaped"


def test_webhook_service_port_and_certificate_reach_the_controller(world: dict[str, Any]) -> None:
    objs, container, cfg = world["objs"], world["container"], world["chart_config"]
    service = next(o for o in objs if o["kind"] == "Service" and o["metadata"]["name"].endswith("-webhook"))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for _path, _r, _op, hook in (_routes(objs, "MutatingWebhookConfiguration")
                                 + _routes(objs, "ValidatingWebhookConfiguration")):
        svc = hook["clientConfig"]["service"]
        assert (svc["name"], svc["namespace"]) == (service["metadata"]["name"], NAMESPACE)
        [port] = [p for p in service["spec"]["ports"] if p["port"] == svc["port"]]
        assert ports[port["targetPort"]] == cfg.webhook_port == 8443
    # The controller reads its certificate from the mounted Secret (WEBHOOK_CERT_DIR).
    mount = next(m for m in container["volumeMounts"] if m["name"] == "webhook-tls")
    assert (cfg.cert_file, cfg.key_file) == (f"{mount['mountPath']}/tls.crt", f"{mount['mountPath']}/tls.key")
    volume = next(v for v in one(objs, "Deployment")["spec"]["template"]["spec"]["volumes"]
                  if v["name"] == "webhook-tls")
    secret = next(o for o in objs if o["kind"] == "Secret")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert {"tls.crt", "tls.key"} <= set(secret["data"])


def _get(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_probes_hit_the_controllers_health_server(world: dict[str, Any]) -> None:
    container, cfg, ctrl = world["container"], world["chart_config"], world["ctrl"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    readiness, liveness = container["readinessProbe"]["httpGet"], container["livenessProbe"]["httpGet"]
    assert (readiness["path"], liveness["path"]) == ("/readyz", "/healthz")
    # Both probes name the port the controller serves /healthz and /readyz on (--health-port, 8081).
    assert ports[readiness["port"]] == ports[liveness["port"]] == cfg.health_port == 8081
    assert ctrl.wait_ready(20)
    assert _get(ctrl.health_port, readiness["path"]) == 200
    assert _get(ctrl.health_port, liveness["path"]) == 200
    assert _get(ctrl.health_port, "/nothing") == 404  # the right server: it knows its paths


def test_probes_follow_a_custom_health_port() -> None:
    container = one(render({"controller": {"healthPort": 9091}}), "Deployment")["spec"]["template"]["spec"][
        "containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert ports[container["readinessProbe"]["httpGet"]["port"]] == 9091 == int(env["HEALTH_PORT"])
