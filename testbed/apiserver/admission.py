"""Admission webhooks, called the way kube-apiserver calls them.

The store calls :meth:`Webhooks.mutate` before its own defaulting and validation of a write, and
:meth:`Webhooks.validate` after it; what the validating webhooks saw is exactly what is stored. On
create both run outside the store lock (a webhook may read from this server while it reviews); on
update and delete they run under it, so those writes wait for a slow webhook. For each registered webhook whose rules (operations, apiGroups,
apiVersions, resources with subresources, scope), namespaceSelector, objectSelector and
``matchConditions`` (CEL, :mod:`testbed.apiserver.match_conditions`) match, an
``admission.k8s.io/v1`` AdmissionReview is POSTed over HTTPS to ``clientConfig.url`` (or the URL the
``service_resolver`` gives for ``clientConfig.service``), the certificate checked against
``caBundle``, within ``timeoutSeconds``:

- mutating webhooks in order (configurations by name, webhooks in their listed order, as the real
  server does); a ``JSONPatch`` answer is applied before the next webhook sees the object.
  ``reinvocationPolicy: IfNeeded`` is accepted but not honoured: each webhook runs once.
- validating webhooks in the same order, one at a time (the real server runs them in parallel; the
  first denial in order is reported).
- a denial answers the webhook's status: ``admission webhook "<name>" denied the request: <message>``
  with its code (400 when it gave none below 400).
- a call that fails (refused, TLS, timeout, bad answer) is skipped under ``failurePolicy: Ignore`` and
  answers 500 ``Internal error occurred: failed calling webhook "<name>": ...`` under ``Fail``.
- ``warnings`` collect per request thread; the HTTP handler sends them as ``Warning: 299 - "..."``.

Webhooks are never called for the webhook configurations themselves (as on the real server, so a
broken webhook can always be removed).
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from dra_driver.logs import get_logger
from testbed.apiserver import errors, match_conditions
from testbed.apiserver.patches import json_patch
from testbed.apiserver.resources import ADMISSION_GROUP, ResourceType
from testbed.apiserver.validation import webhooks as config

if TYPE_CHECKING:
    from testbed.apiserver.store import Store

log = get_logger(__name__)

Obj = dict[str, Any]
# (namespace, name, port) of a clientConfig.service -> the https URL (without the path) that reaches it.
ServiceResolver = Callable[[str, str, int], str]
USER = {"username": "system:admin", "uid": "local-admin", "groups": ["system:masters", "system:authenticated"]}
_OPTIONS = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}
_local = threading.local()


# ---- per-request warnings ------------------------------------------------------------------------

def begin_request() -> None:
    """Start collecting warnings for the request this thread serves."""
    _local.warnings = []


def take_warnings() -> list[str]:
    """The warnings collected since :func:`begin_request` (and forget them)."""
    out: list[str] = getattr(_local, "warnings", None) or []
    _local.warnings = []
    return out


def _warn(text: str) -> None:
    if not hasattr(_local, "warnings"):
        _local.warnings = []
    if text not in _local.warnings:  # the real server de-duplicates too
        _local.warnings.append(text)


def warning_header(text: str) -> str:
    """The ``Warning`` header value for ``text`` (RFC 7234 warn-code 299, quoted, as the real server)."""
    clean = "".join(c if c.isprintable() else " " for c in text)
    return '299 - "' + clean.replace("\\", "\\\\").replace('"', '\\"') + '"'


# ---- matching -------------------------------------------------------------------------------------

def selector_matches(sel: Any, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector (matchLabels, matchExpressions) against ``labels``; empty matches all."""
    if not sel:
        return True
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in sel.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def _resource_matches(patterns: list[str], resource: str, sub: str) -> bool:
    # As the real matcher: "res" is (res, ""), "res/*" any subresource of res (and res itself), "*/*" all.
    for p in patterns:
        res, _, psub = p.partition("/")
        if res in ("*", resource) and psub in ("*", sub):
            return True
    return False


