"""Kubernetes quantities (``500m``, ``1Gi``, ``1e9``) as the API server stores them, and their values.

The API server keeps no quantity as written: ``1024Mi`` comes back as ``1Gi``, ``0.5`` as ``500m``,
``1000m`` as ``1``. The operator compares what it would write with what is stored, so it writes
every quantity in the stored form, or each reconcile would find its StatefulSets changed (and a
journal claim's size, which a StatefulSet cannot change, would have it recreated).

``canonical`` follows apimachinery's ``ParseQuantity`` and ``CanonicalizeBytes``
(``pkg/api/resource/quantity.go``), including where ``ParseQuantity`` keeps the string as written.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

_DECIMAL_SI = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {exponent: suffix for suffix, exponent in _DECIMAL_SI.items()}
_BINARY_SI = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_BINARY_SUFFIX = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
# Sign, leading zeros, whole digits, fraction digits, suffix: apimachinery's parseQuantityString.
_PARTS = re.compile(r"([+-]?)(0*)([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*(?:[-+]?[0-9]+)?)")
_MAX_INT64 = 2**63 - 1
_NANO = 10**9

DECIMAL_SI, BINARY_SI, DECIMAL_EXPONENT = "DecimalSI", "BinarySI", "DecimalExponent"


def canonical(value: str | int) -> str:
    """``value`` as the API server stores it: ``1024Mi`` is ``1Gi``, ``0.5`` is ``500m``, ``1000m`` is ``1``,
    ``1.5Gi`` is ``1536Mi``, ``1000e6`` is ``1e9``. A string that is no quantity comes back as written."""
    text = str(value)
    if text == "0":
        return text
    match = _PARTS.fullmatch(text)
    if not match or not text:
        return text
    sign, _, whole, fraction, suffix = match.groups()
    unit = _unit(suffix)
    if unit is None:
        return text
    base, exponent, form = unit
    whole, fraction = whole or "0", fraction or ""
    kept = _kept_as_written(whole, fraction, base, exponent)
    if kept:
        return text
    number = text[: len(text) - len(suffix)]
    try:
        amount = abs(Fraction(Decimal(number)))
    except (InvalidOperation, ValueError):
        return text
    amount *= Fraction(10) ** exponent if base == 10 else Fraction(2) ** exponent
    # Rounded up to a whole nano: "if you want some resources, you should get some resources".
    amount = Fraction(-((-amount.numerator * _NANO) // amount.denominator), _NANO)
    if form == BINARY_SI:
        amount = min(amount, Fraction(_MAX_INT64))
    return ("-" if sign == "-" and amount else "") + _canonical_form(amount, form)


def _unit(suffix: str) -> tuple[int, int, str] | None:
    """The base, the exponent and the format a suffix gives (apimachinery's suffixer.interpret)."""
    if suffix in _DECIMAL_SI:
        return 10, _DECIMAL_SI[suffix], DECIMAL_SI
    if suffix in _BINARY_SI:
        return 2, _BINARY_SI[suffix], BINARY_SI
    if len(suffix) > 1 and suffix[0] in "eE" and re.fullmatch(r"[+-]?[0-9]+", suffix[1:]):
        return 10, int(suffix[1:]), DECIMAL_EXPONENT
    return None


def _kept_as_written(whole: str, fraction: str, base: int, exponent: int) -> bool:
    """Whether ParseQuantity keeps the string as written (its fast path, when the string looks canonical)."""
    if base == 2:
        if fraction or 15 - len(whole) - int(exponent * 3 / 10) - 1 < 0:
            return False
        return int(whole) << exponent <= _MAX_INT64 and int(whole) & 7 != 0
    if 18 - len(whole) - len(fraction) < 0:
        return False
    scale, shifted = exponent - len(fraction), whole + fraction
    return scale >= -9 and scale % 3 == 0 and not shifted.endswith("000") and shifted[0] != "0"


def _canonical_form(amount: Fraction, form: str) -> str:
    """CanonicalizeBytes of a non-negative amount, a whole number of nanos."""
    if amount == 0:
        return "0"
    if form == BINARY_SI and (amount < 1024 or amount.denominator != 1):
        form = DECIMAL_SI  # small or fractional: no rounding to a binary unit
    if form == BINARY_SI:
        mantissa, step = amount.numerator, 0
        while mantissa % 1024 == 0 and step < len(_BINARY_SUFFIX) - 1:
            mantissa, step = mantissa // 1024, step + 1
        return f"{mantissa}{_BINARY_SUFFIX[step]}"
    mantissa, exponent = int(amount * _NANO), -9
    while mantissa % 10 == 0:
        mantissa, exponent = mantissa // 10, exponent + 1
    while exponent % 3:
        mantissa, exponent = mantissa * 10, exponent - 1
    if form == DECIMAL_SI and exponent in _DECIMAL_SUFFIX:
        return f"{mantissa}{_DECIMAL_SUFFIX[exponent]}"
    return f"{mantissa}e{exponent}" if exponent else str(mantissa)


_SUFFIXES = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": 10**-9, "u": 10**-6, "m": 10**-3, "": 1,
    "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip


def parse_quantity(value: str) -> float:
    """The numeric value of a Kubernetes quantity (only to compare requests with limits)."""
    match = re.fullmatch(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)", value)
    if not match or match.group(2) not in _SUFFIXES:
        raise ValueError(f"not a quantity: {value!r}")
    return float(match.group(1)) * _SUFFIXES[match.group(2)]


def quantity_bytes(value: str | int) -> int:
    """A quantity of bytes as a whole number, rounded up (``1.5Gi`` is 1610612736, ``1k`` 1000)."""
    return math.ceil(parse_quantity(str(value)))
