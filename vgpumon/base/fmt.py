"""Plain formatting shared by every renderer (diagnose, capacity, the rules' texts, the CLI): sizes,
shares, durations and times as the reports print them. Field-aware formatting (units, decoding
tables) is ``vgpumon.catalogue.fmt``, built on the field catalogue."""

from __future__ import annotations

import datetime as dt
import re
from typing import overload


def gb(value: float | None) -> str:
    """Bytes in GB (SI, as the leak's slope is quoted: 0.3 GB/day)."""
    return "N/A" if value is None else f"{value / 1e9:.2f} GB"


def pct(value: float | None) -> str:
    """A ratio as a percentage."""
    return "N/A" if value is None else f"{value * 100:.0f} %"


def duration(seconds: float | None) -> str:
    """A duration the way people say it: ``45 s``, ``12 min``, ``6.0 h``, ``270 days``."""
    if seconds is None:
        return "N/A"
    if seconds < 0:  # never "-473 s": a time ahead of the clock it is measured from
        return f"{duration(-seconds)} ahead (a clock step?)"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"


# a time in gives a text out: reports type their timestamps as ``str`` where one is always known
@overload
def iso(ts: float) -> str: ...


@overload
def iso(ts: None) -> None: ...


@overload
def iso(ts: float | None) -> str | None: ...


def iso(ts: float | None) -> str | None:
    """Epoch seconds as ISO 8601 UTC (``2026-11-30T01:39:13+00:00``); ``None`` stays ``None``."""
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds")


def clock(ts: float | None) -> str:
    """Epoch seconds as ``HH:MM:SS`` UTC, for times inside one report."""
    if ts is None:
        return "?"
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%H:%M:%S")


#: Stands for the space between a number and its unit while a report is wrapped: one cell wide
#: and not whitespace (U+2800, the blank braille pattern), so that a wrap never splits "63.0 GB/s"
#: or "5 s ago" between the figure and its unit; the console puts the space back as it writes
#: (``vgpumon.diagnose.render.console``), so no output, JSON or copied text ever holds it.
UNIT_JOINER = "\u2800"

#: A figure then one space then a unit these reports print (sizes, rates, shares, durations,
#: temperatures, power, clocks), ended by anything but a letter, a digit or ``/``.
_FIGURE_UNIT = re.compile(
    r"(?<=\d) (?=(?:[kMGT]i?B/s|[kMGT]i?B|B/s|%|ms|s|min|h|days?|W|°C|MHz|ticks?|GB/h|GB/day)(?![\w/]))"
)


def keep_units(text: str) -> str:
    """``text`` with the space of every figure-and-unit pair (``63.0 GB/s``, ``94 %``, ``5 s``)
    made unbreakable for wrapping (``UNIT_JOINER``); every other character, so every offset of
    a styled span, stays where it was."""
    return _FIGURE_UNIT.sub(UNIT_JOINER, text) if " " in text else text


def unjoin_units(text: str) -> str:
    """What ``keep_units`` joined, spaced again: the text as it is written out."""
    return text.replace(UNIT_JOINER, " ") if UNIT_JOINER in text else text


#: Control characters (C0 but tab and newline, DEL, C1) and the bidirectional overrides: what lets
#: text from outside (a process's command line, a label from Prometheus) move a terminal's cursor,
#: retitle its window, clear it or reorder what is shown.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(value: object) -> object:
    """``value`` (a report: dicts, lists, strings, numbers) with every control character of its
    strings shown as ``\\xNN`` / ``\\uNNNN``, for a terminal. JSON output needs none of this: the
    encoder escapes them."""
    if isinstance(value, str):
        return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}", value)
    if isinstance(value, dict):
        return {k: printable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable(v) for v in value]
    return value
