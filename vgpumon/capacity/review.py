"""The PCIe headroom review of one host, from the 1-minute rollups (pure data; no printing).

Per GPU: TX and RX p50/p95/p99/max over the window against the negotiated link (the fastest the
link trained to in the window: idle links down-train, FACTS §2) and the max link (device ∧ slot),
and the link's state against its max. Per shared switch or root port (the stored topology,
``pcie_links``): the cards behind it, their combined load against the port's own link, and what
adding cards with the current per-card load would do to it.

How the figures are made (docs/capacity.md):

* A card's p50/p95/p99 over the window are those quantiles of its per-minute p50/p95/p99, its max
  the largest minute max. For the p95 of a steady load this is the load's p95; for a bursty one
  it is at or above it — the review errs towards less headroom, never more.
* A shared port's combined load in a minute is the sum of its cards' figures for that minute (the
  sum of p95s bounds the p95 of the sum from above: bursts that never coincide are counted as if
  they did). Its window figures are the quantiles of those per-minute sums.
* Projection: adding N cards that each carry the current per-card load (combined p95 ÷ cards)
  takes the port to combined p95 × (cards + N) ÷ cards. Headroom is the number of such cards
  that fit below the saturation ratio (the rules' ``pcie_saturation_ratio``, 80 %).
* Shares use the max link as the denominator (FACTS §2), the negotiated link beside it. A card
  is saturated by the rules' test (TX or RX p95 at the saturation ratio); a share above 100 %
  of a link is impossible (``IMPOSSIBLE_SHARE``), which names what to check, and never saturated.
* KV offload: a card that a vLLM server offloads KV through (``vgpumon.store.kv_offload``) says
  the mean bytes/s the offload moved in each direction, as a share of the card's mean traffic in
  that direction (the mean of its per-minute means) and of its max link.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Literal, Mapping, Sequence

from vgpumon.base.fmt import iso
from vgpumon.base.pcie import link_capacity_bytes_per_second
from vgpumon.capacity.schema import (
    CardKvOffload,
    GpuCapacity,
    GpuDirection,
    HostReview,
    LinkState,
    Point,
    Review,
    SharedDirection,
    SharedPort,
    WindowStats,
)
from vgpumon.store import Store, kv_offload
from vgpumon.store.kv_offload import GpuKvOffload, share
from vgpumon.store.rollup import percentile
from vgpumon.store.tables import decode_rollup

if TYPE_CHECKING:
    from vgpumon.model import GpuIdentity, PcieHop
    from vgpumon.store import StoredGpu

DIRECTIONS = ("tx", "rx")
#: Quantile of the window taken of each per-minute statistic (``max`` is the largest).
STATS = {"p50": 0.5, "p95": 0.95, "p99": 0.99, "max": None}
#: Points per series in the HTML plots (minutes are averaged down to this many).
SERIES_POINTS = 600
_LINK = ("pcie_link_gen_current_max", "pcie_link_width_current_max")
#: A p95 above this share of a link is not a load but an error: no link carries more than its
#: capacity, so the topology (which cards share it) or the link speed read for it is wrong.
IMPOSSIBLE_SHARE = 1.0


def _col(direction: str, stat: str) -> str:
    return f"pcie_{direction}_bytes_per_second_{stat}"


COL = {(d, s): _col(d, s) for d in DIRECTIONS for s in STATS}
#: Per-minute means: the denominators of the share of a card's traffic that KV offload moved.
MEAN = {d: _col(d, "mean") for d in DIRECTIONS}
COLUMNS = tuple(COL.values()) + tuple(MEAN.values()) + _LINK

#: Per-minute columns as ``rollup_columns`` gives them: column → the minute values, oldest first
#: (stored integers, ``None`` where NULL; ``ts``, epoch ms, never is).
Minutes = Mapping[str, Sequence[int | None]]


def _window_stats(per_minute: Minutes, direction: str) -> WindowStats:
    """Window figures of one direction from its per-minute stored values (``rollup_columns``),
    decoded at the end."""

    def one(stat: str) -> float | None:
        q = STATS[stat]
        values = sorted([v for v in per_minute.get(COL[direction, stat], ()) if v is not None])
        if not values:
            return None
        raw = values[-1] if q is None else percentile(values, q)
        value: float | None = decode_rollup(COL[direction, stat], raw)
        return value

    return {"p50": one("p50"), "p95": one("p95"), "p99": one("p99"), "max": one("max")}


def _window_mean(per_minute: Minutes, direction: str) -> float | None:
    """The mean of a direction's per-minute means (minutes weigh the same), decoded."""
    values = [v for v in per_minute.get(MEAN[direction], ()) if v is not None]
    if not values:
        return None
    mean: float | None = decode_rollup(MEAN[direction], sum(values) / len(values))
    return mean


