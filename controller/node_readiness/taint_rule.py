"""The readiness taint's rule: pure decisions over Node objects (no I/O).

A node carrying the readiness taint (default ``readiness.k8s.io/GPUReady=pending:NoSchedule``, the
key convention of the Node Readiness Controller) takes no pod that does not tolerate it, GPU pod or
not. The node's plugin writes the ``GPUReady`` condition; from it the controller's leader decides:

- ``bootstrap-only``: remove the taint once GPUReady is True. Nodes register with the taint
  (kubelet ``--register-with-taints``) and lose it when every GPU passed validation; it is never
  put back, so a GPU failing later is handled per device (withdrawn from the slices) as usual.
- ``continuous``: the same, and put the taint back whenever GPUReady turns False or Unknown, so a
  node with any GPU not ready takes no new pods at all.

A node without a GPUReady condition (no gpuready plugin, or one not started yet) is left as it is:
a GPU node registered with the taint keeps it until its plugin reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MODES = ("off", "bootstrap-only", "continuous")
DEFAULT_KEY = "readiness.k8s.io/GPUReady"
CONDITION_TYPE = "GPUReady"
REMOVE = "remove"
ADD = "add"

_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def taint_key_problem(key: str) -> str:
    """Why ``key`` is not a valid taint key (a qualified name: ``[prefix/]name``), or ''."""
    prefix, slash, name = key.rpartition("/")
    if not name or len(name) > 63 or not _NAME.match(name):
        return (f"{key!r}: the name part must be 1-63 characters of letters, digits, '-', '_' or '.', "
                f"starting and ending with a letter or digit")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"{key!r}: the prefix before '/' must be a DNS subdomain (lower case, at most 253 characters)"
    return ""


@dataclass(frozen=True)
class ReadinessTaint:
    """Which taint gates GPU nodes, and how the controller manages it."""

    mode: str = "off"  # one of MODES
    key: str = DEFAULT_KEY
    value: str = "pending"
    effect: str = "NoSchedule"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"--readiness-taint-mode {self.mode!r}: use {', '.join(MODES)}")
        problem = taint_key_problem(self.key)
        if problem:
            raise ValueError(f"--readiness-taint {problem}")
        if self.effect not in _EFFECTS:
            raise ValueError(f"readiness taint effect {self.effect!r}: use {', '.join(_EFFECTS)}")

    @property
    def enabled(self) -> bool:
        """Whether the controller manages the taint at all."""
        return self.mode != "off"

    def as_taint(self) -> dict[str, str]:
        """The taint as a Node's ``spec.taints`` entry."""
        return {"key": self.key, "value": self.value, "effect": self.effect}


@dataclass(frozen=True)
class GpuReady:
    """A Node's GPUReady condition."""

    status: str  # True | False | Unknown
    reason: str
    message: str


@dataclass(frozen=True)
class TaintChange:
    """What to write to one Node: its whole new ``spec.taints``, conditional on ``resource_version``."""

    node: str
    action: str  # REMOVE | ADD
    taints: list[dict[str, Any]]
    resource_version: str
    why: GpuReady


def gpu_ready(node: dict[str, Any]) -> GpuReady | None:
    """The node's GPUReady condition, or None when it has none."""
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == CONDITION_TYPE:
            return GpuReady(str(cond.get("status") or "Unknown"), str(cond.get("reason") or ""),
                            str(cond.get("message") or ""))
    return None


def has_taint(node: dict[str, Any], key: str) -> bool:
    """Whether the node carries a taint with ``key`` (any value or effect)."""
    return any(t.get("key") == key for t in (node.get("spec") or {}).get("taints") or [])


def taint_change(node: dict[str, Any], rule: ReadinessTaint) -> TaintChange | None:
    """The change the rule asks of ``node`` now, or None when it is as it should be."""
    meta = node.get("metadata") or {}
    if not rule.enabled or meta.get("deletionTimestamp"):
        return None
    ready = gpu_ready(node)
    if ready is None:
        return None
    taints: list[dict[str, Any]] = list((node.get("spec") or {}).get("taints") or [])
    tainted = has_taint(node, rule.key)
    rv = str(meta.get("resourceVersion") or "")
    name = str(meta.get("name") or "")
    if ready.status == "True" and tainted:
        return TaintChange(name, REMOVE, [t for t in taints if t.get("key") != rule.key], rv, ready)
    if ready.status != "True" and not tainted and rule.mode == "continuous":
        return TaintChange(name, ADD, [*taints, rule.as_taint()], rv, ready)
    return None
