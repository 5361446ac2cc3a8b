"""Server-side printing (``Accept: ...;as=Table;g=meta.k8s.io``): the columns ``kubectl get`` shows for
each kind, like the real server's printers."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

Obj = dict[str, Any]
Column = tuple[str, str, Callable[[Obj], Any]]  # name, type, cell


def wants_table(accept: str | None) -> bool:
    """Whether the client asked for a meta.k8s.io Table."""
    return bool(accept) and "as=Table" in (accept or "")


def _age(obj: Obj) -> str:
    ts = (obj.get("metadata") or {}).get("creationTimestamp")
    if not ts:
        return "<unknown>"
    created = datetime.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    secs = int((datetime.datetime.now(datetime.UTC) - created).total_seconds())
    if secs < 120:
        return f"{max(secs, 0)}s"
    if secs < 7200:
        return f"{secs // 60}m"
    if secs < 172800:
        return f"{secs // 3600}h"
    return f"{secs // 86400}d"


def _node_status(o: Obj) -> str:
    conds = {c.get("type"): c.get("status") for c in (o.get("status") or {}).get("conditions") or []}
    state = {"True": "Ready", "False": "NotReady"}.get(conds.get("Ready", ""), "Unknown")
    return state + (",SchedulingDisabled" if (o.get("spec") or {}).get("unschedulable") else "")


def _pod_ready(o: Obj) -> str:
    statuses = (o.get("status") or {}).get("containerStatuses") or []
    total = len((o.get("spec") or {}).get("containers") or [])
    return f"{sum(1 for s in statuses if s.get('ready'))}/{total}"


def _claim_state(o: Obj) -> str:
    st = o.get("status") or {}
    parts = []
    if (o.get("metadata") or {}).get("deletionTimestamp"):
        parts.append("deleted")
    parts.append("allocated" if st.get("allocation") else "pending")
    if st.get("reservedFor"):
        parts.append("reserved")
    return ",".join(parts)


def _name(o: Obj) -> str:
    return str((o.get("metadata") or {}).get("name", ""))


_COLUMNS: dict[str, list[Column]] = {
    "ResourceSlice": [("Node", "string", lambda o: (o.get("spec") or {}).get("nodeName", "")),
                      ("Driver", "string", lambda o: (o.get("spec") or {}).get("driver", "")),
                      ("Pool", "string", lambda o: ((o.get("spec") or {}).get("pool") or {}).get("name", ""))],
    "Node": [("Status", "string", _node_status)],
    "Pod": [("Ready", "string", _pod_ready),
            ("Status", "string", lambda o: (o.get("status") or {}).get("phase", "")),
            ("Node", "string", lambda o: (o.get("spec") or {}).get("nodeName", "<none>"))],
    "ResourceClaim": [("State", "string", _claim_state)],
    "Namespace": [("Status", "string", lambda o: (o.get("status") or {}).get("phase", ""))],
    "Lease": [("Holder", "string", lambda o: (o.get("spec") or {}).get("holderIdentity", ""))],
    "Event": [("Type", "string", lambda o: o.get("type", "")), ("Reason", "string", lambda o: o.get("reason", "")),
              ("Object", "string", lambda o: f"{(o.get('involvedObject') or {}).get('kind', '').lower()}/"
                                             f"{(o.get('involvedObject') or {}).get('name', '')}"),
              ("Message", "string", lambda o: o.get("message", ""))],
}


def table(kind: str, objs: list[Obj], list_meta: Obj | None = None) -> Obj:
    """A meta.k8s.io/v1 Table of ``objs`` (rows carry PartialObjectMetadata, as kubectl expects)."""
    cols: list[Column] = [("Name", "string", _name), *_COLUMNS.get(kind, []), ("Age", "string", _age)]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta or {},
        "columnDefinitions": [{"name": n, "type": t, "format": "name" if n == "Name" else "", "description": n,
                               "priority": 0} for n, t, _ in cols],
        "rows": [{"cells": [f(o) for _, _, f in cols],
                  "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": o.get("metadata") or {}}} for o in objs],
    }