def _kv_offload(kvs: Sequence[GpuKvOffload], minutes: Sequence[Minutes], cap_max: float | None) -> CardKvOffload:
    """The KV-offload traffic charged to a card (or to the cards behind a shared port) against
    their own mean traffic and the max link."""

    def total(direction: str) -> float | None:
        means = [m for c in minutes if (m := _window_mean(c, direction)) is not None]
        return sum(means) if means else None

    load = sum(kv["load_bytes_per_second"] for kv in kvs)
    store = sum(kv["store_bytes_per_second"] for kv in kvs)
    rx, tx = total("rx"), total("tx")
    return {
        "servers": sorted({s for kv in kvs for s in kv["servers"]}), "split": max(kv["split"] for kv in kvs),
        "polls": sum(kv["polls"] for kv in kvs),
        "load_bytes_per_second": load, "store_bytes_per_second": store,
        "rx_mean_bytes_per_second": rx, "tx_mean_bytes_per_second": tx,
        "rx_share_of_traffic": share(load, rx), "tx_share_of_traffic": share(store, tx),
        "load_share_of_max_link": _share(load, cap_max),
    }


def _worst(*shares: float | None) -> float | None:
    known = [v for v in shares if v is not None]
    return max(known) if known else None


def _link_text(gen: int | None, width: int | None) -> str:
    return f"Gen{gen or '?'} x{width or '?'}"


def _share(value: float | None, capacity: float | None) -> float | None:
    return None if value is None or not capacity else value / capacity


def _downsample(points: list[Point], n: int = SERIES_POINTS) -> list[Point]:
    """At most ``n`` points: means of consecutive runs (the plot's resolution, not the review's)."""
    if len(points) <= n:
        return points
    size = math.ceil(len(points) / n)
    return [(points[i][0], sum(v for _, v in points[i:i + size]) / len(points[i:i + size])) for i in range(0, len(points), size)]


def _series(cols: Minutes, direction: str) -> list[Point]:
    """p95 per minute of one direction as ``(epoch seconds, bytes/s)``, for the plots."""
    col = COL[direction, "p95"]
    # (``ts`` is the rollups' key: never NULL)
    return _downsample([(t / 1000.0, decode_rollup(col, v)) for t, v in zip(cols.get("ts", ()), cols.get(col, ()))
                        if v is not None and t is not None])


