"""Validation at the door: every value from outside (NVML, ``/metrics``, psutil) is checked against
its catalogue entry before it enters a snapshot.

A value is *rejected* — it becomes ``None`` with a reason and is counted per field — when it is
not a number (the string ``"[N/A]"``, a dict), NaN or ±Inf, a blank sentinel of NVML or DCGM
(``2**32 − 1``, ``2**64 − 1``, DCGM's 32-bit, 64-bit and FP64 blanks, which other exporters have
let through as 4.29e9 or 9.22e18), or outside the field's range (``Field.lo``/``hi`` and its
device bound, ``Field.limit``). Ranges are physical bounds chosen to fit the field's column
(``tests/test_catalogue.py`` checks both ends encode), so a value that passes the door can be
stored.

The check costs one type test, two comparisons and one multiplication on the common path; the
reason is worked out only for a value that fails.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Iterable

from vgpumon.catalogue.core import Field

_NUMBER = (int, float)
# Blank sentinels (DCGM dcgm_structs.h: DCGM_INT32_BLANK 0x7ffffff0, DCGM_INT64_BLANK
# 0x7ffffffffffffff0 and the NOT_FOUND/NOT_SUPPORTED/NOT_PERMISSIONED codes above them;
# DCGM_FP64_BLANK 140737488355328.0 = 2**47 and its codes), and NVML's all-ones "not available".
_INT32_BLANK = 0x7FFF_FFF0
_INT64_BLANK = 0x7FFF_FFFF_FFFF_FFF0
_FP64_BLANK = float(2**47)
#: Smallest value that can be a sentinel: below it the sentinel test is one comparison.
_SENTINEL_FLOOR = _INT32_BLANK
#: Between these (exclusive) no value is a sentinel either: memory sizes and byte counters live
#: here (2^32-1 is the last sentinel below, DCGM's FP64 blank 2^47 the first above).
_PLAIN_LO = 0xFFFF_FFFF
_PLAIN_HI = _FP64_BLANK


def sentinel(value: Any) -> str | None:
    """The name of the blank sentinel ``value`` is, or ``None`` for an ordinary number.

    Note: a counter that happens to stand on one of these 16-wide bands (an energy counter in mJ
    passing 2 147 483 632) is rejected for that one read; the next read passes.
    """
    if not isinstance(value, _NUMBER) or value < _SENTINEL_FLOOR:
        return None
    if value == 0xFFFF_FFFF:
        return "2^32-1 (NVML: not available)"
    if value == 0xFFFF_FFFF_FFFF_FFFF:
        return "2^64-1 (NVML: not available)"
    if _INT32_BLANK <= value <= 0x7FFF_FFFF:
        return "DCGM 32-bit blank"
    if _INT64_BLANK <= value <= 0x7FFF_FFFF_FFFF_FFFF:
        return "DCGM 64-bit blank"
    if _FP64_BLANK <= value <= _FP64_BLANK + 16:
        return "DCGM FP64 blank"
    return None


class Rejected(Exception):
    """A value failed the door; ``reason`` starts with ``"rejected: "``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def is_rejection(reason: str | None) -> bool:
    """True when a ``missing`` reason says the value was rejected at the door."""
    return reason is not None and reason.startswith("rejected")


def _short(raw: Any) -> str:
    text = repr(raw)
    return text if len(text) <= 40 else text[:37] + "..."


