"""API-server failures while fetching a claim, as per-claim errors a person can act on.

Each gets its own ``reason`` (the ``gpuready_prepare_errors_total`` label): a missing permission is
an operator's fix, an overloaded or unreachable API server is transient (the kubelet retries the
prepare), and neither is an internal error of the plugin.
"""

from __future__ import annotations

from dra_driver.kube_api import describe_error, is_unreachable
from kubelet_plugin.prepare.claim_plan import PrepareError

RETRY = "the kubelet retries the prepare; nothing was prepared"


def api_failure(exc: BaseException, namespace: str, name: str) -> PrepareError | None:
    """The :class:`PrepareError` for an exception raised while reading ResourceClaim ``namespace/name``
    from the API server, or None when it is not an API-server failure."""
    ref = f"ResourceClaim {namespace}/{name}"
    status = getattr(exc, "status", None)
    if isinstance(status, int) and hasattr(exc, "reason"):  # an answer (ApiError, or the client's ApiException)
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else f"HTTP {status}"
        if status == 403:
            return PrepareError("forbidden", f"reading {ref} was refused by the API server ({detail}): the kubelet "
                                "plugin's ServiceAccount is missing the permission to get resourceclaims "
                                f"(apiGroup resource.k8s.io) in namespace {namespace}; grant 'get' on "
                                "'resourceclaims' to it (the Helm chart's ClusterRole has it)")
        if status == 401:
            return PrepareError("unauthorized", f"reading {ref}: the API server rejected the kubelet plugin's "
                                f"credentials ({detail}); check its ServiceAccount token or kubeconfig")
        if status == 404:
            return PrepareError("claim_not_found", f"{ref} not found ({detail})")
        if status == 429 or status >= 500:
            return PrepareError("api_unavailable", f"reading {ref}: the API server is overloaded or failing "
                                f"({detail}); {RETRY}")
        return PrepareError("api_error", f"reading {ref}: the API server answered {detail}; {RETRY}")
    if is_unreachable(exc):
        return PrepareError("api_unavailable", f"reading {ref}: {describe_error(exc)}; {RETRY}")
    return None
