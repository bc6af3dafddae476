"""Durations as people type them (``90s``, ``15m``, ``2h``, ``3d``) and back.

Kept apart from ``vgpumon.config`` so that the agent's own process (``vgpumon.agent.process``), which
never loads pydantic, can read and print durations too.
"""

from __future__ import annotations

import math
import re
from typing import Any

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*")
#: The longest duration any option takes: ten years. Longer ones are mistakes, and some (a
#: ``--window`` of 1 000 000 days) are not representable as dates or millisecond integers.
MAX_DURATION_S = 3650 * 86400.0


def parse_duration(value: Any, *, minimum: float = 0.0, maximum: float = MAX_DURATION_S) -> float:
    """A duration as seconds: ``90``, ``90s``, ``1.5m``, ``2h``, ``3d`` (a bare number is seconds).

    Args:
        value: text as typed, or a number of seconds (from a TOML file).
        minimum: the value must be more than 0 and at least this (seconds).
        maximum: the value must be at most this (seconds; default ten years).

    Returns:
        Seconds, finite and in ``(0, maximum]``.

    Raises:
        ValueError: empty, not a duration (``abc``, ``-5m``, ``inf``, ``nan``), 0, or out of range;
            the message says which and gives an example.
    """
    if isinstance(value, bool):
        raise ValueError("not a duration (e.g. 90s, 15m, 2h, 3d)")
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:  # an integer past any float (a TOML file may hold one): far out of range
            if value > 0:
                raise ValueError(f"must be at most {format_duration(maximum)}") from None
            raise ValueError("must be more than 0 (e.g. 90s, 15m, 2h, 3d)") from None
    else:
        text = str(value)
        m = _DURATION.fullmatch(text)
        if not m:
            what = "empty" if not text.strip() else f"{text!r} is not a duration"
            raise ValueError(f"{what} (e.g. 90s, 15m, 2h, 3d)")
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError("must be more than 0 (e.g. 90s, 15m, 2h, 3d)")
    if seconds < minimum:
        raise ValueError(f"must be at least {format_duration(minimum)}")
    if seconds > maximum:
        raise ValueError(f"must be at most {format_duration(maximum)}")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds as the shortest exact duration text ``parse_duration`` reads back (``72h``, ``90d``,
    ``0.05s``)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
