"""The capacity review as one self-contained HTML file for review documents: per host, the load
over time of each shared link and each card (p95 per minute, against the link's capacity) and the
headroom bars (p95 share now and with the added cards, the saturation line at 80 %).

Plots by plotly (the ``html`` extra: ``pip install 'vgpumon[html]'``), with plotly.js embedded so
that the file opens offline and stays readable in an archive.
"""

from __future__ import annotations

import datetime as dt
import html
from pathlib import Path

from vgpumon.base.errors import ExitCode, VgpumonError
from vgpumon.base.fmt import duration
from vgpumon.capacity.schema import HostReview, Point, Review, Series


class PlotlyMissingError(VgpumonError):
    """``--html`` without the ``html`` extra."""

    exit_code = ExitCode.UNAVAILABLE


def _times(points: list[Point]) -> list[str]:
    return [dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M") for t, _ in points]


def _directions(series: Series | None) -> list[tuple[str, list[Point]]]:
    """``tx`` and ``rx`` with their points (none for a review built without ``series``)."""
    return [("tx", series["tx"] if series else []), ("rx", series["rx"] if series else [])]


def _summary(h: HostReview) -> str:
    """The host's line of the terminal review: GPUs, window, rollup minutes, what is saturated."""
    w = h["window"]
    assert w is not None
    minutes = h["minutes"]
    text = (f"{len(h['gpus'])} GPU{'' if len(h['gpus']) == 1 else 's'}; {duration(w['seconds'])} to {w['end'][:16].replace('T', ' ')} UTC, "
            f"{minutes} minute{'' if minutes == 1 else 's'} of 1-minute rollups")
    return text + (f"; SATURATED: {', '.join(h['saturated'])}" if h["saturated"] else "")


def _notes(h: HostReview, review: Review) -> list[str]:
    """The notes the terminal review prints under its tables: why no shared link is shown, and
    what adding cards does to each shared link."""
    if not h["shared"]:
        return [h["note"] or "no shared switch or root port above these GPUs"]
    out = []
    for p in h["shared"]:
        for proj in p["projections"]:
            if proj["add"] == review["add_cards"] and proj["p95_share"] is not None:
                out.append(f"{p['kind']} {p['port']}: adding {proj['add']} card{'s' if proj['add'] > 1 else ''} with the current "
                           f"per-card load brings the shared link to {proj['p95_share'] * 100:.1f} % at p95"
                           + (f" (saturated from {p['saturation_ratio'] * 100:.1f} %; no headroom)" if p["headroom_cards"] == 0 else ""))
    return out


def write_html(review: Review, path: Path) -> Path:
    """Write the review's plots to ``path`` (needs the review built with ``series=True``).

    Raises:
        PlotlyMissingError: plotly is not installed (exit 69, one line saying which extra).
        OSError: the file cannot be written.
    """
    try:
        import plotly.graph_objects as go
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise PlotlyMissingError("--html needs plotly: pip install 'vgpumon[html]' (the terminal and --json reviews need nothing more)") from None
    parts = [f"<h1>PCIe capacity review</h1><p>window {review['window_seconds'] / 86400:g} days; projection adds "
             f"{review['add_cards']} cards; saturated from {review['saturation_ratio'] * 100:.0f} % of a link at p95.</p>"]
    sat = review["saturation_ratio"] * 100
    for h in review["hosts"]:
        parts.append(f"<h2>{html.escape(h['host'])}</h2>")
        if h["window"] is None:
            parts.append(f"<p>{html.escape(h['note'] or '')}</p>")
            continue
        parts.append(f"<p>{html.escape(_summary(h))}</p>")
        over_time, top = go.Figure(), sat
        stamps: list[float] = []
        # every trace visible: a plot whose traces wait for a click reads as empty
        for name, cap, series in [
            *((f"{p['kind']} {p['port']} (GPUs {', '.join(map(str, p['gpus']))})", p["link_max"]["capacity_bytes_per_second"], p.get("series"))
              for p in h["shared"]),
            *((f"GPU {g['index']}", g["link_max"]["capacity_bytes_per_second"], g.get("series")) for g in h["gpus"]),
        ]:
            for d, pts in _directions(series):
                ys = [v / cap * 100 if cap else None for _, v in pts]
                top = max([top, *(y for y in ys if y is not None)])
                stamps += [t for t, _ in pts]
                over_time.add_trace(go.Scatter(x=_times(pts), y=ys, mode="lines+markers" if len(pts) < 30 else "lines",
                                               name=f"{name} {d.upper()}"))
        over_time.add_hline(y=sat, line_dash="dash", line_color="#d62728", annotation_text=f"saturated ({sat:.0f} %)")
        # the axes on the data: its time span (not plotly's default year 2000) and 0 to above the highest point
        xaxis: dict[str, object] = {"title": "time (UTC)", "type": "date"}
        if stamps:  # a single minute gets a minute either side, not a millisecond
            lo, hi = min(stamps), max(stamps)
            xaxis["range"] = _times([(lo - 60, 0.0), (hi + 60, 0.0)] if lo == hi else [(lo, 0.0), (hi, 0.0)])
        over_time.update_layout(title=f"{h['host']}: p95 per minute, % of each link's max capacity", yaxis_title="% of link",
                                yaxis_range=[0, top * 1.1], xaxis=xaxis, height=420, margin={"t": 50, "b": 40})
        bars = go.Figure()
        names = [f"{p['kind']} {p['port']}" for p in h["shared"]] + [f"GPU {g['index']}" for g in h["gpus"]]
        now = [(p["p95_share"] or 0) * 100 for p in h["shared"]] + [
            max(g["tx"]["p95_share_of_max_link"] or 0, g["rx"]["p95_share_of_max_link"] or 0) * 100 for g in h["gpus"]]
        bars.add_trace(go.Bar(x=names, y=now, name="p95 now", text=[f"{v:.1f} %" for v in now], textposition="outside"))
        added = [((p["projections"][-1]["p95_share"] or 0) * 100 if p["projections"] else 0) for p in h["shared"]]
        if h["shared"]:  # a projection needs a shared link; without one the series would be empty
            bars.add_trace(go.Bar(x=names[: len(added)], y=added, name=f"p95 with {review['add_cards']} more cards",
                                  text=[f"{v:.1f} %" for v in added], textposition="outside"))
        bars.add_hline(y=sat, line_dash="dash", line_color="#d62728", annotation_text=f"saturated ({sat:.0f} %)")
        bars.update_layout(title=f"{h['host']}: headroom (p95 share of the max link)", yaxis_title="% of link", barmode="group",
                           yaxis_range=[0, max([sat, *now, *added]) * 1.15], showlegend=True, height=380, margin={"t": 50, "b": 40})
        parts.append(over_time.to_html(full_html=False, include_plotlyjs=False))
        parts.append(bars.to_html(full_html=False, include_plotlyjs=False))
        notes = _notes(h, review)
        if notes:
            parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>vgpumon capacity review</title>"
            f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>" + "".join(parts) + "</body></html>\n")
    path.write_text(page, encoding="utf-8")
    return path
