"""gpuready's webhook configurations as the Helm chart renders them (deploy/helm/gpuready/templates/
webhook.yaml), pointed at a URL instead of the in-cluster Service: for registering a controller's
webhooks with the local API server (the demo and the tests)."""

from __future__ import annotations

import base64
from typing import Any


def _claim_devices_field(field: str) -> str:
    """CEL: the ``devices.<field>`` list of a ResourceClaim or ResourceClaimTemplate (``[]`` if absent)."""
    return (f"(has(object.spec.devices) && has(object.spec.devices.{field}) ? object.spec.devices.{field} : "
            f"has(object.spec.spec) && has(object.spec.spec.devices) && has(object.spec.spec.devices.{field}) ? "
            f"object.spec.spec.devices.{field} : [])")


# CEL: a quantity's text that is zero or negative (-1Gi, 0, 0.0, +0Mi, 0e3).
NOT_POSITIVE = "matches('^(-.*|[+]?[0.]+([eE][-+]?[0-9]+)?[a-zA-Z]*)$')"


def _no_vram(classes: str) -> str:
    """CEL: a request (``exactly`` or a ``firstAvailable`` entry) of ``classes`` asking for VRAM that is
    not positive (the validating webhook refuses it)."""
    return (_claim_devices_field("requests") + f" .exists(r, has(r.exactly) && r.exactly.deviceClassName in {classes} && "
            "has(r.exactly.capacity) && has(r.exactly.capacity.requests) && 'memory' in r.exactly.capacity.requests && "
            f"string(r.exactly.capacity.requests['memory']).{NOT_POSITIVE} || "
            f"has(r.firstAvailable) && r.firstAvailable.exists(s, s.deviceClassName in {classes} && "
            "has(s.capacity) && has(s.capacity.requests) && 'memory' in s.capacity.requests && "
            f"string(s.capacity.requests['memory']).{NOT_POSITIVE}))")


def match_conditions(driver: str, vram_class: str) -> dict[str, list[dict[str, str]]]:
    """The chart's matchConditions per webhook name: each webhook is called only for what it acts on."""
    label = driver.replace(".", "-")
    opaque = f"c.opaque.driver == '{driver}'"
    domain = driver.split(".", 1)[1] if driver.count(".") >= 2 else driver
    classes = f"['{driver}', 'mig.{domain}', '{vram_class}']"
    return {
        f"mutate.{driver}": [{"name": f"requests-{vram_class.replace('.', '-')}", "expression":
                              _claim_devices_field("requests") + " .exists(r, has(r.exactly) && "
                              f"r.exactly.deviceClassName == '{vram_class}')"}],
        f"validate.{driver}": [{"name": f"opaque-config-or-no-vram-for-{label}", "expression":
                                _claim_devices_field("config") + f" .exists(c, has(c.opaque) && {opaque}) || "
                                + _no_vram(classes)}],
        f"validate-deviceclass.{driver}": [{"name": f"opaque-config-for-{label}", "expression":
                                            f"has(object.spec.config) && object.spec.config.exists(c, "
                                            f"has(c.opaque) && {opaque})"}],
    }


KUBE_SYSTEM_SKIPPED = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                             "values": ["kube-system"]}]}


def gpuready_webhook_configurations(url: str, ca_pem: bytes, driver: str = "gpu.nvidia.com",
                                    name: str = "gpuready-webhook", release: str = "gpuready",
                                    timeout_seconds: int = 5) -> list[dict[str, Any]]:
    """The MutatingWebhookConfiguration and ValidatingWebhookConfiguration of the chart (default
    values), calling ``url`` (``https://host:port`` of the controller's webhook server) with
    ``ca_pem`` as the caBundle."""
    ca = base64.b64encode(ca_pem).decode()
    base = url.rstrip("/")

    conditions = match_conditions(driver, f"vram.{driver}")

    def hook(hook_name: str, path: str, policy: str, operations: list[str], resources: list[str], scope: str,
             **extra: Any) -> dict[str, Any]:
        return {"name": hook_name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": policy, "timeoutSeconds": timeout_seconds, "matchPolicy": "Equivalent",
                **extra, "matchConditions": conditions[hook_name],
                "clientConfig": {"url": base + path, "caBundle": ca},
                "rules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": operations,
                           "resources": resources, "scope": scope}]}

    claims = ["resourceclaims", "resourceclaimtemplates"]
    mutating = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": name},
                "webhooks": [hook(f"mutate.{driver}", "/mutate", "Ignore", ["CREATE"], claims, "Namespaced",
                                  reinvocationPolicy="Never", namespaceSelector=KUBE_SYSTEM_SKIPPED)]}
    validating = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                  "metadata": {"name": name},
                  "webhooks": [
                      hook(f"validate.{driver}", "/validate", "Fail", ["CREATE"], claims, "Namespaced",
                           namespaceSelector=KUBE_SYSTEM_SKIPPED),
                      hook(f"validate-deviceclass.{driver}", "/validate", "Fail", ["CREATE", "UPDATE"],
                           ["deviceclasses"], "Cluster",
                           objectSelector={"matchExpressions": [{"key": "app.kubernetes.io/instance",
                                                                 "operator": "NotIn", "values": [release]}]}),
                  ]}
    return [mutating, validating]
