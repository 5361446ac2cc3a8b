"""The Kubernetes DRA CEL environment on cel-python: compile selectors once, evaluate them cheaply.

What a selector sees is what the kube-scheduler gives it (the kube-scheduler's DRA CEL environment): ``device.driver``,
``device.attributes[domain].name`` (unknown domain -> empty map, unknown name -> runtime error),
``device.capacity[domain].name`` as quantities, ``device.allowMultipleAllocations``, the Kubernetes
``quantity``/``semver`` libraries, extended strings, ``cel.bind`` and the standard macros.

A runtime error is not "no match": the kube-scheduler aborts allocation of the whole claim
(the kube-scheduler's DRA CEL environment). :meth:`CompiledSelector.evaluate` keeps the message; the planner turns it
into a claim failure (:mod:`.scheduler_parity`) and ``explain`` shows it per device.

Speed: a parsed expression is cached by its text, and every compiled selector caches its results
keyed by exactly the values it reads (found statically from the syntax tree). Two GPUs that differ
only in UUID and PCI address share one evaluation of ``productName == "NVIDIA H100 80GB HBM3"``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import celpy
import lark
from celpy import celtypes
from celpy.evaluation import CELEvalError, Evaluator, base_functions

from controller.planning.cel_types import FUNCTIONS, CelQuantity
from controller.planning.device_view import DeviceView

MAX_EXPRESSION_LENGTH = 10 * 1024  # CELSelectorExpressionMaxLength
_DEVICE_FIELDS = {"driver", "attributes", "capacity", "allowMultipleAllocations"}
_MACROS = {"map", "filter", "all", "exists", "exists_one"}
_KNOWN_FUNCTIONS = set(base_functions) | set(FUNCTIONS) | _MACROS | {"has", "dyn", "bind"}

ReadPath = tuple[str, ...]
"""What a selector reads: ``("driver",)``, ``("multi",)``, ``("attr", qname)``, ``("cap", qname)``,
``("attrdom", domain)``, ``("capdom", domain)`` (a whole domain map) or ``("all",)``."""


class CelCompileError(ValueError):
    """A selector that cannot be compiled; the message names the problem and where it is."""


@dataclass(frozen=True)
class SelectorResult:
    """The outcome of one selector on one device: matched, or not, or a runtime error's text."""

    matched: bool
    error: str | None = None


