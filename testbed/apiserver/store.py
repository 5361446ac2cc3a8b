"""The object store: every object as a plain dict, one global resourceVersion counter (like etcd), the
event history and watch fan-out, and owner-reference garbage collection.

Thread model: one re-entrant lock guards objects, the counter, history and the watcher set; HTTP handler
threads call in concurrently.

Stored objects are immutable: every write stores a new dict and nothing mutates a stored one, so the
history, watchers and HTTP answers share them. Each stored object's JSON is encoded once, when it is
written, and those bytes serve every GET, LIST and watch event until the next write. Methods for direct
callers (tests, the demo) copy what goes in and what comes out; the HTTP handler passes ``shared=True``:
it hands its freshly parsed body over and gets the stored object itself, which it only serialises.
Garbage collection runs on its own thread (gc.py), so a delete answers at once.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from testbed.apiserver import errors
from testbed.apiserver.gc import GcQueue
from testbed.apiserver.jsoncopy import copy_json, encode
from testbed.apiserver.patches import APPLY_PATCH, apply_patch
from testbed.apiserver.resources import RESOURCES, ResourceType, resource_for_key
from testbed.apiserver.selectors import (
    decode_continue,
    encode_continue,
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
)
from testbed.apiserver.timestamps import now_rfc3339
from testbed.apiserver.watch import (
    ADDED,
    BOOKMARK,
    DELETED,
    MODIFIED,
    Event,
    History,
    Watcher,
    bookmark_object,
)

Obj = dict[str, Any]
ObjList = list[Obj]  # alias: the Store.list method shadows the builtin inside the class
Key = tuple[str, str]  # (namespace or "", name)
Entries = list[tuple[Obj, bytes]]  # stored objects with their JSON
# Admission: (resource, new object, old object or None) -> None; raises ApiError (422) when invalid.
Admit = Callable[[ResourceType, Obj, Obj | None], None]

_GENERATED_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # the real server's generateName alphabet
_START_RV = 1000  # resourceVersions start high, so "1" is too old like on a long-running cluster
# Kinds whose metadata.generation the real server maintains.
_GENERATION_GROUPS = {"resource.k8s.io", "admissionregistration.k8s.io"}
_GENERATION_KINDS = {"Pod"}


class WriteWebhooks(Protocol):
    """What the store calls around each write: the admission webhooks (``admission.Webhooks``).

    Declared here, by the caller, because the webhooks read from the store (configurations,
    namespaces): the store depends only on this shape, so admission imports the store and not the
    other way round.
    """

    def mutate(self, rt: ResourceType, sub: str, operation: str, obj: Obj | None, old: Obj | None,
               dry_run: bool) -> Obj | None:
        """The object after the matching mutating webhooks (``obj`` itself when none patched it)."""
        ...

    def validate(self, rt: ResourceType, sub: str, operation: str, obj: Obj | None, old: Obj | None,
                 dry_run: bool) -> None:
        """Raise the ApiError of the first matching validating webhook that denies the write."""
        ...


def _spec_part(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "kind", "apiVersion")}


class Store:
    """Objects of every served kind, keyed by resource key (see ``ResourceType.key``)."""

    def __init__(self, history_limit: int = 1000, admit: Admit | None = None,
                 strict_namespaces: bool = False) -> None:
        self._lock = threading.RLock()
        self._rv = _START_RV
        self._objects: dict[str, dict[Key, Obj]] = {r.key: {} for r in RESOURCES}
        # The JSON of every stored object, encoded when it was stored (same keys as _objects).
        self._wire: dict[str, dict[Key, bytes]] = {r.key: {} for r in RESOURCES}
        self._history = History(history_limit, _START_RV)
        self._watchers: set[Watcher] = set()
        self._admit = admit
        self.webhooks: WriteWebhooks | None = None  # admission webhooks (set by LocalApiServer)
        # The real server refuses objects in a namespace that does not exist; off by default so tests
        # need not create namespaces first.
        self.strict_namespaces = strict_namespaces
        self._gc = GcQueue(self._collect)
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.create("namespaces", None, {"metadata": {"name": ns}})

    # ---- helpers -------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion handed out."""
        with self._lock:
            return self._rv

    def _bump(self) -> int:
        self._rv += 1
        return self._rv

    def _emit(self, key: str, typ: str, obj: Obj, old: Obj | None = None, raw: bytes | None = None) -> None:
        # Stored objects are never mutated in place (every write stores a new dict), so events and
        # watchers can share them without copying; ``raw`` is the object's JSON when already encoded.
        ev = Event(int(obj["metadata"]["resourceVersion"]), key, typ, obj, old, raw)
        self._history.append(ev)
        for w in list(self._watchers):
            w.offer(ev)

    def _bucket(self, rt: ResourceType) -> dict[Key, Obj]:
        return self._objects[rt.key]

    def _store(self, rt: ResourceType, k: Key, obj: Obj) -> bytes:
        """Store ``obj`` (which nobody may mutate from now on) and encode its JSON once."""
        raw = encode(obj)
        self._objects[rt.key][k] = obj
        self._wire[rt.key][k] = raw
        return raw

    def _unstore(self, rt: ResourceType, k: Key) -> None:
        self._objects[rt.key].pop(k, None)
        self._wire[rt.key].pop(k, None)

    def encoded(self, key: str, obj: Obj) -> bytes:
        """The JSON bytes of ``obj``: the bytes encoded at write time when ``obj`` is the stored object
        (as ``shared=True`` answers are), else a fresh encoding."""
        meta = obj.get("metadata") or {}
        k = (meta.get("namespace") or "", meta.get("name"))  # cluster-scoped objects have no namespace
        with self._lock:
            if self._objects[key].get(k) is obj:  # type: ignore[arg-type]
                return self._wire[key][k]  # type: ignore[index]
        return encode(obj)

    @staticmethod
    def _ns(rt: ResourceType, namespace: str | None) -> str:
        return (namespace or "") if rt.namespaced else ""

    def _generate_name(self, rt: ResourceType, ns: str, prefix: str) -> str:
        for _ in range(100):
            name = prefix + "".join(random.choice(_GENERATED_CHARS) for _ in range(5))
            if (ns, name) not in self._bucket(rt):
                return name
        raise errors.ApiError(409, "AlreadyExists", f"could not generate a unique name from {prefix!r}")

    # ---- reads ---------------------------------------------------------------------------------

    def get(self, key: str, namespace: str | None, name: str) -> Obj:
        """A copy of one object; ApiError 404 when absent."""
        return copy_json(self.get_shared(key, namespace, name)[0])

    def get_shared(self, key: str, namespace: str | None, name: str) -> tuple[Obj, bytes]:
        """The stored object itself (read-only: never mutate it) and its JSON; ApiError 404 when absent."""
        rt = resource_for_key(key)
        k = (self._ns(rt, namespace), name)
        with self._lock:
            obj = self._bucket(rt).get(k)
            if obj is None:
                raise errors.not_found(rt, name)
            return obj, self._wire[rt.key][k]

    def list(self, key: str, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> ObjList:
        """Copies of matching objects sorted by namespace/name (direct access for tests and the demo)."""
        return self.list_with_rv(key, namespace, label_selector, field_selector)[0]

    def list_with_rv(self, key: str, namespace: str | None = None, label_selector: str | None = None,
                     field_selector: str | None = None, limit: int = 0,
                     continue_token: str | None = None, copy_items: bool = True) -> tuple[ObjList, int, str | None]:
        """Matching objects, the list resourceVersion and a continue token when ``limit`` cut it short.
        ``copy_items=False`` returns the stored dicts themselves (never mutated in place: every write
        stores a new dict) for callers that only serialise them."""
        entries, rv, token = self.list_shared(key, namespace, label_selector, field_selector, limit,
                                              continue_token)
        return [copy_json(o) if copy_items else o for o, _ in entries], rv, token

    def list_shared(self, key: str, namespace: str | None = None, label_selector: str | None = None,
                    field_selector: str | None = None, limit: int = 0,
                    continue_token: str | None = None) -> tuple[Entries, int, str | None]:
        """Like ``list_with_rv`` but each match is the stored object itself (read-only) with its JSON."""
        rt = resource_for_key(key)
        labels = parse_label_selector(label_selector)
        fields = parse_field_selector(field_selector, rt)
        start = decode_continue(continue_token)
        with self._lock:
            out: Entries = []
            wire = self._wire[rt.key]
            token, last = None, ("", "")
            for k in sorted(self._bucket(rt)):
                if start is not None and k <= start:
                    continue
                obj = self._bucket(rt)[k]
                if namespace is not None and rt.namespaced and k[0] != namespace:
                    continue
                if not (labels_match(labels, obj) and fields_match(fields, obj)):
                    continue
                if limit and len(out) >= limit:
                    token = encode_continue(last)
                    break
                out.append((obj, wire[k]))
                last = k
            return out, self._rv, token

    # ---- writes --------------------------------------------------------------------------------
    # ``shared=True`` (the HTTP handler): the body is handed over (the store may keep it) and the answer
    # is the stored object itself, read-only; otherwise both are copied, so the caller's dicts and the
    # store's never alias.

    def create(self, key: str, namespace: str | None, body: Obj, dry_run: bool = False,
               shared: bool = False) -> Obj:
        """Create an object (fills uid, creationTimestamp, resourceVersion, generation, generateName)."""
        rt = resource_for_key(key)
        obj = body if shared else copy_json(body)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        obj["apiVersion"], obj["kind"] = rt.group_version, rt.kind
        ns = self._ns(rt, namespace)
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise errors.bad_request("the namespace of the provided object does not match the namespace "
                                         "sent on the request")
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        # Webhooks are called outside the lock on create (the common case: a webhook may read from this
        # server while it reviews); updates and deletes call them under the lock, serialised.
        if self.webhooks is not None:  # mutating webhooks see the object before the name is generated
            obj = self._checked(self.webhooks.mutate(rt, "", "CREATE", obj, None, dry_run))
            meta = obj["metadata"]
            obj["apiVersion"], obj["kind"] = rt.group_version, rt.kind
        with self._lock:
            if rt.namespaced and self.strict_namespaces and ("", ns) not in self._objects["namespaces"]:
                raise errors.not_found(resource_for_key("namespaces"), ns)
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = self._generate_name(rt, ns, meta["generateName"])
            for f in ("uid", "resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds",
                      "managedFields", "selfLink"):
                meta.pop(f, None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_rfc3339()
            if rt.group in _GENERATION_GROUPS or rt.kind in _GENERATION_KINDS:
                meta["generation"] = 1
            else:
                meta.pop("generation", None)
            if self._admit is not None:
                self._admit(rt, obj, None)
            name = meta["name"]
            if (ns, name) in self._bucket(rt):
                raise errors.already_exists(rt, name)
        if self.webhooks is not None:
            self.webhooks.validate(rt, "", "CREATE", obj, None, dry_run)
        with self._lock:
            if (ns, name) in self._bucket(rt):  # created meanwhile, while the webhooks ran
                raise errors.already_exists(rt, name)
            if dry_run:
                return obj
            meta["resourceVersion"] = str(self._bump())
            raw = self._store(rt, (ns, name), obj)
            self._emit(rt.key, ADDED, obj, raw=raw)
            return obj if shared else copy_json(obj)

    def update(self, key: str, namespace: str | None, name: str, body: Obj, subresource: str = "",
               dry_run: bool = False, shared: bool = False) -> Obj:
        """Replace an object (PUT). A body resourceVersion that is not current is a 409 Conflict."""
        rt = resource_for_key(key)
        meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else None
        if meta is None:
            raise errors.bad_request("metadata must be an object")
        if meta.get("name") not in (None, name):
            raise errors.bad_request(f"the name of the object ({meta.get('name')}) does not match the name on "
                                     f"the URL ({name})")
        with self._lock:
            current = self._bucket(rt).get((self._ns(rt, namespace), name))
            if current is None:
                raise errors.not_found(rt, name)
            rv = meta.get("resourceVersion")
            if rv and rv != current["metadata"]["resourceVersion"]:
                raise errors.conflict(rt, name)
            return self._commit(rt, current, body, subresource, dry_run, shared)

    def patch(self, key: str, namespace: str | None, name: str, content_type: str, patch: Any,
              subresource: str = "", dry_run: bool = False, shared: bool = False) -> Obj:
        """Apply a merge/JSON/strategic patch under the lock (read-modify-write cannot interleave)."""
        rt = resource_for_key(key)
        with self._lock:
            current = self._bucket(rt).get((self._ns(rt, namespace), name))
            if current is None:
                if content_type.split(";")[0].strip().lower() == APPLY_PATCH and isinstance(patch, dict) \
                        and not subresource:
                    # Server-side apply creates what does not exist yet.
                    body = patch if shared else copy_json(patch)
                    body.setdefault("metadata", {})["name"] = name
                    return self.create(key, namespace, body, dry_run=dry_run, shared=shared)
                raise errors.not_found(rt, name)
            patched = apply_patch(content_type, current, patch)
            if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
                raise errors.bad_request("the patch produced an object without metadata")
            if patched["metadata"].get("resourceVersion") not in (None, current["metadata"]["resourceVersion"]):
                raise errors.conflict(rt, name)
            if patched["metadata"].get("name") != name:
                raise errors.bad_request("the patch may not change metadata.name")
            # ``patched`` is a fresh tree, but may share parts of ``patch``: owned only when that was handed over.
            return self._commit(rt, current, patched, subresource, dry_run, shared)

    def _commit(self, rt: ResourceType, current: Obj, body: Obj, subresource: str, dry_run: bool,
                shared: bool) -> Obj:
        """Build the new object from ``body`` and ``current``, admit it and store it (lock held)."""
        new = body if shared else copy_json(body)
        if self.webhooks is not None:
            new = self._checked(self.webhooks.mutate(rt, subresource, "UPDATE", new, current, dry_run))
        old_meta = current["metadata"]
        if subresource == "status":
            # A status write changes only status (and nothing else), like the real status strategies.
            new = {**copy_json(current), "status": new.get("status")}
            if new["status"] is None:
                new.pop("status")
        elif rt.has_status:
            # A main-resource write cannot change status.
            new.pop("status", None)
            if "status" in current:
                new["status"] = copy_json(current["status"])
        new["apiVersion"], new["kind"] = rt.group_version, rt.kind
        meta = new.setdefault("metadata", {})
        for f in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                  "deletionGracePeriodSeconds", "generation"):
            if f in old_meta:
                meta[f] = old_meta[f]
            else:
                meta.pop(f, None)
        meta.pop("managedFields", None)
        meta["resourceVersion"] = old_meta["resourceVersion"]
        if "generation" in old_meta and _spec_part(new) != _spec_part(current):
            meta["generation"] = int(old_meta["generation"]) + 1
        if self._admit is not None:
            self._admit(rt, new, current)
        if self.webhooks is not None:
            self.webhooks.validate(rt, subresource, "UPDATE", new, current, dry_run)
        if new == current:
            # A no-op write does not bump the resourceVersion.
            return current if shared else copy_json(current)
        if dry_run:
            return new
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self._remove(rt, new, "Background", shared)
        meta["resourceVersion"] = str(self._bump())
        raw = self._store(rt, (meta.get("namespace", ""), meta["name"]), new)
        self._emit(rt.key, MODIFIED, new, current, raw)
        return new if shared else copy_json(new)

    @staticmethod
    def _checked(obj: Obj | None) -> Obj:
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
            raise errors.bad_request("an admission webhook's patch left the object without metadata")
        return obj

    def bind_pod(self, namespace: str | None, name: str, node: str) -> Obj:
        """pods/binding: set spec.nodeName once (409 if already bound) and mark the pod scheduled."""
        rt = resource_for_key("pods")
        with self._lock:
            current = self._bucket(rt).get((self._ns(rt, namespace), name))
            if current is None:
                raise errors.not_found(rt, name)
            spec = current.get("spec") or {}
            bound = spec.get("nodeName")
            why = (f'pod {name} is already assigned to node "{bound}"' if bound else
                   f"pod {name} has non-empty .spec.schedulingGates" if spec.get("schedulingGates") else None)
            if why:  # the real server's wording and 409 (a gated pod is not ready to be scheduled)
                raise errors.ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": {why}',
                                      {"name": name, "kind": "pods/binding"})
            new = copy_json(current)
            new.setdefault("spec", {})["nodeName"] = node
            conds = [c for c in (new.setdefault("status", {}).get("conditions") or [])
                     if c.get("type") != "PodScheduled"]
            conds.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                          "lastTransitionTime": now_rfc3339()})
            new["status"]["conditions"] = conds
            meta = new["metadata"]
            meta["resourceVersion"] = str(self._bump())
            raw = self._store(rt, (meta.get("namespace", ""), name), new)
            self._emit(rt.key, MODIFIED, new, current, raw)
            return copy_json(new)

    def delete(self, key: str, namespace: str | None, name: str, propagation: str | None = None,
               preconditions: dict[str, Any] | None = None, dry_run: bool = False, shared: bool = False) -> Obj:
        """Delete an object (or mark it deleting while it has finalizers); returns its last state."""
        rt = resource_for_key(key)

        def out(obj: Obj) -> Obj:
            return obj if shared else copy_json(obj)

        with self._lock:
            current = self._bucket(rt).get((self._ns(rt, namespace), name))
            if current is None:
                raise errors.not_found(rt, name)
            pre = preconditions or {}
            if pre.get("uid") and pre["uid"] != current["metadata"]["uid"]:
                raise errors.ApiError(409, "Conflict", f"Precondition failed: UID in precondition: {pre['uid']}, "
                                      f"UID in object meta: {current['metadata']['uid']}",
                                      {"name": name, "group": rt.group, "kind": rt.plural})
            if pre.get("resourceVersion") and pre["resourceVersion"] != current["metadata"]["resourceVersion"]:
                raise errors.conflict(rt, name)
            if self.webhooks is not None:  # DELETE reviews carry oldObject only; patches do not apply
                self.webhooks.mutate(rt, "", "DELETE", None, current, dry_run)
                self.webhooks.validate(rt, "", "DELETE", None, current, dry_run)
            if dry_run:
                return out(current)
            if current["metadata"].get("finalizers"):
                if current["metadata"].get("deletionTimestamp"):
                    return out(current)
                new = copy_json(current)
                new["metadata"]["deletionTimestamp"] = now_rfc3339()
                new["metadata"]["deletionGracePeriodSeconds"] = 0
                new["metadata"]["resourceVersion"] = str(self._bump())
                raw = self._store(rt, (self._ns(rt, namespace), name), new)
                self._emit(rt.key, MODIFIED, new, current, raw)
                return out(new)
            return self._remove(rt, current, propagation or "Background", shared)

    def _remove(self, rt: ResourceType, obj: Obj, propagation: str, shared: bool = False) -> Obj:
        meta = obj["metadata"]
        self._unstore(rt, (meta.get("namespace", ""), meta["name"]))
        gone = copy_json(obj)
        gone["metadata"]["resourceVersion"] = str(self._bump())
        self._emit(rt.key, DELETED, gone, raw=encode(gone))
        if propagation != "Orphan":
            self._gc.put(rt.kind, meta["uid"], meta["name"])
        return gone if shared else copy_json(gone)

    def delete_collection(self, key: str, namespace: str | None, label_selector: str | None,
                          field_selector: str | None) -> ObjList:
        """Delete every matching object; returns their last states."""
        with self._lock:
            items = self.list(key, namespace, label_selector, field_selector)
            return [self.delete(key, (o["metadata"].get("namespace")), o["metadata"]["name"]) for o in items]

    # ---- watch ---------------------------------------------------------------------------------

    def watch(self, key: str, namespace: str | None, label_selector: str | None, field_selector: str | None,
              resource_version: str | None, send_initial_events: bool = False) -> Watcher:
        """Open a watch. No resourceVersion (or "0"), or ``send_initial_events``: synthetic ADDED for
        current objects, then changes (with ``send_initial_events`` a BOOKMARK annotated
        ``k8s.io/initial-events-end`` marks the end of the initial state, as for client-go's WatchList).
        Otherwise every change after it; 410 Expired (raised as ApiError) when it was compacted away."""
        rt = resource_for_key(key)
        w = Watcher(rt, namespace if rt.namespaced else None, parse_label_selector(label_selector),
                    parse_field_selector(field_selector, rt))
        with self._lock:
            if send_initial_events or not resource_version or resource_version == "0":
                wire = self._wire[rt.key]
                for k in sorted(self._bucket(rt)):
                    obj = self._bucket(rt)[k]
                    w.offer(Event(int(obj["metadata"]["resourceVersion"]), rt.key, ADDED, obj, None, wire[k]))
                if send_initial_events:
                    end = bookmark_object(rt, self._rv)
                    end["metadata"]["annotations"] = {"k8s.io/initial-events-end": "true"}
                    w.queue.put((BOOKMARK, end, None))
            else:
                try:
                    rv = int(resource_version)
                except ValueError:
                    raise errors.bad_request(f"invalid resource version: {resource_version!r}") from None
                if rv < self._history.compacted_rv:
                    raise errors.expired(
                        f"too old resource version: {rv} ({self._history.compacted_rv + 1})")
                for ev in self._history.since(rv):
                    w.offer(ev)
            self._watchers.add(w)
        return w

    def bookmark_rv(self, w: Watcher) -> int | None:
        """The resourceVersion a BOOKMARK may carry now: only when ``w`` has nothing pending."""
        with self._lock:
            return self._rv if w.queue.empty() else None

    def unwatch(self, w: Watcher) -> None:
        """Forget a watcher whose stream ended."""
        with self._lock:
            self._watchers.discard(w)
        w.close()

    def drop_watches(self) -> int:
        """Close every open watch stream; returns how many were closed."""
        with self._lock:
            ws = list(self._watchers)
            self._watchers.clear()
        for w in ws:
            w.close()
        return len(ws)

    def compact(self) -> int:
        """Forget all history up to now: a watch from any older resourceVersion gets 410 Expired."""
        with self._lock:
            self._history.compact(self._rv)
            return self._rv

    # ---- garbage collection --------------------------------------------------------------------

    def _collect(self, kind: str, uid: str, name: str) -> None:
        with self._lock:
            live_uids = {o["metadata"]["uid"] for b in self._objects.values() for o in b.values()}
            for rt in RESOURCES:
                for obj in list(self._bucket(rt).values()):
                    meta = obj["metadata"]
                    if kind == "Namespace" and rt.namespaced and meta.get("namespace") == name:
                        self.delete(rt.key, meta["namespace"], meta["name"])
                        continue
                    refs = meta.get("ownerReferences") or []
                    if not any(r.get("uid") == uid for r in refs):
                        continue
                    if any(r.get("uid") in live_uids for r in refs if r.get("uid") != uid):
                        body = copy_json(obj)
                        body["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != uid]
                        self._commit(rt, obj, body, "", False, True)
                    else:
                        self.delete(rt.key, meta.get("namespace"), meta["name"])

    def wait_gc_idle(self, timeout: float = 5.0) -> bool:
        """Block until garbage collection has nothing left to do, cascades included (tests use it
        instead of sleeping); False on timeout."""
        return self._gc.wait_idle(timeout)

    def close(self) -> None:
        """Stop the GC thread and close every watch."""
        self.drop_watches()
        self._gc.close()
