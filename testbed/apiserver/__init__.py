"""A local Kubernetes API server: one process, real HTTP, the kinds gpuready touches.

Usage::

    from testbed.apiserver import LocalApiServer

    with LocalApiServer() as srv:              # binds 127.0.0.1 on a free port
        api = kubernetes.client.ResourceV1Api(srv.api_client())
        srv.faults.fail_next(2, code=503, verb="create", resource="resourceslices")

Served: resource.k8s.io/v1 ResourceSlice, DeviceClass, ResourceClaim (+status), ResourceClaimTemplate;
core/v1 Node (+status), Pod (+status, +eviction), Event, Namespace (+status); coordination.k8s.io/v1 Lease;
events.k8s.io/v1 Event; admissionregistration.k8s.io/v1 Mutating/ValidatingWebhookConfiguration, whose
webhooks it calls over HTTPS on matching writes like kube-apiserver (admission.py; register gpuready's
with ``webhook_configs.gpuready_webhook_configurations``); discovery and /version. See docs/architecture.md (the testbed).
"""

from testbed.apiserver.errors import ApiError
from testbed.apiserver.faults import Faults
from testbed.apiserver.server import LocalApiServer
from testbed.apiserver.store import Store

__all__ = ["ApiError", "Faults", "LocalApiServer", "Store"]
