"""Kubernetes resource quantities (``"500m"``, ``"81559Mi"``, ``"1e3"``) as exact numbers.

The node inventory reads a Node's allocatable CPU, memory and GPUs, which the API
server gives as quantity strings. Parsing them is its own concern, with its own
rounding rules (Kubernetes rounds CPU and memory up to whole millicores and bytes), so
it lives here rather than in the planner or the inventory.

Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from fractions import Fraction
from types import MappingProxyType
from typing import Final

__all__ = ["parse_bytes", "parse_count", "parse_cpu_millicores", "parse_quantity"]

_QUANTITY_RE = re.compile(
    r"^(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+))"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)|[eE](?P<exp>[+-]?\d+))?$"
)
_SUFFIXES: Final[Mapping[str, Fraction]] = MappingProxyType(
    {
        "": Fraction(1),
        "n": Fraction(1, 10**9),
        "u": Fraction(1, 10**6),
        "m": Fraction(1, 10**3),
        "k": Fraction(10**3),
        "M": Fraction(10**6),
        "G": Fraction(10**9),
        "T": Fraction(10**12),
        "P": Fraction(10**15),
        "E": Fraction(10**18),
        "Ki": Fraction(2**10),
        "Mi": Fraction(2**20),
        "Gi": Fraction(2**30),
        "Ti": Fraction(2**40),
        "Pi": Fraction(2**50),
        "Ei": Fraction(2**60),
    }
)
_MAX_EXPONENT: Final = 30


def parse_quantity(value: str | int | float) -> Fraction:
    """The exact value of a Kubernetes quantity such as ``"500m"``, ``"512Gi"``, ``"1e3"``."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"not a quantity: {value!r}")
        return Fraction(value)
    m = _QUANTITY_RE.match(value.strip())
    if m is None:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    number = Fraction(m["num"])
    if m["exp"] is not None:
        exponent = int(m["exp"])
        if abs(exponent) > _MAX_EXPONENT:
            raise ValueError(f"quantity exponent out of range: {value!r}")
        return number * Fraction(10) ** exponent
    return number * _SUFFIXES[m["suffix"] or ""]


def _non_negative(*, value: str | int | float) -> Fraction:
    parsed = parse_quantity(value)
    if parsed < 0:
        raise ValueError(f"negative quantity: {value!r}")
    return parsed


def parse_cpu_millicores(value: str | int | float) -> int:
    """CPU quantity in millicores, rounded up as Kubernetes does (``"64"`` → 64000)."""
    return math.ceil(_non_negative(value=value) * 1000)


def parse_bytes(value: str | int | float) -> int:
    """Memory quantity in bytes, rounded up (``"81559Mi"`` → 85520809984)."""
    return math.ceil(_non_negative(value=value))


def parse_count(value: str | int | float) -> int:
    """A count of whole devices, such as allocatable ``nvidia.com/gpu``, rounded down."""
    return math.floor(_non_negative(value=value))
