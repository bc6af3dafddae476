"""The shape of the capacity review: what ``review`` returns, ``--json`` prints (without the plots'
``series``), ``vgpumon.capacity.render`` prints and ``vgpumon.capacity.html`` plots.

TypedDicts (the review is JSON as it is), checked by mypy wherever a key is read; docs/capacity.md
says what the figures mean and how they are made. Values in base units, ``None`` where unknown.
"""

from __future__ import annotations

from typing import Literal, TypedDict

# shared with the other report; re-exported for the review's readers
from vgpumon.model.report_parts import Link as Link
from vgpumon.model.report_parts import LinkCapacity as LinkCapacity
from vgpumon.model.report_parts import Span as Span

#: A minute's p95 as ``(epoch seconds, bytes/s)``, for the plots.
Point = tuple[float, float]


class Series(TypedDict):
    """p95 per minute of each direction (at most ``SERIES_POINTS`` points; ``series=True``)."""

    tx: list[Point]
    rx: list[Point]


class WindowStats(TypedDict):
    """A direction's window figures: quantiles of its per-minute statistics, max the largest."""

    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None


class LinkState(TypedDict):
    """The negotiated link against the max, and whether the slot holds the card back."""

    state: Literal["unknown", "below_max", "at_max"]
    text: str
    slot: str | None


class GpuDirection(TypedDict):
    p50_bytes_per_second: float | None
    p95_bytes_per_second: float | None
    p99_bytes_per_second: float | None
    max_bytes_per_second: float | None
    p95_share_of_max_link: float | None
    p95_share_of_negotiated_link: float | None
    max_share_of_max_link: float | None


class _GpuCapacity(TypedDict):
    index: int
    uuid: str
    name: str | None
    pci_bus_id: str | None
    minutes: int
    link_max: LinkCapacity
    link_negotiated: LinkCapacity  # the fastest the link trained to in the window
    gpu_max_generation: int | None
    link_state: LinkState
    tx: GpuDirection
    rx: GpuDirection
    saturated: bool  # TX or RX p95 at or above the saturation ratio of the max link (GpuPcieSaturated's test)
    impossible: str | None  # a p95 above the max link: what to check (the link speed, the readings)


class CardKvOffload(TypedDict):
    """The part of a card's PCIe traffic (or of the cards' behind a shared port) that vLLM's KV
    offload moved over the window (means)."""

    servers: list[str]  # host:port of the servers offloading through it
    split: int  # the most GPUs one server's traffic was split across (evenly)
    polls: int  # vLLM polls with a figure in the window
    load_bytes_per_second: float  # offload medium → GPU: part of its RX
    store_bytes_per_second: float  # GPU → medium: part of its TX
    rx_mean_bytes_per_second: float | None  # the card's mean RX over the window
    tx_mean_bytes_per_second: float | None
    rx_share_of_traffic: float | None  # load over the card's mean RX (at most 1)
    tx_share_of_traffic: float | None  # store over its mean TX
    load_share_of_max_link: float | None


class GpuCapacity(_GpuCapacity, total=False):
    """One card's PCIe load over the window against its links."""

    series: Series  # series=True (the HTML plots); never in --json
    kv_offload: CardKvOffload  # a card a vLLM server offloads KV through


class SharedDirection(TypedDict):
    p50_bytes_per_second: float | None
    p95_bytes_per_second: float | None
    p99_bytes_per_second: float | None
    max_bytes_per_second: float | None
    p95_share: float | None
    per_card_p95_bytes_per_second: float | None


class Projection(TypedDict):
    add: int  # cards added, each with the current per-card load
    p95_share: float | None


class _SharedPort(TypedDict):
    port: str
    kind: str  # bridge or root
    link_max: LinkCapacity
    link_current: Link
    gpus: list[int]
    cards: int
    tx: SharedDirection
    rx: SharedDirection
    p95_share: float | None  # the worse direction
    saturated: bool  # never when impossible
    impossible: str | None  # a p95 above 100 % of the link: the topology or link speed to check
    saturation_ratio: float
    projections: list[Projection]  # add = 1 … --add
    headroom_cards: int | None  # None: no bound (no load, or the link unknown)


class SharedPort(_SharedPort, total=False):
    """A switch or root port above two or more cards: their combined load against its link."""

    series: Series  # series=True (the HTML plots); never in --json
    kv_offload: CardKvOffload  # its cards' KV offload against their summed mean traffic and its link


class HostReview(TypedDict):
    """The review of one host (``window`` ``None`` with a ``note`` when there is nothing to review)."""

    host: str
    window: Span | None
    minutes: int
    gpus: list[GpuCapacity]
    shared: list[SharedPort]
    saturated: list[str]  # ports
    saturated_gpus: list[int]  # cards saturating their own link
    impossible: list[str]  # ports, and "GPU <index>", whose p95 is above their link's capacity
    note: str | None


class ReviewSource(TypedDict):
    """Where ``capacity --prometheus`` read the history, and what that source cannot say."""

    kind: str  # prometheus
    where: str
    notes: list[str]


class _Review(TypedDict):
    """The review of several hosts."""

    window_seconds: float
    add_cards: int
    saturation_ratio: float
    hosts: list[HostReview]
    unknown_hosts: list[str]  # asked for, not in the store


class Review(_Review, total=False):
    """The review of several hosts; ``source`` only from ``--prometheus``."""

    source: ReviewSource
