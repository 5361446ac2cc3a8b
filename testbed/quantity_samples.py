"""One table of quantity spellings, with what the Kubernetes API server makes of each.

Every gpuready component that reads a quantity is fed this table (tests/dra_driver/test_quantity.py),
so a spelling the API server accepts is accepted everywhere, and one it refuses is refused everywhere.
``value`` is the exact number, None where the API server refuses the text.
"""

from __future__ import annotations

from fractions import Fraction
from typing import NamedTuple

GI = 1024**3


class QuantitySample(NamedTuple):
    """A spelling and its exact value (None: not a quantity)."""

    text: str
    value: Fraction | None


SAMPLES: tuple[QuantitySample, ...] = (
    QuantitySample("40Gi", Fraction(40 * GI)),
    QuantitySample("1.5Gi", Fraction(3 * GI, 2)),
    QuantitySample(".5Gi", Fraction(GI, 2)),
    QuantitySample("512Mi", Fraction(512 * 1024**2)),
    QuantitySample("+20Gi", Fraction(20 * GI)),
    QuantitySample("1G", Fraction(10**9)),
    QuantitySample("80G", Fraction(80 * 10**9)),
    QuantitySample("1k", Fraction(1000)),
    QuantitySample("2e9", Fraction(2 * 10**9)),
    QuantitySample("1E3", Fraction(1000)),
    QuantitySample("1e+3", Fraction(1000)),
    QuantitySample("5.", Fraction(5)),
    QuantitySample("1073741824", Fraction(GI)),
    QuantitySample("1500m", Fraction(3, 2)),
    QuantitySample("0", Fraction(0)),
    QuantitySample("-1Gi", Fraction(-GI)),
    QuantitySample("1K", None),  # the decimal kilo is a lower-case k
    QuantitySample("1GiB", None),
    QuantitySample("1gi", None),
    QuantitySample("1 Gi", None),
    QuantitySample(" 1Gi", None),
    QuantitySample("Gi", None),
    QuantitySample("", None),
    QuantitySample("1.2.3", None),
    QuantitySample("0x10", None),
    QuantitySample("twenty", None),
)
