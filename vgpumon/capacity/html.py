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
from vgpumon.capacity.schema import Point, Review, Series


class PlotlyMissingError(VgpumonError):
    """``--html`` without the ``html`` extra."""

    exit_code = ExitCode.UNAVAILABLE


def _times(points: list[Point]) -> list[str]:
    return [dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M") for t, _ in points]


def _directions(series: Series | None) -> list[tuple[str, list[Point]]]:
    """``tx`` and ``rx`` with their points (none for a review built without ``series``)."""
    return [("tx", series["tx"] if series else []), ("rx", series["rx"] if series else [])]


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
    for h in review["hosts"]:
        parts.append(f"<h2>{html.escape(h['host'])}</h2>")
        if h["window"] is None:
            parts.append(f"<p>{html.escape(h['note'] or '')}</p>")
            continue
        over_time = go.Figure()
        for p in h["shared"]:
            cap = p["link_max"]["capacity_bytes_per_second"]
            for d, pts in _directions(p.get("series")):
                over_time.add_trace(go.Scatter(x=_times(pts), y=[v / cap * 100 if cap else None for _, v in pts], mode="lines",
                                               name=f"{p['kind']} {p['port']} {d.upper()} (GPUs {', '.join(map(str, p['gpus']))})"))
        for g in h["gpus"]:
            cap = g["link_max"]["capacity_bytes_per_second"]
            for d, pts in _directions(g.get("series")):
                over_time.add_trace(go.Scatter(x=_times(pts), y=[v / cap * 100 if cap else None for _, v in pts], mode="lines",
                                               name=f"GPU {g['index']} {d.upper()}", visible="legendonly"))
        over_time.add_hline(y=review["saturation_ratio"] * 100, line_dash="dash", annotation_text="saturated")
        over_time.update_layout(title=f"{h['host']}: p95 per minute, % of each link's max capacity", yaxis_title="% of link",
                                height=420, margin={"t": 50, "b": 40})
        bars = go.Figure()
        names = [f"{p['kind']} {p['port']}" for p in h["shared"]] + [f"GPU {g['index']}" for g in h["gpus"]]
        now = [(p["p95_share"] or 0) * 100 for p in h["shared"]] + [
            max(g["tx"]["p95_share_of_max_link"] or 0, g["rx"]["p95_share_of_max_link"] or 0) * 100 for g in h["gpus"]]
        bars.add_trace(go.Bar(x=names, y=now, name="p95 now"))
        added = [((p["projections"][-1]["p95_share"] or 0) * 100 if p["projections"] else 0) for p in h["shared"]]
        bars.add_trace(go.Bar(x=names[: len(added)], y=added, name=f"p95 with {review['add_cards']} more cards"))
        bars.add_hline(y=review["saturation_ratio"] * 100, line_dash="dash", annotation_text="saturated")
        bars.update_layout(title=f"{h['host']}: headroom (p95 share of the max link)", yaxis_title="% of link", barmode="group",
                           height=380, margin={"t": 50, "b": 40})
        parts.append(over_time.to_html(full_html=False, include_plotlyjs=False))
        parts.append(bars.to_html(full_html=False, include_plotlyjs=False))
    page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>vgpumon capacity review</title>"
            f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>" + "".join(parts) + "</body></html>\n")
    path.write_text(page, encoding="utf-8")
    return path
