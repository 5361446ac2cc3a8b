"""The Kubernetes CEL library values and functions DRA selectors use, for cel-python.

Kubernetes adds ``quantity()``/``isQuantity()`` and ``semver()``/``isSemver()`` with their
methods, the extended string library (``lowerAscii``, ``split``, ...), ``find``/``findAll`` and,
for DRA, ``includes``. cel-python dispatches a method call ``x.f(y)`` to the function ``f(x, y)``,
so one function per name serves every receiver type and rejects the others with "no such
overload", as the Kubernetes type checker would.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction
from functools import total_ordering
from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError

from dra_driver.quantity import QuantityError, format_quantity, parse_quantity


class CelQuantity:
    """A ``quantity("40Gi")`` value. Equality works with ``==``; ordering only via methods (as in k8s)."""

    __slots__ = ("value",)

    def __init__(self, value: Fraction) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CelQuantity) and self.value == other.value

    def __hash__(self) -> int:
        return hash(("quantity", self.value))

    def __repr__(self) -> str:
        return f"quantity({format_quantity(self.value)!r})"


_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


@total_ordering
class CelSemver:
    """A semantic version 2.0.0 (``semver("1.2.3")``, and every ``version`` attribute)."""

    __slots__ = ("major", "minor", "patch", "pre", "text")

    def __init__(self, major: int, minor: int, patch: int, pre: tuple[str, ...], text: str) -> None:
        self.major, self.minor, self.patch, self.pre, self.text = major, minor, patch, pre, text

    @classmethod
    def parse(cls, text: str, normalize: bool = False) -> CelSemver:
        """Parse strictly (``1.2.3-rc.1+build``); ``normalize`` also takes ``v1.2``, ``01.2.3``."""
        raw = text
        if normalize:
            text = text.removeprefix("v")
            core, sep, rest = _split_core(text)
            parts = core.split(".")
            if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
                raise ValueError(f"{raw!r} is not a semantic version")
            parts = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
            text = ".".join(parts) + sep + rest
        match = _SEMVER.match(text)
        if not match:
            raise ValueError(f"{raw!r} is not a semantic version (expected MAJOR.MINOR.PATCH, e.g. '1.2.3')")
        pre = tuple(match.group(4).split(".")) if match.group(4) else ()
        return cls(int(match.group(1)), int(match.group(2)), int(match.group(3)), pre, text)

    def _key(self) -> tuple[Any, ...]:
        # Semver precedence: a pre-release sorts before its release; numeric identifiers
        # compare numerically and before alphanumeric ones; build metadata is ignored.
        pre_key = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.pre)
        return (self.major, self.minor, self.patch, 0 if self.pre else 1, pre_key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CelSemver) and self._key() == other._key()

    def __lt__(self, other: CelSemver) -> bool:
        if not isinstance(other, CelSemver):
            return NotImplemented
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"semver({self.text!r})"


def _split_core(text: str) -> tuple[str, str, str]:
    for i, ch in enumerate(text):
        if ch in "-+":
            return text[:i], ch, text[i + 1 :]
    return text, "", ""


def _err(message: str) -> CELEvalError:
    return CELEvalError(message, TypeError, None)


def _quantity_arg(value: Any, fn: str) -> Fraction:
    if isinstance(value, CelQuantity):
        return value.value
    if isinstance(value, celtypes.IntType | int) and not isinstance(value, bool):
        return Fraction(int(value))
    raise TypeError(f"no such overload: {fn}({type(value).__name__})")


def quantity(text: Any) -> Any:
    """``quantity("40Gi")``."""
    try:
        return CelQuantity(parse_quantity(str(text)))
    except QuantityError as exc:
        return _err(str(exc))


def is_quantity(text: Any) -> celtypes.BoolType:
    """``isQuantity("40Gi")``."""
    try:
        parse_quantity(str(text))
    except QuantityError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def semver(text: Any, normalize: Any = False) -> Any:
    """``semver("1.2.3")`` and ``semver("v1.2", true)``."""
    try:
        return CelSemver.parse(str(text), bool(normalize))
    except ValueError as exc:
        return _err(str(exc))


def is_semver(text: Any, normalize: Any = False) -> celtypes.BoolType:
    """``isSemver("1.2.3")``."""
    try:
        CelSemver.parse(str(text), bool(normalize))
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _compare(a: Any, b: Any) -> int:
    if isinstance(a, CelSemver) and isinstance(b, CelSemver):
        return (a > b) - (a < b)
    if isinstance(a, CelQuantity):
        x, y = a.value, _quantity_arg(b, "compareTo")
        return (x > y) - (x < y)
    raise TypeError(f"no such overload: compareTo({type(a).__name__}, {type(b).__name__})")


def compare_to(a: Any, b: Any) -> celtypes.IntType:
    """``a.compareTo(b)``: -1, 0 or 1 for quantities and semvers."""
    return celtypes.IntType(_compare(a, b))


def is_greater_than(a: Any, b: Any) -> celtypes.BoolType:
    """``a.isGreaterThan(b)``."""
    return celtypes.BoolType(_compare(a, b) > 0)


def is_less_than(a: Any, b: Any) -> celtypes.BoolType:
    """``a.isLessThan(b)``."""
    return celtypes.BoolType(_compare(a, b) < 0)


def _quantity_only(fn: str) -> Callable[[Any], Fraction]:
    def get(a: Any) -> Fraction:
        if not isinstance(a, CelQuantity):
            raise TypeError(f"no such overload: {fn}({type(a).__name__})")
        return a.value

    return get


def q_add(a: Any, b: Any) -> CelQuantity:
    """``quantity.add(quantity|int)``."""
    return CelQuantity(_quantity_only("add")(a) + _quantity_arg(b, "add"))


def q_sub(a: Any, b: Any) -> CelQuantity:
    """``quantity.sub(quantity|int)``."""
    return CelQuantity(_quantity_only("sub")(a) - _quantity_arg(b, "sub"))


def q_sign(a: Any) -> celtypes.IntType:
    """``quantity.sign()``."""
    v = _quantity_only("sign")(a)
    return celtypes.IntType((v > 0) - (v < 0))


def q_is_integer(a: Any) -> celtypes.BoolType:
    """``quantity.isInteger()``: whether ``asInteger()`` would succeed."""
    v = _quantity_only("isInteger")(a)
    return celtypes.BoolType(v.denominator == 1 and -(2**63) <= v.numerator < 2**63)


def q_as_integer(a: Any) -> Any:
    """``quantity.asInteger()``: an error for fractions or values beyond int64, as in Kubernetes."""
    v = _quantity_only("asInteger")(a)
    if v.denominator != 1 or not -(2**63) <= v.numerator < 2**63:
        return _err(f"cannot convert value to integer: {format_quantity(v)}")
    return celtypes.IntType(v.numerator)


def q_as_approximate_float(a: Any) -> celtypes.DoubleType:
    """``quantity.asApproximateFloat()``."""
    return celtypes.DoubleType(float(_quantity_only("asApproximateFloat")(a)))


def _semver_part(name: str) -> Callable[[Any], celtypes.IntType]:
    def part(a: Any) -> celtypes.IntType:
        if not isinstance(a, CelSemver):
            raise TypeError(f"no such overload: {name}({type(a).__name__})")
        return celtypes.IntType(getattr(a, name))

    part.__doc__ = f"``semver.{name}()``."
    return part


def _string(fn: str, a: Any) -> str:
    if not isinstance(a, str):
        raise TypeError(f"no such overload: {fn}({type(a).__name__})")
    return str(a)


def _index_of(a: Any, sub: Any, start: Any = 0) -> celtypes.IntType:
    return celtypes.IntType(_string("indexOf", a).find(str(sub), int(start)))


def _substring(a: Any, start: Any, end: Any = None) -> celtypes.StringType:
    s = _string("substring", a)
    stop = len(s) if end is None else int(end)
    if not 0 <= int(start) <= stop <= len(s):
        raise ValueError(f"substring index out of range: [{start}, {stop}) of {len(s)}")
    return celtypes.StringType(s[int(start) : stop])


def _split(a: Any, sep: Any, limit: Any = -1) -> celtypes.ListType:
    s, n = _string("split", a), int(limit)
    if n == 0:
        return celtypes.ListType([])
    parts = s.split(str(sep), n - 1) if n > 0 else s.split(str(sep))
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def _join(a: Any, sep: Any = "") -> celtypes.StringType:
    if not isinstance(a, list):
        raise TypeError("no such overload: join")
    return celtypes.StringType(str(sep).join(str(x) for x in a))


def _find(a: Any, pattern: Any) -> celtypes.StringType:
    m = re.search(str(pattern), _string("find", a))
    return celtypes.StringType(m.group(0) if m else "")


def _find_all(a: Any, pattern: Any, limit: Any = -1) -> celtypes.ListType:
    found = [celtypes.StringType(m.group(0)) for m in re.finditer(str(pattern), _string("findAll", a))]
    return celtypes.ListType(found if int(limit) < 0 else found[: int(limit)])


def _includes(a: Any, x: Any) -> celtypes.BoolType:
    # DRA (1.36+): a scalar attribute acts as a one-element list.
    if isinstance(a, list):
        if len(a) > 48:
            raise ValueError("includes() on a list of more than 48 elements")
        return celtypes.BoolType(x in a)
    return celtypes.BoolType(a == x)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": quantity,
    "isQuantity": is_quantity,
    "semver": semver,
    "isSemver": is_semver,
    "compareTo": compare_to,
    "isGreaterThan": is_greater_than,
    "isLessThan": is_less_than,
    "add": q_add,
    "sub": q_sub,
    "sign": q_sign,
    "isInteger": q_is_integer,
    "asInteger": q_as_integer,
    "asApproximateFloat": q_as_approximate_float,
    "major": _semver_part("major"),
    "minor": _semver_part("minor"),
    "patch": _semver_part("patch"),
    "lowerAscii": lambda a: celtypes.StringType(_string("lowerAscii", a).lower()),
    "upperAscii": lambda a: celtypes.StringType(_string("upperAscii", a).upper()),
    "trim": lambda a: celtypes.StringType(_string("trim", a).strip()),
    "replace": lambda a, old, new, n=-1: celtypes.StringType(
        _string("replace", a).replace(str(old), str(new), int(n))
    ),
    "indexOf": _index_of,
    "lastIndexOf": lambda a, sub: celtypes.IntType(_string("lastIndexOf", a).rfind(str(sub))),
    "charAt": lambda a, i: celtypes.StringType(_string("charAt", a)[int(i) : int(i) + 1]),
    "substring": _substring,
    "split": _split,
    "join": _join,
    "find": _find,
    "findAll": _find_all,
    "includes": _includes,
}
"""Every function the DRA CEL environment adds to cel-python's standard set."""