def rule_matches(rule: Obj, rt: ResourceType, sub: str, operation: str) -> bool:
    """Whether one RuleWithOperations matches a request."""
    def has(field: str, value: str) -> bool:
        values = rule.get(field) or []
        return "*" in values or value in values

    scope = rule.get("scope") or "*"
    if (scope == "Cluster" and rt.namespaced) or (scope == "Namespaced" and not rt.namespaced):
        return False
    return (has("operations", operation) and has("apiGroups", rt.group) and has("apiVersions", rt.version)
            and _resource_matches(list(rule.get("resources") or []), rt.plural, sub))


def _labels(obj: Obj | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("labels") or {})


class _CallError(Exception):
    """A webhook could not be called or gave an unusable answer (failurePolicy decides)."""


class Webhooks:
    """The webhook dispatcher of one store (see module docstring); the store calls it as its
    :class:`~testbed.apiserver.store.WriteWebhooks`."""

    def __init__(self, store: Store, service_resolver: ServiceResolver | None = None) -> None:
        self.store = store
        self.service_resolver = service_resolver
        self._pool: dict[tuple[str, int, bytes], list[http.client.HTTPSConnection]] = {}
        self._contexts: dict[bytes, ssl.SSLContext] = {}
        self._pool_lock = threading.Lock()

    # ---- the store's entry points -------------------------------------------------------------------

    def mutate(self, rt: ResourceType, sub: str, operation: str, obj: Obj | None, old: Obj | None,
               dry_run: bool) -> Obj | None:
        """Run the matching mutating webhooks; returns the (possibly patched) object."""
        if rt.group == ADMISSION_GROUP:
            return obj
        for hook in self._matching("mutatingwebhookconfigurations", rt, sub, operation, obj, old):
            response = self._call(hook, rt, sub, operation, obj, old, dry_run)
            if response is None or obj is None or not response.get("patch"):
                continue
            try:
                if response.get("patchType") != "JSONPatch":
                    raise _CallError(f'webhook returned a patch with patchType {response.get("patchType")!r}; '
                                     "only JSONPatch is supported")
                patched = json_patch(obj, json.loads(base64.b64decode(response["patch"])))
                if not isinstance(patched, dict):
                    raise _CallError("the webhook's patch did not produce an object")
            except (errors.ApiError, ValueError, TypeError) as exc:
                self._failed(hook, f"the webhook's JSONPatch could not be applied: {exc}")
                continue
            except _CallError as exc:
                self._failed(hook, str(exc))
                continue
            obj = patched
        return obj

    def validate(self, rt: ResourceType, sub: str, operation: str, obj: Obj | None, old: Obj | None,
                 dry_run: bool) -> None:
        """Default and validate webhook configurations; run the matching validating webhooks."""
        if rt.kind in config.WEBHOOK_KINDS and obj is not None:
            config.default(rt.kind, obj)
            causes = config.validate(rt.kind, obj, self.service_resolver is not None)
            if causes:
                raise errors.invalid(rt, (obj.get("metadata") or {}).get("name") or "", causes)
        if rt.group == ADMISSION_GROUP:
            return
        for hook in self._matching("validatingwebhookconfigurations", rt, sub, operation, obj, old):
            self._call(hook, rt, sub, operation, obj, old, dry_run)

    # ---- selection ----------------------------------------------------------------------------------

    def _matching(self, key: str, rt: ResourceType, sub: str, operation: str, obj: Obj | None,
                  old: Obj | None) -> list[Obj]:
        entries = self.store.list_shared(key)[0]  # sorted by name, like the real server's order
        if not entries:
            return []
        out = []
        for configuration, _ in entries:
            for hook in configuration.get("webhooks") or []:
                if not any(rule_matches(r, rt, sub, operation) for r in hook.get("rules") or []):
                    continue
                obj_sel = hook.get("objectSelector")
                if obj_sel and not (selector_matches(obj_sel, _labels(obj)) or
                                    (old is not None and selector_matches(obj_sel, _labels(old)))):
                    continue
                if not self._namespace_matches(hook.get("namespaceSelector"), rt, obj, old):
                    continue
                out.append(hook)
        return out

    def _namespace_matches(self, sel: Any, rt: ResourceType, obj: Obj | None, old: Obj | None) -> bool:
        if not sel:
            return True
        if rt.kind == "Namespace":
            return selector_matches(sel, _labels(obj if obj is not None else old))
        if not rt.namespaced:
            return True  # other cluster-scoped objects are never skipped by a namespaceSelector
        ns = ((obj if obj is not None else old) or {}).get("metadata", {}).get("namespace") or ""
        try:
            namespace = self.store.get_shared("namespaces", None, ns)[0]
        except errors.ApiError:
            namespace = None
        return selector_matches(sel, _labels(namespace))

    # ---- one call -----------------------------------------------------------------------------------

    def review(self, rt: ResourceType, sub: str, operation: str, obj: Obj | None, old: Obj | None,
               dry_run: bool) -> Obj:
        """The AdmissionReview v1 request kube-apiserver sends for this write."""
        meta = (obj if obj is not None else old or {}).get("metadata") or {}
        kind = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        resource = {"group": rt.group, "version": rt.version, "resource": rt.plural}
        request: Obj = {"uid": str(uuid.uuid4()), "kind": kind, "resource": resource}
        if sub:
            request["subResource"] = sub
        request.update({"requestKind": kind, "requestResource": resource})
        if sub:
            request["requestSubResource"] = sub
        if meta.get("name"):
            request["name"] = meta["name"]
        if rt.namespaced and meta.get("namespace"):
            request["namespace"] = meta["namespace"]
        request.update({"operation": operation, "userInfo": USER, "object": obj, "oldObject": old,
                        "dryRun": dry_run,
                        "options": {"kind": _OPTIONS[operation], "apiVersion": "meta.k8s.io/v1"}})
        return {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request}

    def _call(self, hook: Obj, rt: ResourceType, sub: str, operation: str, obj: Obj | None, old: Obj | None,
              dry_run: bool) -> Obj | None:
        """Call one webhook: its response, or None when the call failed and failurePolicy is Ignore.
        Raises the denial, or the 500 of a failed call under failurePolicy Fail."""
        review = self.review(rt, sub, operation, obj, old, dry_run)
        uid = review["request"]["uid"]
        if hook.get("matchConditions"):
            call, error = match_conditions.evaluate(hook["matchConditions"], review["request"])
            if error is not None:
                self._failed(hook, error)  # raises under failurePolicy Fail
            if not call:
                return None
        try:
            answer = self._post(hook, review)
            response = answer.get("response") if isinstance(answer, dict) else None
            if answer.get("apiVersion") != "admission.k8s.io/v1" or answer.get("kind") != "AdmissionReview":
                raise _CallError("expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got "
                                 f"{answer.get('apiVersion')}, Kind={answer.get('kind')}")
            if not isinstance(response, dict):
                raise _CallError("webhook response was absent")
            if response.get("uid") != uid:
                raise _CallError(f'expected response.uid="{uid}", got "{response.get("uid")}"')
        except _CallError as exc:
            self._failed(hook, str(exc))
            return None
        for w in response.get("warnings") or []:
            _warn(str(w))
        if not response.get("allowed"):
            raise _denied(hook["name"], response.get("status") or {})
        return response

    def _failed(self, hook: Obj, reason: str) -> None:
        message = f'failed calling webhook "{hook["name"]}": {reason}'
        if hook.get("failurePolicy", "Fail") == "Ignore":
            log.warning("webhook_failed_open", webhook=hook["name"], error=reason)
            return
        log.warning("webhook_failed_closed", webhook=hook["name"], error=reason)
        raise errors.ApiError(500, "InternalError", f"Internal error occurred: {message}",
                              {"causes": [{"message": message}]})

    def _url(self, hook: Obj) -> str:
        cc = hook.get("clientConfig") or {}
        if cc.get("url"):
            return str(cc["url"])
        svc = cc.get("service") or {}
        if self.service_resolver is None:
            raise _CallError(f"service {svc.get('namespace')}/{svc.get('name')} cannot be reached from the local "
                             "API server (no service_resolver)")
        base = self.service_resolver(str(svc.get("namespace")), str(svc.get("name")), int(svc.get("port", 443)))
        return base.rstrip("/") + (svc.get("path") or "")

    def _context(self, ca: bytes) -> ssl.SSLContext:
        with self._pool_lock:
            ctx = self._contexts.get(ca)
            if ctx is None:
                ctx = ssl.create_default_context(cadata=ca.decode()) if ca else ssl.create_default_context()
                self._contexts[ca] = ctx
            return ctx

    def _post(self, hook: Obj, review: Obj) -> Any:
        timeout = int(hook.get("timeoutSeconds") or 10)
        url = self._url(hook)
        # Like the real server, the timeout travels in the URL too (webhooks may bound their own work).
        target = f"{url}?timeout={timeout}s"
        parts = urlsplit(url)
        try:
            ca = base64.b64decode((hook.get("clientConfig") or {}).get("caBundle") or "")
            ctx = self._context(ca)
        except (ValueError, ssl.SSLError) as exc:
            raise _CallError(f"failed to call webhook: invalid caBundle: {exc}") from None
        key = (parts.hostname or "", parts.port or 443, ca)
        body = json.dumps(review, separators=(",", ":")).encode()
        path = (parts.path or "/") + f"?timeout={timeout}s"
        for attempt in range(2):
            conn = self._checkout(key, ctx, timeout)
            reused = getattr(conn, "sock", None) is not None
            try:
                conn.request("POST", path, body=body, headers={"Content-Type": "application/json",
                                                               "Accept": "application/json"})
                resp = conn.getresponse()
                data = resp.read()
            except TimeoutError:
                conn.close()
                raise _CallError(f'failed to call webhook: Post "{target}": context deadline exceeded') from None
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if reused and attempt == 0:
                    continue  # a kept-alive connection the webhook closed meanwhile: dial again once
                raise _CallError(f'failed to call webhook: Post "{target}": {_describe(exc, key)}') from None
            self._checkin(key, conn)
            if resp.status != 200:
                text = data.decode(errors="replace")[:512]
                raise _CallError(f"failed to call webhook: an error on the server ({text!r}) has prevented the "
                                 f"request from succeeding (HTTP {resp.status})")
            try:
                return json.loads(data)
            except ValueError as exc:
                raise _CallError(f"received invalid webhook response: {exc}") from None
        raise _CallError(f'failed to call webhook: Post "{target}": connection lost')

    def _checkout(self, key: tuple[str, int, bytes], ctx: ssl.SSLContext,
                  timeout: int) -> http.client.HTTPSConnection:
        with self._pool_lock:
            idle = self._pool.get(key) or []
            conn = idle.pop() if idle else None
        if conn is None:
            conn = http.client.HTTPSConnection(key[0], key[1], context=ctx, timeout=timeout)
        else:
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
        return conn

    def _checkin(self, key: tuple[str, int, bytes], conn: http.client.HTTPSConnection) -> None:
        with self._pool_lock:
            idle = self._pool.setdefault(key, [])
            if len(idle) < 4:
                idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close the kept-alive connections to webhooks."""
        with self._pool_lock:
            conns = [c for idle in self._pool.values() for c in idle]
            self._pool.clear()
        for c in conns:
            c.close()


def _describe(exc: BaseException, key: tuple[str, int, bytes]) -> str:
    if isinstance(exc, ConnectionRefusedError):  # Go's wording, as the real server reports it
        return f"dial tcp {key[0]}:{key[1]}: connect: connection refused"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"tls: failed to verify certificate: {exc.verify_message}"
    return str(exc) or type(exc).__name__


def _denied(name: str, status: Obj) -> errors.ApiError:
    """The error a denial answers, worded as the real server's webhookerrors.ToStatusErr."""
    denied = f'admission webhook "{name}" denied the request'
    raw = status.get("code")
    code = raw if isinstance(raw, int) and raw >= 400 else 400
    if status.get("message"):
        message = f"{denied}: {status['message']}"
    elif status.get("reason"):
        message = f"{denied}: {status['reason']}"
    else:
        message = f"{denied} without explanation"
    return errors.ApiError(code, str(status.get("reason") or ""), message, status.get("details"))