def review_host(
    store: Store,
    hostname: str,
    *,
    window_seconds: float,
    add_cards: int = 2,
    saturation_ratio: float = 0.8,
    series: bool = False,
) -> HostReview:
    """The capacity review of one host.

    Args:
        store: an open store.
        hostname: the host as stored.
        window_seconds: how far back from the host's newest rollup minute.
        add_cards: the projection adds this many cards (and every count up to it).
        saturation_ratio: a shared link at or above this share of its max link at p95 is
            saturated, and headroom counts the cards that keep it below.
        series: also return per-minute series for plots (``gpus[].series``, ``shared[].series``).

    Returns:
        The ``HostReview`` (``vgpumon.capacity.schema``): ``host``, ``window``, ``minutes``,
        ``gpus``, ``shared``, ``saturated`` (ports), ``note``; values in base units, ``None``
        where unknown.

    Raises:
        StoreUnavailableError: the store cannot be read.
    """
    out: HostReview = {"host": hostname, "window": None, "minutes": 0, "gpus": [], "shared": [], "saturated": [],
                       "saturated_gpus": [], "impossible": [], "note": None}
    gpus = store.gpus_of(hostname)
    if not gpus:
        out["note"] = "host not in the store"
        return out
    ids = [g.id for g in gpus]
    newest = store.newest_rollup_ts(ids)
    if newest is None:
        out["note"] = "no 1-minute rollups for this host yet (the agent rolls up as it runs; `vgpumon db prune` does it at once)"
        return out
    end = newest + 60.0
    start = end - window_seconds
    # one query for the cards, one per shared port (its per-minute sums, in SQL)
    cols = store.rollup_columns(ids, start, end, COLUMNS)
    out["window"] = {"start": iso(start), "end": iso(end), "seconds": window_seconds}
    out["minutes"] = len({t for c in cols.values() for t in c["ts"]})
    by_uuid = {}
    offload = kv_offload.by_gpu(store.engine, hostname, start, end)
    for g in gpus:
        ident = g.identity
        c = cols[g.id]
        gens = [v for v in c.get(_LINK[0], ()) if v is not None]
        widths = [v for v in c.get(_LINK[1], ()) if v is not None]
        neg_gen, neg_width = (max(gens) if gens else None), (max(widths) if widths else None)
        cap_max = link_capacity_bytes_per_second(ident.pcie_link_gen_max, ident.pcie_link_width_max)
        cap_neg = link_capacity_bytes_per_second(neg_gen, neg_width)

        entry: GpuCapacity = {
            "index": ident.index, "uuid": ident.uuid, "name": ident.name, "pci_bus_id": ident.pci_bus_id,
            "minutes": len(c["ts"]),
            "link_max": {"generation": ident.pcie_link_gen_max, "width": ident.pcie_link_width_max, "capacity_bytes_per_second": cap_max},
            "link_negotiated": {"generation": neg_gen, "width": neg_width, "capacity_bytes_per_second": cap_neg},
            "gpu_max_generation": ident.pcie_link_gen_gpu_max,
            "link_state": _link_state(ident, neg_gen, neg_width),
            "tx": _card(c, "tx", cap_max, cap_neg),
            "rx": _card(c, "rx", cap_max, cap_neg),
            "saturated": False, "impossible": None,
        }
        share = _worst(entry["tx"]["p95_share_of_max_link"], entry["rx"]["p95_share_of_max_link"])
        if share is not None and share > IMPOSSIBLE_SHARE:
            entry["impossible"] = (
                f"p95 at {share * 100:.0f} % of its max link {_link_text(ident.pcie_link_gen_max, ident.pcie_link_width_max)}: "
                "no link carries more than its capacity; check the max link NVML reports for it "
                "(nvidia-smi -q, Max Link Gen/Width) and its PCIe readings")
            out["impossible"].append(f"GPU {ident.index}")
        elif share is not None and share >= saturation_ratio:  # GpuPcieSaturated's test, on the rollups
            entry["saturated"] = True
            out["saturated_gpus"].append(ident.index)
        if series:
            entry["series"] = {"tx": _series(c, "tx"), "rx": _series(c, "rx")}
        if ident.uuid in offload:
            entry["kv_offload"] = _kv_offload([offload[ident.uuid]], [c], cap_max)
        out["gpus"].append(entry)
        by_uuid[ident.uuid] = g

    topology = store.topology(hostname)
    summed: dict[frozenset[int], Minutes] = {}  # a switch's uplink and its root port share their cards
    for bdf, uuids in sorted(topology.shared().items()):
        hop = topology.hop(bdf)
        if hop is None or hop.kind == "host_bridge":
            continue  # the root complex has no link of its own in sysfs: nothing to divide by
        members = [by_uuid[u] for u in uuids if u in by_uuid]
        key = frozenset(g.id for g in members)
        if key not in summed:
            summed[key] = _sum_minutes([cols[g.id] for g in members])
        port = _shared(hop, members, summed[key], add_cards=add_cards, saturation_ratio=saturation_ratio, series=series)
        if kvs := [offload[g.identity.uuid] for g in members if g.identity.uuid in offload]:
            port["kv_offload"] = _kv_offload(kvs, [cols[g.id] for g in members], port["link_max"]["capacity_bytes_per_second"])
        out["shared"].append(port)
        if port["saturated"]:
            out["saturated"].append(bdf)
        if port["impossible"]:
            out["impossible"].append(bdf)
    if not topology.hops:
        out["note"] = "no PCIe topology stored for this host (the agent reads it from sysfs at start): shared links unknown"
    return out


