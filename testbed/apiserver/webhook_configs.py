"""gpuready's webhook configurations as the Helm chart renders them (deploy/helm/gpuready/templates/
webhook.yaml), pointed at a URL instead of the in-cluster Service: for registering a controller's
webhooks with the local API server (the demo and the tests)."""

from __future__ import annotations

import base64
from typing import Any

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

    def hook(hook_name: str, path: str, policy: str, operations: list[str], resources: list[str], scope: str,
             **extra: Any) -> dict[str, Any]:
        return {"name": hook_name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": policy, "timeoutSeconds": timeout_seconds, "matchPolicy": "Equivalent",
                **extra, "clientConfig": {"url": base + path, "caBundle": ca},
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
