"""Kubernetes resource quantities (``"40Gi"``, ``"79.6Gi"``, ``"500m"``, ``"1e9"``): the one parser
and the one formatter of both daemons.

Every user of a quantity (the planner and webhooks, opaque device configuration, VRAM accounting,
slice building) goes through here, so a quantity the API server accepts is accepted everywhere and
one the server refuses is refused everywhere (tests/dra_driver/test_quantity.py feeds one table to
every user). Values are exact :class:`fractions.Fraction`: floats would make ``79.6Gi`` unequal to
itself after a round trip. The grammar is that of ``k8s.io/apimachinery/pkg/api/resource``: sign,
digits, optional fraction, then a binary suffix ``Ki..Ei``, a decimal suffix ``n u m k M G T P E``
or a decimal exponent ``e3``/``E3``; nothing else, not even surrounding spaces.
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache

_BINARY = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "Pi": 1024**5, "Ei": 1024**6}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: str | int | float | Fraction) -> Fraction:
    """Parse a Kubernetes quantity into an exact number (``"40Gi"`` -> ``42949672960``).

    Integers and fractions pass through; a float is accepted only because YAML turns ``0.5`` into
    one. Raises :class:`QuantityError` naming the text when it is not a quantity.
    """
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int | Fraction):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(str(value))
    return _parse_text(str(value))


def quantity_parts(text: str) -> tuple[str, str]:
    """``"1.5Gi"`` -> ``("1.5", "Gi")``: the number and the suffix as written (``""``, ``"Ki"``, ``"m"``,
    ``"e3"``). The suffix decides how the API server prints the value back (BinarySI, DecimalSI or
    DecimalExponent). Raises :class:`QuantityError` for text that is not a quantity."""
    match = _QUANTITY.match(text)
    if not match:
        raise QuantityError(
            f"{text!r} is not a Kubernetes quantity (expected e.g. '40Gi', '80G', '1500m' or '1e9')"
        )
    return match.group("num"), match.group("suffix") or ""


@lru_cache(maxsize=8192)
def _parse_text(value: str) -> Fraction:
    # Cached: a cluster repeats the same few quantities ("1", "7", one memory size per GPU model)
    # hundreds of thousands of times, and Fractions are immutable, so one object can be shared.
    num, suffix = quantity_parts(value)
    number = Fraction(num)
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number * Fraction(10) ** int(suffix[1:])


def parse_whole_quantity(value: str | int, minimum: int = 0) -> int:
    """A quantity that must be a whole number no smaller than ``minimum`` (a size in bytes, a count).

    Accepts every spelling the API server accepts (``1.5Gi``, ``2e9``, ``512Mi``); raises
    :class:`QuantityError` saying why otherwise (not a quantity, a fraction of a unit, too small).
    """
    number = parse_quantity(value)
    if number.denominator != 1:
        raise QuantityError(f"{value!r} is not a whole number ({format_quantity(number)})")
    if number < minimum:
        raise QuantityError(f"{value!r} is below {minimum}")
    return number.numerator


_BINARY_ORDER = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_ORDER = ("", "k", "M", "G", "T", "P", "E")


def format_quantity(value: Fraction | int, binary: bool = True) -> str:
    """The canonical string the API server stores for a quantity (never rounded down).

    ``binary=True`` (BinarySI, what memory uses): a multiple of 1024 takes the largest exact binary
    suffix (``42949672960`` -> ``"40Gi"``; ``143771Mi``); anything else falls back to DecimalSI, as
    the server's canonicalisation does. ``binary=False`` is DecimalSI (``1000`` -> ``"1k"``). A value
    that is not whole becomes milli-units (``Fraction(3, 2)`` -> ``"1500m"``), rounded up as
    Kubernetes rounds quantities it cannot represent.
    """
    value = Fraction(value)
    if value.denominator != 1:
        milli = value * 1000
        return f"{-((-milli.numerator) // milli.denominator)}m"  # ceiling
    n = value.numerator
    if n == 0:
        return "0"
    if binary and abs(n) >= 1024 and n % 1024 == 0:
        exponent = 0
        while exponent < len(_BINARY_ORDER) - 1 and n % 1024 == 0:
            n //= 1024
            exponent += 1
        return f"{n}{_BINARY_ORDER[exponent]}"
    exponent = 0
    while exponent < len(_DECIMAL_ORDER) - 1 and n % 1000 == 0:
        n //= 1000
        exponent += 1
    return f"{n}{_DECIMAL_ORDER[exponent]}"


def human_bytes(value: Fraction | int) -> str:
    """``85520809984`` -> ``"79.6 GiB"``: for messages, never for the API."""
    number = float(value)
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(number) >= size:
            text = f"{number / size:.1f}".rstrip("0").rstrip(".")
            return f"{text} {unit}"
    return f"{int(number)} B"
