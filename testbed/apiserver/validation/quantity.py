"""Kubernetes resource.Quantity syntax check (``80Gi``, ``1.5``, ``500m``, ``1e3``)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any

from dra_driver.quantity import QuantityError, quantity_parts
from testbed.apiserver.errors import Cause
from testbed.apiserver.validation.common import invalid, required


def is_quantity(value: Any) -> bool:
    """Whether ``value`` is a Quantity string (or a plain number, which JSON clients also send)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return True
    return isinstance(value, str) and quantity_string_ok(value)


@functools.lru_cache(maxsize=4096)
def quantity_string_ok(value: str) -> bool:
    """``is_quantity`` for a string, remembered: a node sends the same few quantities on every device.

    The grammar is gpuready's one quantity parser (:mod:`dra_driver.quantity`), the same rules the
    real API server applies."""
    try:
        quantity_parts(value)
    except QuantityError:
        return False
    return True


def validate_quantity(field: str, value: Any, required_value: bool = False) -> list[Cause]:
    """Causes when ``value`` is missing (if required) or not a Quantity."""
    if value is None or value == "":
        return [required(field)] if required_value else []
    if not is_quantity(value):
        return [invalid(field, value, "quantities must match the regular expression "
                                      "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")]
    return []


# --- values and canonical strings (messages name quantities as Go's Quantity.String() prints them) -------
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {exp: suffix for suffix, exp in _DECIMAL.items()}
_BINARY_SUFFIX = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]


@dataclass(frozen=True)
class Quantity:
    """A parsed Quantity: its exact value and the format its suffix chose (BinarySI, DecimalSI or
    DecimalExponent), which decides how the real server prints it back."""

    value: Decimal
    format: str

    def __str__(self) -> str:
        return canonical(self.value, self.format)

    def int_value(self) -> int:
        """Go's ``Quantity.Value()``: rounded up to an integer."""
        return math.ceil(self.value)


def parse_quantity(value: Any) -> Quantity | None:
    """The Quantity ``value`` spells, or None when it is not one. Like the real parser, precision finer
    than nano-units is rounded up."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    try:
        number_text, suffix = quantity_parts(value if isinstance(value, str) else repr(value))
    except QuantityError:
        return None
    try:
        number = Decimal(number_text)
    except InvalidOperation:
        return None
    if suffix in _BINARY:
        amount, fmt = number * Decimal(1024) ** _BINARY[suffix], "BinarySI"
    elif suffix[:1] in ("e", "E"):
        amount, fmt = number.scaleb(int(suffix[1:])), "DecimalExponent"
    else:
        amount, fmt = number.scaleb(_DECIMAL[suffix]), "DecimalSI"
    nanos = (amount * Decimal(10) ** 9).to_integral_value(rounding=ROUND_CEILING)
    return Quantity(nanos.scaleb(-9), fmt)


def canonical(value: Decimal, fmt: str) -> str:
    """``value`` printed the way Go's ``Quantity.String()`` canonicalizes it: binary suffixes only for
    whole numbers of at least 1024, otherwise the largest power-of-1000 suffix that keeps the mantissa
    whole (``1500Mi``, ``1Gi``, ``500m``, ``1k``, ``1e3``)."""
    if fmt == "BinarySI" and abs(value) >= 1024 and value == value.to_integral_value():
        mantissa, exp = int(value), 0
        while mantissa % 1024 == 0 and exp < len(_BINARY_SUFFIX) - 1:
            mantissa, exp = mantissa // 1024, exp + 1
        return f"{mantissa}{_BINARY_SUFFIX[exp]}"
    mantissa, exp = int((value * Decimal(10) ** 9).to_integral_value(rounding=ROUND_CEILING)), -9
    if mantissa == 0:
        return "0"
    while mantissa % 10 == 0:
        mantissa, exp = mantissa // 10, exp + 1
    shift = exp % 3  # exponents are kept to multiples of three
    mantissa, exp = mantissa * 10**shift, exp - shift
    if fmt != "DecimalExponent" and exp in _DECIMAL_SUFFIX:
        return f"{mantissa}{_DECIMAL_SUFFIX[exp]}"
    return f"{mantissa}e{exp}" if exp else str(mantissa)