class Door:
    """Checks values against their catalogue entries and counts rejections per field.

    Args:
        fields: the fields this door admits, by name (the first entry of a name wins when two
            tables share it with the same meaning, e.g. ``memory_total_bytes``).

    Attributes:
        rejected: field name → values rejected since the door was made (a source's lifetime).

    Not thread-safe: one door per source, used from the source's thread.
    """

    def __init__(self, fields: Iterable[Field]) -> None:
        self.fields: dict[str, Field] = {}
        for f in fields:
            self.fields.setdefault(f.name, f)
        # name → (lo, hi, integral, flag); None bounds are open
        self._spec = {
            n: (
                -math.inf if f.lo is None else f.lo,
                math.inf if f.hi is None else f.hi,
                f.integral,
                f.kind == "flag" or f.encoding.kind == "bool",
            )
            for n, f in self.fields.items()
        }
        # text fields: name → longest value the column holds
        self._text = {n: f.encoding.length or 0 for n, f in self.fields.items() if f.encoding.kind == "text"}
        #: the numeric fields' ``(lo, hi, integral, flag)``, for callers that inline ``value``'s
        #: common path (a plain number in range) and call ``value`` for everything else
        self.numeric_spec = {n: spec for n, spec in self._spec.items() if n not in self._text}
        self.rejected: Counter[str] = Counter()

    def value(self, name: str, raw: Any, scale: float = 1.0, limit: float | None = None) -> Any:
        """The base-unit value of a raw reading, or an exception saying why it cannot be one.

        Args:
            name: the field (a catalogue name this door admits).
            raw: the value as the outside gave it (NVML's unit: percent, mW, MHz, ...).
            scale: base units per raw unit (0.01 for percent → ratio, 1e-3 for mW → W).
            limit: an upper bound from the device (PCIe capacity × 1.25, memory total), checked
                beside the field's own ``hi``; ``None`` when unknown.

        Returns:
            ``int`` for counts, codes and bitmasks, ``bool`` for flags, ``str`` for text (which
            must be a string that fits its column, without NUL), else ``float``. A value
            within 1e-6 (relative) above ``hi`` is clamped to it (GPM's float arithmetic gives
            100.0000001 %).

        Raises:
            Rejected: the value is not a number, NaN, ±Inf, a blank sentinel or out of range;
                the rejection is counted in ``rejected[name]`` before it is raised.
            KeyError: ``name`` is not a field of this door (a programming error).
        """
        lo, hi, integral, flag = self._spec[name]
        if name in self._text:
            return self.text(name, raw, self._text[name])
        if raw.__class__ in _NUMBER or isinstance(raw, _NUMBER):
            if raw >= _SENTINEL_FLOOR and sentinel(raw):
                raise self._reject(name, raw)
            try:
                x = raw * scale if scale != 1.0 else raw
            except OverflowError:  # an integer beyond any float (a capture's 300 digits)
                raise self._reject(name, raw, "too large for a number") from None
            if lo <= x <= hi and (limit is None or x <= limit * (1 + 1e-6)):
                if flag:
                    return bool(x)
                if integral:
                    if x != int(x):
                        raise self._reject(name, raw, "not a whole number")
                    return int(x)
                return float(x)
            if hi < x <= hi + abs(hi) * 1e-6 and (limit is None or x <= limit):
                return hi if not integral else int(hi)
        raise self._reject(name, raw, scale=scale, limit=limit)

    def text(self, name: str, raw: Any, length: int | None = None) -> str:
        """A text value from outside, as every store can hold it: a string of at most ``length``
        characters (the field's column; given for text that is no field of this door, such as
        the labels keying a row) with no NUL (Postgres refuses one, SQLite would store it) and
        no lone surrogate (JSON's ``"\\ud800"``: no UTF-8 encodes it).

        Raises:
            Rejected: anything else, counted in ``rejected[name]``.
        """
        limit = self._text[name] if length is None else length
        if isinstance(raw, str) and len(raw) <= limit and "\x00" not in raw:
            if raw.isascii():
                return raw
            try:
                raw.encode("utf-8")
                return raw
            except UnicodeEncodeError:
                why = f"not UTF-8 text: {_short(raw)}"
        elif not isinstance(raw, str):
            why = f"not text: {_short(raw)}"
        elif "\x00" in raw:
            why = f"a NUL character in {_short(raw)}"
        else:
            why = f"longer than {limit} characters ({len(raw)})"
        self.rejected[name] += 1
        raise Rejected(f"rejected: {why}")

    def _reject(self, name: str, raw: Any, why: str | None = None, scale: float = 1.0, limit: float | None = None) -> Rejected:
        self.rejected[name] += 1
        if why is None:
            why = self.why(name, raw, scale, limit)
        return Rejected(f"rejected: {why}")

    def why(self, name: str, raw: Any, scale: float = 1.0, limit: float | None = None) -> str:
        """Why ``raw`` fails ``name``'s check (for messages; does not count)."""
        if not isinstance(raw, _NUMBER):
            return f"not a number: {_short(raw)}"
        if isinstance(raw, float) and math.isnan(raw):
            return "NaN"
        if isinstance(raw, float) and math.isinf(raw):
            return f"infinite: {raw!r}"
        s = sentinel(raw)
        if s:
            return f"blank sentinel {raw!r} ({s})"
        f = self.fields[name]
        try:
            x = raw * scale
        except OverflowError:  # an integer beyond any float
            return f"too large for a number: {_short(raw)}"
        if limit is not None and x > limit * (1 + 1e-6) and (f.lo is None or x >= f.lo):
            return f"{x:.6g} above the device's bound {limit:.6g} {f.unit}"
        return f"{x:.6g} outside {f.lo:g}..{f.hi:g} {f.unit}"

    def check_row(self, row: dict[str, Any], names: Iterable[str]) -> dict[str, str]:
        """Check the values of ``names`` in a dict row of base-unit values, in place.

        A value that fails becomes ``None`` (counted); ``None`` stays ``None``.

        Returns:
            field name → rejection reason, for the fields that failed.
        """
        failed: dict[str, str] = {}
        for n in names:
            raw = row.get(n)
            if raw is None:
                continue
            try:
                row[n] = self.value(n, raw)
            except Rejected as exc:
                row[n] = None
                failed[n] = exc.reason
        return failed