def _card(minutes: Minutes, direction: str, cap_max: float | None, cap_neg: float | None) -> GpuDirection:
    """One card's window figures of one direction against its max and negotiated links."""
    stats = _window_stats(minutes, direction)
    return {"p50_bytes_per_second": stats["p50"], "p95_bytes_per_second": stats["p95"],
            "p99_bytes_per_second": stats["p99"], "max_bytes_per_second": stats["max"],
            "p95_share_of_max_link": _share(stats["p95"], cap_max),
            "p95_share_of_negotiated_link": _share(stats["p95"], cap_neg),
            "max_share_of_max_link": _share(stats["max"], cap_max)}


def _sum_minutes(cards: Sequence[Minutes]) -> Minutes:
    """Per minute, each PCIe statistic summed over the cards (a card without a row that minute, or
    with NULL, adds nothing; a minute where every value is NULL stays NULL). The cards' minutes
    are nearly always the same (one rollup job, one tick clock): then the columns add up
    element-wise; otherwise by minute."""
    cards = [c for c in cards if c["ts"]]
    if not cards:
        return {}
    names = tuple(COL.values())
    if all(c["ts"] == cards[0]["ts"] for c in cards):
        out: dict[str, Sequence[int | None]] = {"ts": cards[0]["ts"]}
        for n in names:
            columns = [c[n] for c in cards]
            if not any(None in col for col in columns):  # the common case, summed in C
                out[n] = list(map(sum, zip(*columns)))
            else:
                out[n] = [None if all(v is None for v in vs) else sum(v for v in vs if v is not None) for vs in zip(*columns)]
        return out
    acc: dict[int, dict[str, int | None]] = {}  # minute → column → the sum so far
    for c in cards:
        for i, t in enumerate(c["ts"]):
            assert t is not None  # the rollups' key
            row = acc.setdefault(t, dict.fromkeys(names))
            for n in names:
                v, so_far = c[n][i], row[n]
                if v is not None:
                    row[n] = v if so_far is None else so_far + v
    minutes = sorted(acc)
    return {"ts": minutes, **{n: [acc[t][n] for t in minutes] for n in names}}


def _link_state(ident: GpuIdentity, gen: int | None, width: int | None) -> LinkState:
    """The negotiated link against the max: ``at max``, ``below max`` (down-trained under load:
    a riser, a dirty contact, a BIOS setting) or unknown; and whether the slot holds the card back."""
    max_gen, max_width = ident.pcie_link_gen_max, ident.pcie_link_width_max
    state: Literal["unknown", "below_max", "at_max"]
    if gen is None or width is None or max_gen is None or max_width is None:
        state, text = "unknown", "current or max link not reported"
    elif gen < max_gen or width < max_width:
        state, text = "below_max", f"below max: never above {_link_text(gen, width)} in the window"
    else:
        state, text = "at_max", "at max"
    slot = None
    if ident.pcie_link_gen_gpu_max is not None and max_gen is not None and max_gen < ident.pcie_link_gen_gpu_max:
        slot = f"slot Gen{max_gen} holds back a Gen{ident.pcie_link_gen_gpu_max} card"
    return {"state": state, "text": text, "slot": slot}


