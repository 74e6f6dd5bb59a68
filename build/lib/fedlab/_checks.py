"""Argument checks shared by fedlab's modules, each raising ``ValueError`` that names the argument.

A leaf: this module imports nothing from fedlab, so any module may use it.
"""
from __future__ import annotations

__all__ = ["positive_int", "in_range"]


def positive_int(name: str, value) -> int:
    """``value`` as an ``int`` when it is a whole number ``>= 1`` (``3`` and ``3.0`` pass, ``True``
    does not). Raises ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def in_range(name: str, value, low: float, high: float, *, low_closed: bool = False,
             high_closed: bool = False) -> float:
    """``value`` as a ``float`` when it lies between ``low`` and ``high`` (open ends unless
    ``low_closed`` / ``high_closed``). Raises ``ValueError`` naming ``name`` and the interval
    otherwise (also for NaN)."""
    x = float(value)
    above = x >= low if low_closed else x > low
    below = x <= high if high_closed else x < high
    if not (above and below):
        interval = f"{'[' if low_closed else '('}{low:g}, {high:g}{']' if high_closed else ')'}"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return x
