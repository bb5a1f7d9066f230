"""Kubernetes resource quantities (``4``, ``500m``, ``16Gi``, ``1e3``) as numbers: a job's cpu and memory and a
runtime's bounds on them are compared as the API server compares them."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

_QUANTITY_RE = re.compile(r"^(?P<number>[+]?(\d+(\.\d*)?|\.\d+))(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?$")
_SUFFIXES = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": Decimal("1e3"),
    "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18"),
    **{f"{p}i": Decimal(1024) ** (i + 1) for i, p in enumerate("KMGTPE")},
}


def parse_quantity(value: int | str) -> Decimal:
    """A Kubernetes quantity (``4``, ``500m``, ``16Gi``, ``1e3``) as a number; ValueError when it is not one
    (or is negative)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    match = _QUANTITY_RE.match(str(value).strip()) if isinstance(value, int | str) else None
    if match is None:
        raise ValueError(f"{value!r} is not a quantity, or is negative (for example 4, 500m, 16Gi)")
    suffix = match["suffix"] or ""
    try:
        number = Decimal(match["number"])
        scale = Decimal(10) ** int(suffix[1:]) if suffix[:1] in ("e", "E") else _SUFFIXES[suffix]
    except (InvalidOperation, ValueError):
        raise ValueError(f"{value!r} is not a quantity") from None
    return number * scale


def check_quantity(value: int | str | None) -> int | str | None:
    if value is not None:
        parse_quantity(value)
    return value


def is_quantity(value: Any) -> bool:
    """``value`` is a quantity (None is not)."""
    if value is None:
        return False
    try:
        check_quantity(value)
    except ValueError:
        return False
    return True