class _DomainMap(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: an unknown domain is an empty map, not an error."""

    def __missing__(self, key: Any) -> celtypes.MapType:
        return celtypes.MapType()


def _to_cel(value: Any) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    if isinstance(value, tuple):
        return celtypes.ListType([_to_cel(v) for v in value])
    return value  # CelSemver


def device_value(device: DeviceView) -> celtypes.MapType:
    """The CEL value of ``device`` for one published device (built once, kept on the view)."""
    if device.cel_cache is not None:
        return cast(celtypes.MapType, device.cel_cache)
    attrs, caps = _DomainMap(), _DomainMap()
    for qname, value in device.attributes.items():
        domain, _, ident = qname.rpartition("/")
        attrs.setdefault(celtypes.StringType(domain), celtypes.MapType())[celtypes.StringType(ident)] = (
            _to_cel(value)
        )
    for qname, amount in device.capacity.items():
        domain, _, ident = qname.rpartition("/")
        caps.setdefault(celtypes.StringType(domain), celtypes.MapType())[celtypes.StringType(ident)] = (
            CelQuantity(amount)
        )
    value = celtypes.MapType(
        {
            celtypes.StringType("driver"): celtypes.StringType(device.driver),
            celtypes.StringType("attributes"): attrs,
            celtypes.StringType("capacity"): caps,
            celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(
                device.allow_multiple_allocations
            ),
        }
    )
    device.cel_cache = value
    return value


class _K8sEvaluator(Evaluator):
    """cel-python's interpreter plus ``cel.bind(var, init, expr)``, which DRA selectors may use."""

    def sub_evaluator(self, ast: lark.Tree) -> Evaluator:
        return _K8sEvaluator(ast, activation=self.activation)

    def member_dot_arg(self, tree: lark.Tree) -> Any:
        member_tree, method = tree.children[0], tree.children[1]
        if cast(lark.Token, method).value == "bind" and _ident_name(member_tree) == "cel":
            args = cast(lark.Tree, tree.children[2]).children
            var = _ident_name(args[0])
            value = self.visit(args[1])
            if isinstance(value, CELEvalError):
                return value
            try:
                return self.sub_evaluator(cast(lark.Tree, args[2])).evaluate({cast(str, var): value})
            except CELEvalError as exc:
                return exc
        return super().member_dot_arg(tree)


_WRAPPERS = {
    "expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication",
    "unary", "member", "primary", "paren_expr",
}  # fmt: skip


def _unwrap(node: Any) -> Any:
    while isinstance(node, lark.Tree) and node.data in _WRAPPERS and len(node.children) == 1:
        node = node.children[0]
    return node


def _ident_name(node: Any) -> str | None:
    node = _unwrap(node)
    if isinstance(node, lark.Tree) and node.data == "ident":
        return cast(lark.Token, node.children[0]).value
    return None


def _string_literal(node: Any) -> str | None:
    node = _unwrap(node)
    if isinstance(node, lark.Tree) and node.data == "literal":
        token = cast(lark.Token, node.children[0])
        text = token.value
        if token.type == "STRING_LIT" and "\\" not in text and text[:1] in "\"'":
            return text[1:-1]
    return None


def _device_path(node: Any) -> tuple[str, ...] | None:
    """``device.attributes["d"].x`` -> ``("device", "attributes", "d", "x")``; else None."""
    node = _unwrap(node)
    if not isinstance(node, lark.Tree):
        return None
    if node.data == "ident":
        return ("device",) if cast(lark.Token, node.children[0]).value == "device" else None
    if node.data == "member_dot":
        base = _device_path(node.children[0])
        return None if base is None else (*base, cast(lark.Token, node.children[1]).value)
    if node.data == "member_index":
        base = _device_path(node.children[0])
        key = _string_literal(node.children[1])
        return None if base is None or key is None else (*base, key)
    return None


def _read_path(path: tuple[str, ...]) -> ReadPath:
    if len(path) == 1:
        return ("all",)
    head = path[1]
    if head == "driver":
        return ("driver",)
    if head == "allowMultipleAllocations":
        return ("multi",)
    if head in ("attributes", "capacity"):
        kind = "attr" if head == "attributes" else "cap"
        if len(path) == 2:
            return ("all",)
        if len(path) == 3:
            return (f"{kind}dom", path[2])
        return (kind, f"{path[2]}/{path[3]}")
    return ("all",)


def _analyse(expression: str, tree: lark.Tree) -> tuple[ReadPath, ...]:
    """Check names the way the Kubernetes type checker would, and find what the expression reads."""
    reads: set[ReadPath] = set()
    bound: set[str] = set()
    idents: list[lark.Token] = []

    def visit(node: Any) -> None:
        if not isinstance(node, lark.Tree):
            return
        path = _device_path(node)
        if path is not None:
            if len(path) >= 2 and path[1] not in _DEVICE_FIELDS:
                raise CelCompileError(
                    f"undefined field {path[1]!r} of device (it has driver, attributes, capacity and "
                    f"allowMultipleAllocations): {expression!r}"
                )
            reads.add(_read_path(path))
            # Still visit index expressions beyond the path (they are literals, nothing to find).
            return
        if node.data == "member_dot_arg":
            name = cast(lark.Token, node.children[1]).value
            if name not in _KNOWN_FUNCTIONS:
                raise CelCompileError(f"undeclared reference to function {name!r} in {expression!r}")
            args = cast(lark.Tree, node.children[2]).children if len(node.children) > 2 else []
            if name in _MACROS and len(args) == 2 and _ident_name(args[0]):
                bound.add(cast(str, _ident_name(args[0])))
                visit(node.children[0])
                visit(args[1])
                return
            if name == "bind" and _ident_name(node.children[0]) == "cel":
                if len(args) != 3 or not _ident_name(args[0]):
                    raise CelCompileError(f"cel.bind takes (variable, value, expression): {expression!r}")
                bound.add(cast(str, _ident_name(args[0])))
                visit(args[1])
                visit(args[2])
                return
        if node.data == "ident_arg":
            name = cast(lark.Token, node.children[0]).value
            if name not in _KNOWN_FUNCTIONS:
                raise CelCompileError(f"undeclared reference to function {name!r} in {expression!r}")
        if node.data == "ident":
            idents.append(cast(lark.Token, node.children[0]))
        for child in node.children:
            visit(child)

    visit(tree)
    for token in idents:
        if token.value not in bound and token.value != "device":
            raise CelCompileError(
                f"undeclared reference to {token.value!r} at column {token.column} in {expression!r} "
                "(a selector sees only 'device')"
            )
    return tuple(sorted(reads))


_MISSING = object()


def _read_value(device: DeviceView, path: ReadPath) -> Any:
    kind = path[0]
    if kind == "driver":
        return device.driver
    if kind == "multi":
        return device.allow_multiple_allocations
    if kind == "attr":
        return device.attributes.get(path[1], _MISSING)
    if kind == "cap":
        return device.capacity.get(path[1], _MISSING)
    if kind in ("attrdom", "capdom"):
        source: Mapping[str, Any] = device.attributes if kind == "attrdom" else device.capacity
        prefix = path[1] + "/"
        return tuple(sorted((k, v) for k, v in source.items() if k.startswith(prefix)))
    return (
        device.driver,
        device.allow_multiple_allocations,
        tuple(sorted(device.attributes.items())),
        tuple(sorted(device.capacity.items())),
    )


def _clean_error(exc: CELEvalError) -> str:
    text = str(exc.args[0]) if exc.args else "evaluation error"
    text = text.split(" (in activation", 1)[0]
    if text == "no such key" and len(exc.args) > 2 and exc.args[2]:
        text = f"no such key: {exc.args[2][0]!s}"
    if text.startswith("no such member in mapping"):
        text = text.replace("no such member in mapping", "no such key")
    return text


class CompiledSelector:
    """One compiled selector expression. Thread-safe; results cached by the values it reads."""

    _CACHE_LIMIT = 50_000

    def __init__(self, expression: str, tree: lark.Tree, reads: tuple[ReadPath, ...]) -> None:
        self.expression = expression
        self.reads = reads
        self._tree = tree
        self._results: dict[tuple[Any, ...], SelectorResult] = {}

    def cache_key(self, device: DeviceView) -> tuple[Any, ...]:
        """The values this expression reads from ``device``: equal keys give equal results."""
        return tuple(_read_value(device, p) for p in self.reads)

    def evaluate(self, device: DeviceView) -> SelectorResult:
        """Evaluate on one device; a runtime error is a non-match that carries its message."""
        key = self.cache_key(device)
        result = self._results.get(key)
        if result is None:
            result = self._evaluate(device)
            if len(self._results) >= self._CACHE_LIMIT:
                self._results.clear()
            self._results[key] = result
        return result

    def matches(self, device: DeviceView) -> bool:
        """True when the selector is true for ``device`` (false on a runtime error, which callers that
        allocate must check for with :meth:`evaluate`: the scheduler aborts the claim then)."""
        return self.evaluate(device).matched

    def _evaluate(self, device: DeviceView) -> SelectorResult:
        activation = celpy.Activation(
            package=None, annotations=None, functions=cast(Any, FUNCTIONS)
        )
        evaluator = _K8sEvaluator(self._tree, activation=activation)
        try:
            value = evaluator.evaluate({"device": device_value(device)})
        except CELEvalError as exc:
            return SelectorResult(False, _clean_error(exc))
        except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as exc:
            return SelectorResult(False, f"evaluation error: {exc}")
        if not isinstance(value, celtypes.BoolType | bool):
            return SelectorResult(False, f"the expression must give a bool, it gave {type(value).__name__}")
        return SelectorResult(bool(value))


_ENV = celpy.Environment()
_LOCK = threading.Lock()
_COMPILED: dict[str, CompiledSelector] = {}


def compile_selector(expression: str) -> CompiledSelector:
    """Compile a DRA CEL selector (cached by its text).

    Raises :class:`CelCompileError` naming the problem: a syntax error with its position, an
    unknown function or variable, an unknown ``device`` field, or an expression over 10 KiB.
    """
    compiled = _COMPILED.get(expression)
    if compiled is not None:
        return compiled
    if not isinstance(expression, str) or not expression.strip():
        raise CelCompileError("empty CEL expression: write a boolean expression over 'device'")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise CelCompileError(
            f"CEL expression is {len(expression)} characters; Kubernetes allows {MAX_EXPRESSION_LENGTH}"
        )
    with _LOCK:
        try:
            tree = _ENV.compile(expression)
        except Exception as exc:  # celpy raises CELParseError, lark errors for odd input
            line, column = getattr(exc, "line", None), getattr(exc, "column", None)
            where = f" at line {line}, column {column}" if line and column else ""
            near = ""
            if line and column:
                text = expression.splitlines()[line - 1] if expression.splitlines() else expression
                near = f" (near {text[max(0, column - 1):column + 14]!r})"
            hint = ""
            if ".?" in expression:
                hint = "; optional field syntax '.?' is not supported here: guard with has() instead"
            raise CelCompileError(f"syntax error{where}{near} in CEL expression {expression!r}{hint}") from exc
    reads = _analyse(expression, tree)
    compiled = CompiledSelector(expression, tree, reads)
    with _LOCK:
        if len(_COMPILED) > 4096:
            _COMPILED.clear()
        _COMPILED[expression] = compiled
    return compiled
