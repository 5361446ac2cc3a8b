"""The local API server calls admission webhooks like kube-apiserver: the REAL controller webhook
server over HTTPS (self-signed certificate, caBundle checked), registered as the chart renders it,
and the real ``kubernetes`` client creating claims.

Cluster: node-a 4x H200 with dynamic MIG (1g.18gb .. 7g.141gb placements), node-c one whole H200.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kubernetes
import pytest
from kubernetes.client.rest import ApiException

from controller.planning.shaping import ORIGINAL_ANNOTATION
from testbed.apiserver.admission import rule_matches, warning_header
from testbed.apiserver.resources import resource_for_key
from testbed.apiserver.webhook_configs import gpuready_webhook_configurations
from testbed.controller_harness import running_controller, simulated_cluster, webhook_certificate

VRAM = "vram.gpu.nvidia.com"
BAD_CONFIG = [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
    "apiVersion": "gpu.nvidia.com/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "Bogus"}}}}]


@pytest.fixture(scope="module")
def world() -> Iterator[dict[str, Any]]:
    nodes = {"node-a": "sim:4xh200", "node-c": "sim:h200-141gb"}
    with (webhook_certificate() as (cert, key),
          simulated_cluster(nodes, dynamic_mig={"node-a"}) as (srv, api),
          running_controller(srv.api_client(), (cert, key)) as ctrl):
        assert ctrl.webhook is not None
        with open(cert, "rb") as f:
            ca = f.read()
        client = srv.api_client()
        admission = kubernetes.client.AdmissionregistrationV1Api(client)
        mutating, validating = gpuready_webhook_configurations(ctrl.webhook.url, ca)
        admission.create_mutating_webhook_configuration(mutating)
        admission.create_validating_webhook_configuration(validating)
        yield {"srv": srv, "api": api, "resource": kubernetes.client.ResourceV1Api(client),
               "admission": admission, "ca": ca, "cert": cert, "key": key, "client": client}


def vram_claim(memory: str, name: str, config: list[dict[str, Any]] | None = None,
               labels: dict[str, str] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": VRAM, "capacity": {"requests": {"memory": memory}}}}]}
    if config is not None:
        devices["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "labels": labels or {}}, "spec": {"devices": devices}}


def create(world: dict[str, Any], claim: dict[str, Any], namespace: str = "default"
           ) -> tuple[dict[str, Any], Any]:
    """Create through the kubernetes client; the stored claim (as JSON) and the response headers."""
    resp = world["resource"].create_namespaced_resource_claim(namespace, claim, _preload_content=False)
    return json.loads(resp.data), resp.headers


def error_body(exc: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.body)
    return body


def test_15gib_claim_comes_back_shaped_into_a_best_fit_list(world: dict[str, Any]) -> None:
    created, headers = create(world, vram_claim("15Gi", "train"))
    request = created["spec"]["devices"]["requests"][0]
    assert "exactly" not in request and request["name"] == "gpu"
    entries = request["firstAvailable"]
    assert entries[0]["name"] == "upto-16gi"  # the 16 GiB H200 slices first, not a whole GPU
    assert all(e["deviceClassName"] == VRAM for e in entries)
    original = json.loads(created["metadata"]["annotations"][ORIGINAL_ANNOTATION])
    assert original["gpu"]["exactly"]["capacity"]["requests"]["memory"] == "15Gi"
    assert "Warning" not in headers
    # What is stored is what came back: the shaped claim.
    stored = world["api"].request("GET", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/train")
    assert stored["spec"]["devices"]["requests"][0]["firstAvailable"] == entries


def test_200gib_claim_is_created_with_a_warning_header_naming_the_largest_device(world: dict[str, Any]) -> None:
    created, headers = create(world, vram_claim("200Gi", "huge"))
    assert created["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] == "200Gi"
    warning = headers["Warning"]
    assert warning.startswith('299 - "gpuready') or warning.startswith('299 - "')
    assert "200 GiB" in warning and "NVIDIA H200" in warning and "140.4 GiB" in warning


def test_bad_opaque_config_is_denied_with_the_field_named_and_nothing_stored(world: dict[str, Any]) -> None:
    with pytest.raises(ApiException) as err:
        create(world, vram_claim("15Gi", "badcfg", config=BAD_CONFIG))
    assert err.value.status == 422
    message = error_body(err.value)["message"]
    assert message.startswith('admission webhook "validate.gpu.nvidia.com" denied the request: ')
    assert "spec.devices.config[0].opaque.parameters.sharing.strategy" in message
    with pytest.raises(ApiException) as gone:
        world["resource"].read_namespaced_resource_claim("badcfg", "default")
    assert gone.value.status == 404


def test_namespace_selector_skips_kube_system_as_the_chart_says(world: dict[str, Any]) -> None:
    created, _ = create(world, vram_claim("15Gi", "sys"), namespace="kube-system")
    assert "exactly" in created["spec"]["devices"]["requests"][0]  # not shaped
    ns = world["api"].request("GET", "/api/v1/namespaces/kube-system")
    assert ns["metadata"]["labels"]["kubernetes.io/metadata.name"] == "kube-system"


def test_object_selector_lets_the_charts_own_deviceclasses_through(world: dict[str, Any]) -> None:
    bad = {"metadata": {"name": "bad-class"}, "spec": {"config": [{"opaque": BAD_CONFIG[0]["opaque"]}]}}
    with pytest.raises(ApiException) as err:
        world["resource"].create_device_class(bad)
    assert err.value.status == 422
    assert 'admission webhook "validate-deviceclass.gpu.nvidia.com" denied' in error_body(err.value)["message"]
    bad["metadata"]["labels"] = {"app.kubernetes.io/instance": "gpuready"}  # the release's own: skipped
    world["resource"].create_device_class(bad)


def test_configurations_get_the_real_servers_defaults(world: dict[str, Any]) -> None:
    got = world["admission"].read_mutating_webhook_configuration("gpuready-webhook")
    [hook] = got.webhooks
    assert hook.failure_policy == "Ignore" and hook.object_selector is not None
    assert hook.timeout_seconds == 5 and hook.reinvocation_policy == "Never"
    assert got.metadata.generation == 1


@pytest.mark.parametrize("change,field,words", [
    ({"sideEffects": "Some"}, "webhooks[0].sideEffects", "supported values"),
    ({"admissionReviewVersions": ["v1beta1"]}, "webhooks[0].admissionReviewVersions", "must include v1"),
    ({"name": "nodots"}, "webhooks[0].name", "at least three segments"),
    ({"timeoutSeconds": 31}, "webhooks[0].timeoutSeconds", "between 1 and 30"),
    ({"clientConfig": {"url": "http://127.0.0.1:1/x"}}, "webhooks[0].clientConfig.url", "'https'"),
    ({"clientConfig": {"service": {"name": "wh", "namespace": "gpu-system"}}},
     "webhooks[0].clientConfig.service", "clientConfig.url"),
    ({"rules": [{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["MAKE"], "resources": ["*"]}]},
     "webhooks[0].rules[0].operations[0]", "supported values"),
])
def test_bad_configuration_is_refused_naming_the_field(world: dict[str, Any], change: dict[str, Any], field: str,
                                                       words: str) -> None:
    [hook] = gpuready_webhook_configurations("https://127.0.0.1:1", world["ca"])[0]["webhooks"]
    body = {"metadata": {"name": "bad"}, "webhooks": [{**hook, **change}]}
    with pytest.raises(ApiException) as err:
        world["admission"].create_mutating_webhook_configuration(body)
    assert err.value.status == 422
    causes = error_body(err.value)["details"]["causes"]
    assert any(c["field"] == field and words in c["message"] for c in causes), causes


def _extra_hook(world: dict[str, Any], name: str, url: str, policy: str, timeout: int = 2) -> dict[str, Any]:
    """A validating webhook for claims labelled ``probe=<name>`` only (the others never see it)."""
    return {"metadata": {"name": name}, "webhooks": [{
        "name": f"{name}.probe.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
        "failurePolicy": policy, "timeoutSeconds": timeout,
        "objectSelector": {"matchLabels": {"probe": name}},
        "clientConfig": {"url": url, "caBundle": base64.b64encode(world["ca"]).decode()},
        "rules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE"],
                   "resources": ["resourceclaims"]}]}]}


def test_webhook_down_ignore_admits_fail_answers_500(world: dict[str, Any]) -> None:
    dead = "https://127.0.0.1:9/validate"  # discard port: nothing listens there
    world["admission"].create_validating_webhook_configuration(_extra_hook(world, "down-ignore", dead, "Ignore"))
    world["admission"].create_validating_webhook_configuration(_extra_hook(world, "down-fail", dead, "Fail"))
    created, _ = create(world, vram_claim("15Gi", "through", labels={"probe": "down-ignore"}))
    assert created["spec"]["devices"]["requests"][0]["firstAvailable"]  # the other webhooks still ran
    with pytest.raises(ApiException) as err:
        create(world, vram_claim("15Gi", "blocked", labels={"probe": "down-fail"}))
    assert err.value.status == 500
    body = error_body(err.value)
    assert body["reason"] == "InternalError"
    assert body["message"].startswith('Internal error occurred: failed calling webhook "down-fail.probe.example.com": '
                                      'failed to call webhook: Post "https://127.0.0.1:9/validate?timeout=2s"')
    assert body["message"].endswith("dial tcp 127.0.0.1:9: connect: connection refused")


class _Slow(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(4)  # longer than the webhook's timeoutSeconds
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()


@contextlib.contextmanager
def _https_webhook(world: dict[str, Any], handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` served over HTTPS on 127.0.0.1 (the controller's certificate) for the block: its URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(world["cert"], world["key"])
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture()
def slow_webhook(world: dict[str, Any]) -> Iterator[str]:
    with _https_webhook(world, _Slow) as url:
        yield url + "/validate"


def test_a_slow_webhook_is_cut_off_after_timeout_seconds(world: dict[str, Any], slow_webhook: str) -> None:
    world["admission"].create_validating_webhook_configuration(
        _extra_hook(world, "slow-ignore", slow_webhook, "Ignore", timeout=1))
    world["admission"].create_validating_webhook_configuration(
        _extra_hook(world, "slow-fail", slow_webhook, "Fail", timeout=1))
    start = time.monotonic()
    create(world, vram_claim("15Gi", "patient", labels={"probe": "slow-ignore"}))
    assert 0.9 <= time.monotonic() - start < 3.5  # cut off at 1 s, not after the webhook's 4 s
    start = time.monotonic()
    with pytest.raises(ApiException) as err:
        create(world, vram_claim("15Gi", "impatient", labels={"probe": "slow-fail"}))
    assert 0.9 <= time.monotonic() - start < 3.5
    assert err.value.status == 500
    assert "?timeout=1s\": context deadline exceeded" in error_body(err.value)["message"]


def test_deleting_the_configuration_stops_the_calls(world: dict[str, Any]) -> None:
    world["admission"].create_validating_webhook_configuration(
        _extra_hook(world, "gone", "https://127.0.0.1:9/validate", "Fail"))
    world["admission"].delete_validating_webhook_configuration("gone")
    create(world, vram_claim("15Gi", "after-gone", labels={"probe": "gone"}))


def test_rules_match_resources_subresources_and_scope() -> None:
    claims, classes = resource_for_key("resourceclaims"), resource_for_key("deviceclasses")
    rule = {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["UPDATE"],
            "resources": ["resourceclaims"], "scope": "*"}
    assert rule_matches(rule, claims, "", "UPDATE")
    assert not rule_matches(rule, claims, "status", "UPDATE")  # a status write is resourceclaims/status
    assert not rule_matches(rule, claims, "", "CREATE")
    assert rule_matches({**rule, "resources": ["resourceclaims/status"]}, claims, "status", "UPDATE")
    assert rule_matches({**rule, "resources": ["*/*"]}, claims, "status", "UPDATE")
    assert not rule_matches({**rule, "resources": ["*"]}, claims, "status", "UPDATE")
    assert not rule_matches({**rule, "resources": ["*"], "scope": "Namespaced"}, classes, "", "UPDATE")
    assert rule_matches({**rule, "resources": ["*"], "scope": "Cluster"}, classes, "", "UPDATE")
    assert warning_header('say "hi"') == '299 - "say \\"hi\\""'


class _Recorder(BaseHTTPRequestHandler):
    """A webhook that records each review: /allow admits, /deny refuses without a message, /label
    patches a label in (JSONPatch)."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, dict[str, Any]]] = []
    api_url = ""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        path = self.path.split("?")[0]
        self.seen.append((self.path, review))
        if path == "/callback":  # a webhook that reads from the API server while it reviews
            with urllib.request.urlopen(f"{self.api_url}/api/v1/namespaces/default", timeout=5) as r:
                assert r.status == 200
        response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": path != "/deny"}
        if path == "/label":
            patch = [{"op": "add", "path": "/metadata/labels", "value": {"stamped": "yes"}}]
            response.update(patchType="JSONPatch", patch=base64.b64encode(json.dumps(patch).encode()).decode())
        data = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                           "response": response}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture()
