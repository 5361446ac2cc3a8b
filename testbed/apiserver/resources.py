"""The kinds the local API server serves: one row per resource, with what the URL router, the store and
discovery need to know about it (group, version, plural, kind, scope, subresources, field selectors)."""

from __future__ import annotations

from dataclasses import dataclass, field

RESOURCE_GROUP = "resource.k8s.io"
COORDINATION_GROUP = "coordination.k8s.io"
EVENTS_GROUP = "events.k8s.io"
ADMISSION_GROUP = "admissionregistration.k8s.io"

_STD_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceType:
    """One served resource (e.g. resource.k8s.io/v1 resourceslices)."""

    group: str  # "" for core
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str
    short_names: tuple[str, ...] = ()
    # Subresources served besides the object itself ("status"; eviction is handled separately).
    has_status: bool = False
    # Field selector labels the real apiserver accepts for this kind (metadata.name is always accepted,
    # metadata.namespace when namespaced).
    field_labels: tuple[str, ...] = ()
    verbs: tuple[str, ...] = _STD_VERBS
    storage_hash: str = ""
    categories: tuple[str, ...] = field(default_factory=tuple)

    @property
    def group_version(self) -> str:
        """``apiVersion`` of objects of this kind."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """Store key: the plural, qualified by group where two groups share a plural."""
        if self.group == EVENTS_GROUP:
            return f"{self.plural}.{self.group}"
        return self.plural

    @property
    def qualified_plural(self) -> str:
        """``resourceslices.resource.k8s.io`` as used in NotFound/AlreadyExists messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        """``ResourceSlice.resource.k8s.io`` as used in Invalid messages."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    def supported_field_labels(self) -> tuple[str, ...]:
        """All field selector labels accepted for this kind."""
        base: tuple[str, ...] = ("metadata.name",)
        if self.namespaced:
            base += ("metadata.namespace",)
        return base + self.field_labels


RESOURCES: tuple[ResourceType, ...] = (
    ResourceType(RESOURCE_GROUP, "v1", "deviceclasses", "DeviceClass", False, "deviceclass",
                 storage_hash="Yk2PTc1Ybxk="),
    ResourceType(RESOURCE_GROUP, "v1", "resourceclaims", "ResourceClaim", True, "resourceclaim",
                 has_status=True, storage_hash="wgAZaHcZxUg="),
    ResourceType(RESOURCE_GROUP, "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True,
                 "resourceclaimtemplate", storage_hash="TuzjC49aUfM="),
    ResourceType(RESOURCE_GROUP, "v1", "resourceslices", "ResourceSlice", False, "resourceslice",
                 field_labels=("spec.nodeName", "spec.driver", "spec.pool.name"), storage_hash="KsC072WgaEY="),
    # Kubernetes 1.36 serves DeviceTaintRule at v1beta2 (v1 in 1.37).
    ResourceType(RESOURCE_GROUP, "v1beta2", "devicetaintrules", "DeviceTaintRule", False, "devicetaintrule",
                 has_status=True),
    ResourceType("", "v1", "events", "Event", True, "event", short_names=("ev",),
                 field_labels=("involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                               "involvedObject.uid", "involvedObject.apiVersion",
                               "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
                               "reportingComponent", "source", "type"),
                 storage_hash="r2yiGXH7wu8="),
    ResourceType("", "v1", "namespaces", "Namespace", False, "namespace", short_names=("ns",),
                 has_status=True, field_labels=("status.phase",),
                 verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
                 storage_hash="Q3oi5N2YM8M="),
    ResourceType("", "v1", "nodes", "Node", False, "node", short_names=("no",), has_status=True,
                 field_labels=("spec.unschedulable",), storage_hash="XwShjMxG9Fs="),
    ResourceType("", "v1", "pods", "Pod", True, "pod", short_names=("po",), has_status=True,
                 field_labels=("spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                               "spec.serviceAccountName", "spec.hostNetwork", "status.phase",
                               "status.podIP", "status.nominatedNodeName"),
                 storage_hash="xPOwRZ+Yhw8=", categories=("all",)),
    ResourceType(COORDINATION_GROUP, "v1", "leases", "Lease", True, "lease", storage_hash="gqkMMb/YqFM="),
    ResourceType(EVENTS_GROUP, "v1", "events", "Event", True, "event", short_names=("ev",),
                 storage_hash="r2yiGXH7wu8="),
    # Admission webhooks the server calls on writes (admission.py).
    ResourceType(ADMISSION_GROUP, "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", False,
                 "mutatingwebhookconfiguration", categories=("api-extensions",)),
    ResourceType(ADMISSION_GROUP, "v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration",
                 False, "validatingwebhookconfiguration", categories=("api-extensions",)),
)

BY_KEY: dict[str, ResourceType] = {r.key: r for r in RESOURCES}


def lookup(group: str, version: str, plural: str) -> ResourceType | None:
    """The resource served at ``/apis/<group>/<version>/<plural>`` (group "" = core), or None."""
    for r in RESOURCES:
        if r.group == group and r.version == version and r.plural == plural:
            return r
    return None


def resource_for_key(key: str) -> ResourceType:
    """The resource with store key ``key`` (e.g. "resourceslices"); KeyError names the known keys."""
    try:
        return BY_KEY[key]
    except KeyError:
        raise KeyError(f"unknown resource {key!r}; known: {', '.join(sorted(BY_KEY))}") from None
