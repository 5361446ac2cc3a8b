"""Which prepared claims' CDI specs must be rewritten for the node's driver files now, and to what (pure).

A claim's spec mounts the NVIDIA driver's files by their versioned names (``libcuda.so.580.159.04``),
found when the claim was prepared. After a driver reload or upgrade those files are gone and the new
version's are in their place: a container of a running pod that restarts would fail on a mount whose
source no longer exists. So every prepared claim gets its spec-level edits (control device nodes,
driver mounts, the loader-cache hook) replaced by the node's current ones; its devices' edits (device
nodes, ``NVIDIA_VISIBLE_DEVICES``, the claim's config, its MPS daemon) are kept. A claim whose device
the node no longer lists is left alone: its device is reported unhealthy the usual way, and a spec for
a device that is gone cannot be made right by new mounts.

No I/O: :mod:`kubelet_plugin.prepare.driver_reload` writes the files and the checkpoint.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from kubelet_plugin.cdi.cdi_spec import with_node_edits
from kubelet_plugin.checkpoint.records import ClaimRecord, ClaimState

UNCHANGED = "spec already names the node's driver files"


@dataclass(frozen=True)
class NodeEdits:
    """The spec-level edits every claim of this node gets now (see :func:`~kubelet_plugin.cdi.cdi_spec.node_edits`)."""

    control_device_nodes: tuple[str, ...]
    mounts: tuple[Mapping[str, Any], ...] = ()
    hooks: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class SpecRewrite:
    """What to do with one claim's spec: ``spec`` the new one to write, or None with ``reason`` why not."""

    uid: str
    spec: dict[str, Any] | None
    reason: str

    @property
    def skipped(self) -> bool:
        """Not rewritten for a reason worth a log line (not merely already up to date)."""
        return self.spec is None and self.reason != UNCHANGED


def plan_spec_rewrite(record: ClaimRecord, present: Collection[str], edits: NodeEdits) -> SpecRewrite:
    """The rewrite of one claim's spec; ``present``: the device names the node lists now."""
    if record.state is not ClaimState.PREPARE_COMPLETED:
        return SpecRewrite(record.uid, None, "prepare not completed (recovery or the kubelet's retry decides)")
    spec = record.cdi_spec
    if not isinstance(spec, dict) or not isinstance(spec.get("devices"), list):
        return SpecRewrite(record.uid, None, "no CDI spec recorded")
    gone = sorted({d for d in record.devices if d not in present})
    if gone:
        return SpecRewrite(record.uid, None, f"device no longer on the node: {', '.join(gone)} (reported unhealthy)")
    fresh = with_node_edits(spec, edits.control_device_nodes, edits.mounts, edits.hooks)
    if fresh == spec:
        return SpecRewrite(record.uid, None, UNCHANGED)
    return SpecRewrite(record.uid, fresh, _what_changed(spec, fresh))


def _mount_sources(spec: Mapping[str, Any]) -> set[str]:
    edits = spec.get("containerEdits") or {}
    return {str(m.get("hostPath")) for m in edits.get("mounts") or () if isinstance(m, dict)}


def _listed(paths: set[str]) -> str:
    names = sorted(p.rsplit("/", 1)[-1] for p in paths)
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "") if names else "none"


def _what_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """For the log: the driver files that went and came, else which edits changed."""
    before, after = _mount_sources(old), _mount_sources(new)
    if before != after:
        return f"driver files changed: gone {_listed(before - after)}; new {_listed(after - before)}"
    return "node-wide edits changed (control device nodes or the loader-cache hook)"