def recorder(world: dict[str, Any]) -> Iterator[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    _Recorder.seen = []
    _Recorder.api_url = world["srv"].url
    with _https_webhook(world, _Recorder) as url:
        yield url, _Recorder.seen


def _pods_hook(world: dict[str, Any], name: str, url: str, operations: list[str], resources: list[str]
               ) -> dict[str, Any]:
    return {"metadata": {"name": name}, "webhooks": [{
        "name": f"{name}.probe.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
        "clientConfig": {"url": url, "caBundle": base64.b64encode(world["ca"]).decode()},
        "objectSelector": {"matchLabels": {"probe": name}},
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": operations, "resources": resources}]}]}


def test_review_requests_are_shaped_like_kube_apiservers(world: dict[str, Any], recorder: Any) -> None:
    url, seen = recorder
    world["admission"].create_validating_webhook_configuration(
        _pods_hook(world, "rec", url + "/allow", ["*"], ["pods", "pods/status"]))
    core = kubernetes.client.CoreV1Api(world["client"])
    pod = {"metadata": {"name": "p", "labels": {"probe": "rec"}},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    core.create_namespaced_pod("default", pod, dry_run="All")
    core.create_namespaced_pod("default", pod)
    core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Running"}})
    core.delete_namespaced_pod("p", "default")
    world["admission"].delete_validating_webhook_configuration("rec")
    assert [path for path, _ in seen] == ["/allow?timeout=10s"] * 4
    dry, create, status, delete = (r["request"] for _, r in seen)
    assert dry["dryRun"] is True and create["dryRun"] is False
    assert create["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert create["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert create["requestKind"] == create["kind"] and create["requestResource"] == create["resource"]
    assert create["operation"] == "CREATE" and create["name"] == "p" and create["namespace"] == "default"
    assert create["oldObject"] is None and create["object"]["spec"]["containers"][0]["image"] == "busybox"
    assert create["options"] == {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
    assert create["userInfo"]["username"] and dry["uid"] != create["uid"]
    assert status["operation"] == "UPDATE" and status["subResource"] == "status"
    assert status["oldObject"]["status"]["phase"] == "Pending" and status["object"]["status"]["phase"] == "Running"
    assert delete["operation"] == "DELETE" and delete["object"] is None and delete["oldObject"]["metadata"]["name"] == "p"
    assert delete["options"]["kind"] == "DeleteOptions"


def test_patch_applies_and_a_bare_denial_is_400_without_explanation(world: dict[str, Any], recorder: Any) -> None:
    url, _ = recorder
    world["admission"].create_mutating_webhook_configuration(
        _pods_hook(world, "stamp", url + "/label", ["CREATE"], ["pods"]))
    world["admission"].create_validating_webhook_configuration(
        _pods_hook(world, "nope", url + "/deny", ["CREATE"], ["pods"]))
    core = kubernetes.client.CoreV1Api(world["client"])
    spec = {"containers": [{"name": "c", "image": "busybox"}]}
    created = core.create_namespaced_pod("default", {"metadata": {"name": "stamped", "labels": {"probe": "stamp"}},
                                                     "spec": spec})
    assert created.metadata.labels == {"stamped": "yes"}  # the webhook's JSONPatch replaced the labels
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("default", {"metadata": {"name": "denied", "labels": {"probe": "nope"}},
                                               "spec": spec})
    assert err.value.status == 400
    assert error_body(err.value)["message"] == ('admission webhook "nope.probe.example.com" denied the request '
                                                "without explanation")


def test_discovery_serves_the_admissionregistration_group(world: dict[str, Any]) -> None:
    resources = kubernetes.client.AdmissionregistrationV1Api(world["client"]).get_api_resources()
    names = {r.name: r for r in resources.resources}
    assert not names["mutatingwebhookconfigurations"].namespaced
    assert names["validatingwebhookconfigurations"].kind == "ValidatingWebhookConfiguration"


def test_a_webhook_may_read_from_the_server_while_it_reviews_a_create(world: dict[str, Any], recorder: Any) -> None:
    url, seen = recorder
    world["admission"].create_validating_webhook_configuration(
        _pods_hook(world, "cb", url + "/callback", ["CREATE"], ["pods"]))
    core = kubernetes.client.CoreV1Api(world["client"])
    start = time.monotonic()
    core.create_namespaced_pod("default", {"metadata": {"name": "cb", "labels": {"probe": "cb"}},
                                           "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    assert time.monotonic() - start < 5 and len(seen) == 1  # no deadlock, no timeout: admitted at once


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_prints_the_webhooks_warning_and_denial(world: dict[str, Any], tmp_path: Any) -> None:
    import subprocess

    import yaml

    kc = world["srv"].write_kubeconfig(str(tmp_path / "kubeconfig"))

    def kubectl(obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(shutil.which("kubectl")), "--kubeconfig", kc, "create", "-f", "-"],
                              input=yaml.safe_dump(obj), capture_output=True, text=True, timeout=60)

    big = kubectl(vram_claim("200Gi", "kubectl-huge"))
    assert big.returncode == 0, big.stderr
    assert "Warning: gpuready: request 'gpu': no device has 200 GiB; the largest is NVIDIA H200" in big.stderr
    bad = kubectl(vram_claim("15Gi", "kubectl-bad", config=BAD_CONFIG))
    assert bad.returncode != 0
    assert 'admission webhook "validate.gpu.nvidia.com" denied the request: ' in bad.stderr, bad.stderr
    assert "spec.devices.config[0].opaque.parameters.sharing.strategy" in bad.stderr
