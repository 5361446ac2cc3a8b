"""admissionregistration.k8s.io/v1 Mutating/ValidatingWebhookConfiguration: defaults and validation,
with the real server's field paths and wording (k8s.io/kubernetes pkg/apis/admissionregistration), plus
one local restriction: a ``clientConfig.service`` needs a resolver, since this server cannot reach
Services (``LocalApiServer(service_resolver=...)``)."""

from __future__ import annotations

import base64
import binascii
from typing import Any
from urllib.parse import urlsplit

from testbed.apiserver.errors import Cause
from testbed.apiserver.match_conditions import MAX_CONDITIONS, compile_error
from testbed.apiserver.validation.common import (
    dns_label,
    dns_subdomain,
    duplicate,
    forbidden,
    invalid,
    not_supported,
    qualified_name,
    required,
    too_many,
)

WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
OPERATIONS = ["*", "CONNECT", "CREATE", "DELETE", "UPDATE"]
SCOPES = ["*", "Cluster", "Namespaced"]
SELECTOR_OPS = ["DoesNotExist", "Exists", "In", "NotIn"]


def default(kind: str, obj: dict[str, Any]) -> None:
    """Fill the defaults the real server writes (failurePolicy Fail, matchPolicy Equivalent, empty
    selectors, timeoutSeconds 10, reinvocationPolicy Never, scope "*", service port 443)."""
    for hook in obj.get("webhooks") or []:
        if not isinstance(hook, dict):
            continue
        hook.setdefault("failurePolicy", "Fail")
        hook.setdefault("matchPolicy", "Equivalent")
        hook.setdefault("namespaceSelector", {})
        hook.setdefault("objectSelector", {})
        hook.setdefault("timeoutSeconds", 10)
        if kind == "MutatingWebhookConfiguration":
            hook.setdefault("reinvocationPolicy", "Never")
        for rule in hook.get("rules") or []:
            if isinstance(rule, dict):
                rule.setdefault("scope", "*")
        service = (hook.get("clientConfig") or {}).get("service")
        if isinstance(service, dict):
            service.setdefault("port", 443)


def _selector(path: str, sel: Any) -> list[Cause]:
    if sel is None or sel == {}:
        return []
    if not isinstance(sel, dict):
        return [invalid(path, sel, "must be a label selector (matchLabels, matchExpressions)")]
    out: list[Cause] = []
    for i, expr in enumerate(sel.get("matchExpressions") or []):
        p = f"{path}.matchExpressions[{i}]"
        op, values = (expr or {}).get("operator"), (expr or {}).get("values") or []
        if not (expr or {}).get("key"):
            out.append(required(f"{p}.key"))
        if op not in SELECTOR_OPS:
            out.append(not_supported(f"{p}.operator", op, SELECTOR_OPS))
        elif op in ("In", "NotIn") and not values:
            out.append(required(f"{p}.values", "must be specified when `operator` is 'In' or 'NotIn'"))
        elif op in ("Exists", "DoesNotExist") and values:
            out.append(forbidden(f"{p}.values", "may not be specified when `operator` is 'Exists' or "
                                 "'DoesNotExist'"))
    return out


def _client_config(path: str, cc: Any, can_resolve: bool) -> list[Cause]:
    if not isinstance(cc, dict):
        return [required(path)]
    url, service = cc.get("url"), cc.get("service")
    out: list[Cause] = []
    if bool(url) == bool(service):
        out.append(required(path, "exactly one of url or service is required"))
    if url:
        parts = urlsplit(str(url))
        if parts.scheme != "https":
            out.append(invalid(f"{path}.url", url, "'https' is the only allowed URL scheme"))
        elif not parts.hostname:
            out.append(invalid(f"{path}.url", url, "host must be specified"))
        elif parts.fragment or parts.query:
            out.append(invalid(f"{path}.url", url, "fragments and query parameters are not permitted"))
    if isinstance(service, dict):
        sp = f"{path}.service"
        for f in ("name", "namespace"):
            if not service.get(f):
                out.append(required(f"{sp}.{f}", "service name and namespace are required"))
            else:
                out += dns_label(f"{sp}.{f}", service[f])
        port = service.get("port", 443)
        if not isinstance(port, int) or not 1 <= port <= 65535:
            out.append(invalid(f"{sp}.port", port, "port is not valid: must be between 1 and 65535, inclusive"))
        if not can_resolve:
            out.append(forbidden(sp, "the local API server cannot reach Services: register the webhook with "
                                 "clientConfig.url (https://host:port/path), or start LocalApiServer with a "
                                 "service_resolver that maps the service to a URL"))
    ca = cc.get("caBundle")
    if ca:
        try:
            base64.b64decode(str(ca), validate=True)
        except (binascii.Error, ValueError):
            out.append(invalid(f"{path}.caBundle", "<bytes>", "must be base64-encoded PEM certificates"))
    return out


