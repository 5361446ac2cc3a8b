"""A webhook's ``matchConditions``: CEL expressions that decide whether the webhook is called at all.

As kube-apiserver evaluates them (admissionregistration.k8s.io/v1, GA in 1.30): every condition sees
``object``, ``oldObject`` (null on create) and ``request`` (the AdmissionReview request); the webhook
is called only when all are true. A false condition skips it whatever else happened; otherwise an
evaluation error fails the write under ``failurePolicy: Fail`` and skips the webhook under
``Ignore``. ``authorizer`` is not offered here: a condition that reads it is an error.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import celpy
from celpy.evaluation import CELEvalError

MAX_CONDITIONS = 64
_ENV = celpy.Environment()


@functools.lru_cache(maxsize=256)
def compiled(expression: str) -> Any:
    """The runnable program of one expression; raises ``celpy.CELParseError`` when it does not parse."""
    return _ENV.program(_ENV.compile(expression))


def compile_error(expression: str) -> str | None:
    """Why ``expression`` does not compile, or None."""
    try:
        compiled(expression)
    except Exception as exc:  # celpy raises parse errors of several types
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


def evaluate(conditions: list[Mapping[str, Any]], request: Mapping[str, Any]) -> tuple[bool, str | None]:
    """(call the webhook?, the error that decided it) for one admission request."""
    variables = {"object": celpy.json_to_cel(request.get("object")),
                 "oldObject": celpy.json_to_cel(request.get("oldObject")),
                 "request": celpy.json_to_cel(dict(request))}
    error: str | None = None
    for condition in conditions:
        name = str(condition.get("name", ""))
        try:
            result = compiled(str(condition.get("expression", ""))).evaluate(variables)
        except Exception as exc:  # a program that cannot run
            result = CELEvalError(str(exc))
        if isinstance(result, CELEvalError):
            error = error or f"matchCondition {name}: {result.args[0] if result.args else result}"
            continue
        if not isinstance(result, celpy.celtypes.BoolType):
            error = error or f"matchCondition {name}: the expression must return a bool, got {type(result).__name__}"
            continue
        if not result:
            return False, None
    if error is not None:
        return False, error
    return True, None
