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
* Shares use the max link as the denominator (FACTS §2), the negotiated link beside it.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from vgpumon.base.fmt import iso
from vgpumon.base.pcie import link_capacity_bytes_per_second
from vgpumon.store import Store
from vgpumon.store.rollup import percentile
from vgpumon.store.tables import decode_rollup

DIRECTIONS = ("tx", "rx")
#: Quantile of the window taken of each per-minute statistic (``max`` is the largest).
STATS = {"p50": 0.5, "p95": 0.95, "p99": 0.99, "max": None}
#: Points per series in the HTML plots (minutes are averaged down to this many).
SERIES_POINTS = 600
_LINK = ("pcie_link_gen_current_max", "pcie_link_width_current_max")


def _col(direction: str, stat: str) -> str:
    return f"pcie_{direction}_bytes_per_second_{stat}"


COL = {(d, s): _col(d, s) for d in DIRECTIONS for s in STATS}
COLUMNS = tuple(COL.values()) + _LINK


def _window_stats(per_minute: dict[str, Any], direction: str) -> dict[str, float | None]:
    """Window figures of one direction from its per-minute stored values (``rollup_columns``),
    decoded at the end."""
    out: dict[str, float | None] = {}
    for stat, q in STATS.items():
        values = sorted([v for v in per_minute.get(COL[direction, stat], ()) if v is not None])
        if not values:
            out[stat] = None
            continue
        raw = values[-1] if q is None else percentile(values, q)
        out[stat] = decode_rollup(COL[direction, stat], raw)
    return out


def _link_text(gen: int | None, width: int | None) -> str:
    return f"Gen{gen or '?'} x{width or '?'}"


def _share(value: float | None, capacity: float | None) -> float | None:
    return None if value is None or not capacity else value / capacity


def _downsample(points: list[tuple[float, float]], n: int = SERIES_POINTS) -> list[tuple[float, float]]:
    """At most ``n`` points: means of consecutive runs (the plot's resolution, not the review's)."""
    if len(points) <= n:
        return points
    size = math.ceil(len(points) / n)
    return [(points[i][0], sum(v for _, v in points[i:i + size]) / len(points[i:i + size])) for i in range(0, len(points), size)]


def _series(cols: dict[str, Any], direction: str) -> list[tuple[float, float]]:
    """p95 per minute of one direction as ``(epoch seconds, bytes/s)``, for the plots."""
    col = COL[direction, "p95"]
    return _downsample([(t / 1000.0, decode_rollup(col, v)) for t, v in zip(cols.get("ts", ()), cols.get(col, ())) if v is not None])


def review_host(
    store: Store,
    hostname: str,
    *,
    window_seconds: float,
    add_cards: int = 2,
    saturation_ratio: float = 0.8,
    series: bool = False,
) -> dict[str, Any]:
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
        ``{"host", "window", "minutes", "gpus": [...], "shared": [...], "saturated": [port, ...],
        "note"}`` (keys in docs/capacity.md); values in base units, ``None`` where unknown.

    Raises:
        StoreUnavailableError: the store cannot be read.
    """
    out: dict[str, Any] = {"host": hostname, "window": None, "minutes": 0, "gpus": [], "shared": [], "saturated": [], "note": None}
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
    for g in gpus:
        ident = g.identity
        c = cols[g.id]
        gens = [v for v in c.get(_LINK[0], ()) if v is not None]
        widths = [v for v in c.get(_LINK[1], ()) if v is not None]
        neg_gen, neg_width = (max(gens) if gens else None), (max(widths) if widths else None)
        cap_max = link_capacity_bytes_per_second(ident.pcie_link_gen_max, ident.pcie_link_width_max)
        cap_neg = link_capacity_bytes_per_second(neg_gen, neg_width)
        entry: dict[str, Any] = {
            "index": ident.index, "uuid": ident.uuid, "name": ident.name, "pci_bus_id": ident.pci_bus_id,
            "minutes": len(c["ts"]),
            "link_max": {"generation": ident.pcie_link_gen_max, "width": ident.pcie_link_width_max, "capacity_bytes_per_second": cap_max},
            "link_negotiated": {"generation": neg_gen, "width": neg_width, "capacity_bytes_per_second": cap_neg},
            "gpu_max_generation": ident.pcie_link_gen_gpu_max,
            "link_state": _link_state(ident, neg_gen, neg_width),
        }
        for d in DIRECTIONS:
            stats = _window_stats(c, d)
            entry[d] = {**{f"{s}_bytes_per_second": v for s, v in stats.items()},
                        "p95_share_of_max_link": _share(stats["p95"], cap_max),
                        "p95_share_of_negotiated_link": _share(stats["p95"], cap_neg),
                        "max_share_of_max_link": _share(stats["max"], cap_max)}
        if series:
            entry["series"] = {d: _series(c, d) for d in DIRECTIONS}
        out["gpus"].append(entry)
        by_uuid[ident.uuid] = g

    topology = store.topology(hostname)
    summed: dict[frozenset[int], dict[str, Any]] = {}  # a switch's uplink and its root port share their cards
    for bdf, uuids in sorted(topology.shared().items()):
        hop = topology.hop(bdf)
        if hop is None or hop.kind == "host_bridge":
            continue  # the root complex has no link of its own in sysfs: nothing to divide by
        members = [by_uuid[u] for u in uuids if u in by_uuid]
        key = frozenset(g.id for g in members)
        if key not in summed:
            summed[key] = _sum_minutes([cols[g.id] for g in members])
        entry = _shared(hop, members, summed[key], add_cards=add_cards, saturation_ratio=saturation_ratio, series=series)
        out["shared"].append(entry)
        if entry["saturated"]:
            out["saturated"].append(bdf)
    if not topology.hops:
        out["note"] = "no PCIe topology stored for this host (the agent reads it from sysfs at start): shared links unknown"
    return out


def _sum_minutes(cards: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per minute, each PCIe statistic summed over the cards (a card without a row that minute, or
    with NULL, adds nothing; a minute where every value is NULL stays NULL). The cards' minutes
    are nearly always the same (one rollup job, one tick clock): then the columns add up
    element-wise; otherwise by minute."""
    cards = [c for c in cards if c["ts"]]
    if not cards:
        return {}
    names = tuple(COL.values())
    if all(c["ts"] == cards[0]["ts"] for c in cards):
        out: dict[str, Any] = {"ts": cards[0]["ts"]}
        for n in names:
            columns = [c[n] for c in cards]
            if not any(None in col for col in columns):  # the common case, summed in C
                out[n] = list(map(sum, zip(*columns)))
            else:
                out[n] = [None if all(v is None for v in vs) else sum(v for v in vs if v is not None) for vs in zip(*columns)]
        return out
    acc: dict[int, dict[str, Any]] = {}
    for c in cards:
        for i, t in enumerate(c["ts"]):
            row = acc.setdefault(t, dict.fromkeys(names))
            for n in names:
                v = c[n][i]
                if v is not None:
                    row[n] = v if row[n] is None else row[n] + v
    minutes = sorted(acc)
    return {"ts": minutes, **{n: [acc[t][n] for t in minutes] for n in names}}