def _rules(path: str, rules: Any) -> list[Cause]:
    out: list[Cause] = []
    for j, rule in enumerate(rules or []):
        p = f"{path}[{j}]"
        if not isinstance(rule, dict):
            out.append(invalid(p, rule, "must be an object"))
            continue
        for f in ("operations", "apiGroups", "apiVersions", "resources"):
            values = rule.get(f)
            if not values:
                out.append(required(f"{p}.{f}"))
            elif "*" in values and len(values) > 1:
                out.append(invalid(f"{p}.{f}", values, "if '*' is present, must not specify other values"))
        for k, op in enumerate(rule.get("operations") or []):
            if op not in OPERATIONS:
                out.append(not_supported(f"{p}.operations[{k}]", op, OPERATIONS))
        for k, res in enumerate(rule.get("resources") or []):
            if not res:
                out.append(required(f"{p}.resources[{k}]", "resource must not be empty"))
            elif res.count("/") > 1 or res.startswith("/") or res.endswith("/"):
                out.append(invalid(f"{p}.resources[{k}]", res, "must be 'resource', 'resource/subresource', "
                                   "'resource/*', '*/subresource' or '*/*'"))
        if rule.get("scope", "*") not in SCOPES:
            out.append(not_supported(f"{p}.scope", rule.get("scope"), SCOPES))
    return out


def validate(kind: str, obj: dict[str, Any], can_resolve: bool) -> list[Cause]:
    """Causes for a webhook configuration (empty when valid)."""
    out: list[Cause] = []
    names: set[str] = set()
    for i, hook in enumerate(obj.get("webhooks") or []):
        p = f"webhooks[{i}]"
        if not isinstance(hook, dict):
            out.append(invalid(p, hook, "must be an object"))
            continue
        name = hook.get("name")
        if not name:
            out.append(required(f"{p}.name"))
        else:
            out += dns_subdomain(f"{p}.name", name)
            if len(str(name).split(".")) < 3:
                out.append(invalid(f"{p}.name", name, "should be a domain with at least three segments "
                                   "separated by dots"))
            if name in names:
                out.append(duplicate(f"{p}.name", name))
            names.add(name)
        versions = hook.get("admissionReviewVersions")
        if not versions:
            out.append(required(f"{p}.admissionReviewVersions", "must specify one of v1, v1beta1"))
        elif "v1" not in versions:
            out.append(invalid(f"{p}.admissionReviewVersions", versions,
                               "must include v1: this server sends admission.k8s.io/v1 AdmissionReviews only"))
        side = hook.get("sideEffects")
        if side is None:
            out.append(required(f"{p}.sideEffects", "must specify one of None, NoneOnDryRun"))
        elif side not in ("None", "NoneOnDryRun"):
            out.append(not_supported(f"{p}.sideEffects", side, ["None", "NoneOnDryRun"]))
        out += _client_config(f"{p}.clientConfig", hook.get("clientConfig"), can_resolve)
        out += _rules(f"{p}.rules", hook.get("rules"))
        if hook.get("failurePolicy") not in ("Ignore", "Fail"):
            out.append(not_supported(f"{p}.failurePolicy", hook.get("failurePolicy"), ["Fail", "Ignore"]))
        if hook.get("matchPolicy") not in ("Exact", "Equivalent"):
            out.append(not_supported(f"{p}.matchPolicy", hook.get("matchPolicy"), ["Equivalent", "Exact"]))
        timeout = hook.get("timeoutSeconds")
        if not isinstance(timeout, int) or isinstance(timeout, bool) or not 1 <= timeout <= 30:
            out.append(invalid(f"{p}.timeoutSeconds", timeout, "the timeout value must be between 1 and 30 "
                               "seconds"))
        if kind == "MutatingWebhookConfiguration" and hook.get("reinvocationPolicy") not in ("Never", "IfNeeded"):
            out.append(not_supported(f"{p}.reinvocationPolicy", hook.get("reinvocationPolicy"),
                                     ["IfNeeded", "Never"]))
        out += _selector(f"{p}.namespaceSelector", hook.get("namespaceSelector"))
        out += _selector(f"{p}.objectSelector", hook.get("objectSelector"))
        out += _match_conditions(f"{p}.matchConditions", hook.get("matchConditions"))
    return out


def _match_conditions(path: str, conditions: Any) -> list[Cause]:
    if conditions is None:
        return []
    if not isinstance(conditions, list):
        return [invalid(path, conditions, "must be a list")]
    out: list[Cause] = []
    if len(conditions) > MAX_CONDITIONS:
        out.append(too_many(path, len(conditions), MAX_CONDITIONS))
    seen: set[str] = set()
    for i, condition in enumerate(conditions):
        p = f"{path}[{i}]"
        name = (condition or {}).get("name") if isinstance(condition, dict) else None
        expression = (condition or {}).get("expression") if isinstance(condition, dict) else None
        if not name:
            out.append(required(f"{p}.name"))
        else:
            out += qualified_name(f"{p}.name", str(name))
            if name in seen:
                out.append(duplicate(f"{p}.name", name))
            seen.add(str(name))
        if not expression:
            out.append(required(f"{p}.expression"))
        else:
            problem = compile_error(str(expression))
            if problem:
                out.append(invalid(f"{p}.expression", expression, f"compilation failed: {problem}"))
    return out
