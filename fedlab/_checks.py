"""Argument checks shared by fedlab's modules, each raising ``ValueError`` that names the argument.

A leaf: this module imports nothing from fedlab, so any module may use it.
"""
from __future__ import annotations

import math

__all__ = ["positive_int", "in_range", "whole_int", "finite_positive", "finite_real", "finite_tensor"]


def positive_int(name: str, value) -> int:
    """``value`` as an ``int`` when it is a whole number ``>= 1`` (``3`` and ``3.0`` pass, ``True``
    does not). Raises ``ValueError`` naming ``name`` otherwise."""
    try:
        ok = not isinstance(value, bool) and int(value) == value and value >= 1
    except (TypeError, ValueError, OverflowError):    # None, NaN, infinities: int() fails without the name
        ok = False
    if not ok:
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


def whole_int(name: str, value, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an ``int`` when it is a whole number (``3`` and ``3.0`` pass; ``2.5``, ``True``,
    ``"3"``, NaN and infinities do not), optionally within ``[low, high]``. Raises ``ValueError``
    naming ``name`` otherwise."""
    ok = not isinstance(value, (bool, str, bytes))
    if ok:
        try:
            ok = math.isfinite(float(value)) and int(value) == value
        except (TypeError, ValueError, OverflowError):
            ok = False
    if not ok:
        raise ValueError(f"{name} must be an integer, got {value!r}")
    v = int(value)
    if (low is not None and v < low) or (high is not None and v > high):
        lo = "-inf" if low is None else low
        hi = "inf" if high is None else high
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return v


def finite_positive(name: str, value) -> float:
    """``value`` as a ``float`` when it is a finite real number ``> 0`` (``True``, strings, NaN and
    infinities fail). Raises ``ValueError`` naming ``name`` otherwise."""
    ok = not isinstance(value, (bool, str, bytes))
    if ok:
        try:
            x = float(value)
            ok = math.isfinite(x) and x > 0
        except (TypeError, ValueError):
            ok = False
    if not ok:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return x


def finite_real(name: str, value, low: float | None = None) -> float:
    """``value`` as a ``float`` when it is a finite real number (``True``, strings, NaN and infinities
    fail), ``>= low`` when ``low`` is given. Raises ``ValueError`` naming ``name`` otherwise."""
    ok = not isinstance(value, (bool, str, bytes))
    if ok:
        try:
            x = float(value)
            ok = math.isfinite(x) and (low is None or x >= low)
        except (TypeError, ValueError):
            ok = False
    if not ok:
        bound = "" if low is None else f" >= {low:g}"
        raise ValueError(f"{name} must be a finite number{bound}, got {value!r}")
    return x


def finite_tensor(name: str, value, hint: str = "") -> None:
    """Raise ``ValueError`` naming ``name`` when the tensor (or dict of tensors) ``value`` holds a
    NaN or an infinite entry; integer tensors always pass. ``hint`` is appended to the message."""
    items = value.items() if isinstance(value, dict) else [(None, value)]
    for key, t in items:
        if t.is_floating_point() or t.is_complex():
            if not bool(t.isfinite().all()):
                where = name if key is None else f"{name}[{key!r}]"
                raise ValueError(f"{where} holds NaN or infinite entries{hint}")


def run_spec(spec, defaults: dict, required, what: str) -> dict:
    """One run of a multi-run function (``fedlab.fl.stacked``, ``dp_fedavg_runs``, ``centaur_runs``,
    ``active_attack_runs``): ``spec`` merged over ``defaults``. Raises ``ValueError`` naming ``what`` (e.g.
    "the dp_fedavg arguments") when ``spec`` has a key ``defaults`` lacks or misses one of ``required``."""
    bad = set(spec) - set(defaults)
    missing = [k for k in required if k not in spec]
    if bad or missing:
        need = f" ({', '.join(required)} required)" if required else ""
        raise ValueError(f"a run takes {what} {sorted(defaults)}{need}, got {sorted(spec)}")
    return {**defaults, **spec}