def _link_state(ident: Any, gen: int | None, width: int | None) -> dict[str, Any]:
    """The negotiated link against the max: ``at max``, ``below max`` (down-trained under load:
    a riser, a dirty contact, a BIOS setting) or unknown; and whether the slot holds the card back."""
    max_gen, max_width = ident.pcie_link_gen_max, ident.pcie_link_width_max
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


def _shared(hop: Any, members: Sequence[Any], sums: dict[str, Any], *, add_cards: int, saturation_ratio: float,
            series: bool) -> dict[str, Any]:
    """One shared switch or root port: its cards' per-minute summed load against its link."""
    cap = link_capacity_bytes_per_second(hop.link_gen_max, hop.link_width_max)
    n = len(members)
    entry: dict[str, Any] = {
        "port": hop.bdf, "kind": hop.kind,
        "link_max": {"generation": hop.link_gen_max, "width": hop.link_width_max, "capacity_bytes_per_second": cap},
        "link_current": {"generation": hop.link_gen_current, "width": hop.link_width_current},
        "gpus": sorted(g.identity.index for g in members), "cards": n,
    }
    worst_share, worst_card = None, None
    for d in DIRECTIONS:
        stats = _window_stats(sums, d)
        p95 = stats["p95"]
        per_card = None if p95 is None or not n else p95 / n
        entry[d] = {**{f"{s}_bytes_per_second": v for s, v in stats.items()},
                    "p95_share": _share(p95, cap), "per_card_p95_bytes_per_second": per_card}
        share = _share(p95, cap)
        if share is not None and (worst_share is None or share > worst_share):
            worst_share, worst_card = share, per_card
    entry["p95_share"] = worst_share
    entry["saturated"] = worst_share is not None and worst_share >= saturation_ratio
    entry["saturation_ratio"] = saturation_ratio
    entry["projections"] = [
        {"add": k, "p95_share": None if worst_share is None or not n else worst_share * (n + k) / n}
        for k in range(1, add_cards + 1)
    ]
    if worst_card is None or cap is None:
        entry["headroom_cards"] = None
    elif worst_card <= 0:
        entry["headroom_cards"] = None  # the cards carry nothing: the load gives no bound
    else:
        entry["headroom_cards"] = max(0, math.floor(saturation_ratio * cap / worst_card + 1e-9) - n)
    if series:
        entry["series"] = {d: _series(sums, d) for d in DIRECTIONS}
    return entry


def review(
    store: Store,
    hosts: Sequence[str] | None = None,
    *,
    window_seconds: float = 7 * 86400.0,
    add_cards: int = 2,
    saturation_ratio: float = 0.8,
    series: bool = False,
    progress: Any = None,
) -> dict[str, Any]:
    """The capacity review of several hosts (every host in the store when ``hosts`` is empty).

    Args:
        progress: called with each host name after its review (a progress bar).

    Returns:
        ``{"window_seconds", "add_cards", "saturation_ratio", "hosts": [review_host, ...],
        "unknown_hosts": [...]}``.
    """
    known = store.hostnames()
    wanted = list(hosts) if hosts else known
    out: dict[str, Any] = {"window_seconds": window_seconds, "add_cards": add_cards, "saturation_ratio": saturation_ratio,
                           "hosts": [], "unknown_hosts": [h for h in wanted if h not in known]}

    def one(h: str) -> dict[str, Any]:
        result = review_host(store, h, window_seconds=window_seconds, add_cards=add_cards, saturation_ratio=saturation_ratio, series=series)
        if progress is not None:
            progress(h)
        return result

    # one host after the other: reviewing hosts on two threads was slower on 2 cores (4.7–4.9 s
    # against 3.6 s for 16 hosts, docs/benchmarks.md): the GIL-bound arithmetic dominates
    out["hosts"] = [one(h) for h in wanted if h in known]
    return out
