"""JSON parts the reports share (``diagnose``'s report, ``capacity``'s review): they sit here,
below both, since the two report packages are siblings and import nothing of each other."""

from __future__ import annotations

from typing import TypedDict


class Span(TypedDict):
    """A stretch of time: ISO 8601 UTC ends and its length in seconds."""

    start: str
    end: str
    seconds: float


class Link(TypedDict):
    """A PCIe link as trained now (``None`` where not reported)."""

    generation: int | None
    width: int | None


class LinkCapacity(TypedDict):
    """A PCIe link with its payload capacity per direction (FACTS §3; ``None`` when the
    generation or width is unknown)."""

    generation: int | None
    width: int | None
    capacity_bytes_per_second: float | None
