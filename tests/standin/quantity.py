"""Resource quantities as kube-apiserver stores them.

The real server decodes every quantity of a resource list into a ``resource.Quantity``,
rounds it up to a whole number of milli-units (``SetDefaults_ResourceList``,
pkg/apis/core/v1/defaults.go) and writes it back in canonical form (k8s.io/apimachinery
pkg/api/resource: ``ParseQuantity``, ``CanonicalizeBytes``): ``"3000"`` is stored as
``"3k"``, ``"1000m"`` as ``"1"``, ``"1024Mi"`` as ``"1Gi"``, ``"0.5"`` as ``"500m"``,
``"1500u"`` as ``"2m"``; ``"1536Mi"`` and ``"100"`` stay. A JSON number is read as the
quantity its text spells (``4000`` is stored as ``"4k"``). So does the stand-in:

- the format comes from the suffix: a binary one (``Ki`` … ``Ei``) is BinarySI, an
  exponent (``e3``/``E3``) DecimalExponent, anything else DecimalSI;
- a string that ``ParseQuantity`` finds canonical already is kept as it was written
  (``"1E3"``, ``"+5"``, ``"5."``, ``"1100Ki"``): a whole number of at most 18 digits
  with no trailing ``000``, a suffix whose power is a multiple of 3, at least milli; or
  a binary suffix on a whole number that is not a multiple of 8;
- otherwise BinarySI is written with the largest power of 1024 that divides the value,
  unless the value lies strictly between -1024 and 1024 or is not a whole number: then
  as DecimalSI, which writes ``m × 10^e`` with ``m`` whole and without trailing zeros,
  ``e`` lowered to a multiple of 3, and the suffix ``m "" k M G T P E`` (``e<e>`` for
  DecimalExponent; beyond exa kube-apiserver writes no suffix at all, and nor does this).

Not copied: the cap of binary values at 2^63-1, and which way negative values round
(no resource list admits them).
"""

from __future__ import annotations

import functools
import json
import math
import re
from fractions import Fraction

# kube-apiserver's messages (k8s.io/apimachinery pkg/api/resource/quantity.go)
FORMAT_WRONG = ("quantities must match the regular expression "
                "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
SUFFIX_WRONG = "unable to parse quantity's suffix"

_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15,
            "E": 18}
_DECIMAL_SUFFIX = {e: s for s, e in _DECIMAL.items()}
_BINARY_SUFFIX = {e // 10: s for s, e in _BINARY.items()} | {0: ""}
_SHAPE = re.compile(r"([+-]?)0*([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*(?:[-+]?[0-9]+)?)")
_EXPONENT = re.compile(r"[eE][-+]?[0-9]+")
_MILLI = 1000


class QuantityError(ValueError):
    """Not a quantity; the message is kube-apiserver's."""


def _parse(text: str) -> tuple[Fraction, str, bool]:
    """(value, format, kept as written) of a quantity string (``ParseQuantity``)."""
    m = _SHAPE.fullmatch(text)
    if not text or m is None:
        raise QuantityError(FORMAT_WRONG)
    sign, num, denom, suffix = m.groups()
    num, denom = num or "0", denom or ""
    if suffix in _BINARY:
        fmt, exponent = "BinarySI", _BINARY[suffix]
        value = Fraction(int(num + denom), 10 ** len(denom)) * 2**exponent
    elif suffix in _DECIMAL or _EXPONENT.fullmatch(suffix):
        fmt = "DecimalSI" if suffix in _DECIMAL else "DecimalExponent"
        exponent = _DECIMAL[suffix] if suffix in _DECIMAL else int(suffix[1:])
        value = Fraction(int(num + denom)) * Fraction(10) ** (exponent - len(denom))
    else:
        raise QuantityError(SUFFIX_WRONG)
    if sign == "-":
        value = -value
    shifted = num + denom
    if fmt == "BinarySI":
        kept = (not denom and 15 - len(num) - int(exponent * 3 / 10) - 1 >= 0
                and int(shifted) & 7 != 0)
    else:
        scale = exponent - len(denom)
        kept = (len(shifted) <= 18 and scale % 3 == 0 and scale >= -3
                and not shifted.endswith("000") and shifted[0] != "0")
    return value, fmt, kept


def _decimal(value: Fraction, fmt: str) -> str:
    sign = "-" if value < 0 else ""
    m, e = int(abs(value) * _MILLI), -3  # a whole number of milli-units
    while m % 10 == 0:
        m //= 10
        e += 1
    while e % 3:
        m *= 10
        e -= 1
    if fmt == "DecimalExponent":
        return f"{sign}{m}" + (f"e{e}" if e else "")
    return f"{sign}{m}{_DECIMAL_SUFFIX.get(e, '')}"


@functools.lru_cache(maxsize=4096)
def _canonical_text(text: str) -> str:
    text = text.strip()
    value, fmt, kept = _parse(text)
    if kept:
        return text
    value = Fraction(math.ceil(value * _MILLI), _MILLI)
    if value == 0:
        return "0"
    if fmt == "BinarySI" and (abs(value) < 1024 or value.denominator != 1):
        fmt = "DecimalSI"
    if fmt != "BinarySI":
        return _decimal(value, fmt)
    sign = "-" if value < 0 else ""
    n, e = abs(int(value)), 0
    while n % 1024 == 0 and e < 6:
        n //= 1024
        e += 1
    return f"{sign}{n}{_BINARY_SUFFIX[e]}"


_KNOWN: dict[str, str] = {}  # canonical forms already worked out, by string written


def canonical(value: object) -> str:
    """The string kube-apiserver stores for ``value`` (a string or a JSON number)."""
    if type(value) is str:
        known = _KNOWN.get(value)
        if known is None:
            known = _canonical_text(value)
            if len(_KNOWN) < 65536:
                _KNOWN[value] = known
        return known
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise QuantityError(FORMAT_WRONG)
    return _canonical_text(value if isinstance(value, str) else json.dumps(value))


@functools.lru_cache(maxsize=4096)
def value_of(text: str) -> Fraction:
    """The value a canonical quantity string stands for."""
    return _parse(text.strip())[0]