def _shared(hop: PcieHop, members: Sequence[StoredGpu], sums: Minutes, *, add_cards: int, saturation_ratio: float,
            series: bool) -> SharedPort:
    """One shared switch or root port: its cards' per-minute summed load against its link."""
    cap = link_capacity_bytes_per_second(hop.link_gen_max, hop.link_width_max)
    n = len(members)
    worst_share: float | None = None
    worst_card: float | None = None
    directions: dict[str, SharedDirection] = {}
    for d in DIRECTIONS:
        stats = _window_stats(sums, d)
        p95 = stats["p95"]
        per_card = None if p95 is None or not n else p95 / n
        directions[d] = {"p50_bytes_per_second": stats["p50"], "p95_bytes_per_second": p95,
                         "p99_bytes_per_second": stats["p99"], "max_bytes_per_second": stats["max"],
                         "p95_share": _share(p95, cap), "per_card_p95_bytes_per_second": per_card}
        share = _share(p95, cap)
        if share is not None and (worst_share is None or share > worst_share):
            worst_share, worst_card = share, per_card
    headroom: int | None
    if worst_card is None or cap is None:
        headroom = None
    elif worst_card <= 0:
        headroom = None  # the cards carry nothing: the load gives no bound
    else:
        headroom = max(0, math.floor(saturation_ratio * cap / worst_card + 1e-9) - n)
    entry: SharedPort = {
        "port": hop.bdf, "kind": hop.kind,
        "link_max": {"generation": hop.link_gen_max, "width": hop.link_width_max, "capacity_bytes_per_second": cap},
        "link_current": {"generation": hop.link_gen_current, "width": hop.link_width_current},
        "gpus": sorted(g.identity.index for g in members), "cards": n,
        "tx": directions["tx"], "rx": directions["rx"],
        "p95_share": worst_share,
        "saturated": worst_share is not None and saturation_ratio <= worst_share <= IMPOSSIBLE_SHARE,
        "impossible": None if worst_share is None or worst_share <= IMPOSSIBLE_SHARE else (
            f"p95 at {worst_share * 100:.0f} % of the {_link_text(hop.link_gen_max, hop.link_width_max)} link of {hop.bdf}: no link "
            f"carries more than its capacity; check the topology stored for it (GPUs {', '.join(str(g.identity.index) for g in members)} "
            "below it: lspci -tv) and its link speed and width (sysfs max_link_speed, max_link_width)"),
        "saturation_ratio": saturation_ratio,
        "projections": [
            {"add": k, "p95_share": None if worst_share is None or not n else worst_share * (n + k) / n}
            for k in range(1, add_cards + 1)
        ],
        "headroom_cards": headroom,
    }
    if series:
        entry["series"] = {"tx": _series(sums, "tx"), "rx": _series(sums, "rx")}
    return entry


def review(
    store: Store,
    hosts: Sequence[str] | None = None,
    *,
    window_seconds: float = 7 * 86400.0,
    add_cards: int = 2,
    saturation_ratio: float = 0.8,
    series: bool = False,
    progress: Callable[[str], object] | None = None,
) -> Review:
    """The capacity review of several hosts (every host in the store when ``hosts`` is empty).

    Args:
        progress: called with each host name after its review (a progress bar).

    Returns:
        The ``Review``: ``window_seconds``, ``add_cards``, ``saturation_ratio``, ``hosts`` (each
        ``review_host``'s), ``unknown_hosts``.
    """
    known = store.hostnames()
    wanted = list(hosts) if hosts else known
    out: Review = {"window_seconds": window_seconds, "add_cards": add_cards, "saturation_ratio": saturation_ratio,
                           "hosts": [], "unknown_hosts": [h for h in wanted if h not in known]}

    def one(h: str) -> HostReview:
        result = review_host(store, h, window_seconds=window_seconds, add_cards=add_cards, saturation_ratio=saturation_ratio, series=series)
        if progress is not None:
            progress(h)
        return result

    # one host after the other: reviewing hosts on two threads was slower on 2 cores (4.7–4.9 s
    # against 3.6 s for 16 hosts, docs/benchmarks.md): the GIL-bound arithmetic dominates
    out["hosts"] = [one(h) for h in wanted if h in known]
    return out
