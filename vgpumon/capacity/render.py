"""The capacity review on a terminal (rich tables): per host, each GPU's PCIe load against its
links, then each shared switch or root port with its cards' combined load and the projection.
Values are printed by their catalogue entries (``vgpumon.catalogue.fmt``)."""

from __future__ import annotations

from typing import cast

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from vgpumon import catalogue
from vgpumon.base.figures import print_figures
from vgpumon.base.fmt import duration, printable
from vgpumon.capacity.schema import CardKvOffload, GpuCapacity, GpuDirection, HostReview, Link, Review


def _rate(value: float | None) -> str:
    return catalogue.fmt(("gpu_samples", "pcie_rx_bytes_per_second"), value, "n/a")


def _pct(value: float | None) -> str:
    return catalogue.fmt(("gpu_samples", "sm_active_ratio"), value, "n/a")


def _link(link: Link) -> str:
    return f"Gen{link['generation'] or '?'} x{link['width'] or '?'}"


def _quartet(d: GpuDirection) -> str:
    """p50 / p95 / p99 / max, the unit written once when all four share it."""
    parts = [_rate(v) for v in (d["p50_bytes_per_second"], d["p95_bytes_per_second"], d["p99_bytes_per_second"], d["max_bytes_per_second"])]
    units = {p.rsplit(" ", 1)[-1] for p in parts if " " in p and not p.startswith("N/A")}
    if len(units) == 1 and all(not p.startswith("N/A") for p in parts):
        unit = units.pop()
        return " / ".join(p.removesuffix(" " + unit) for p in parts) + " " + unit
    return " / ".join(parts)


def print_review(review: Review, out: Console) -> None:
    """Print the review on ``out`` (outside text made printable)."""
    review = cast(Review, printable(review))
    for h in review["hosts"]:
        _host(h, review, out)
    source = review.get("source")
    where = "Prometheus" if source is not None and source["kind"] == "prometheus" else "the store"
    for name in review["unknown_hosts"]:
        out.print(Text(f"{name}: not in {where}", style="magenta"))


def _host(h: HostReview, review: Review, out: Console) -> None:
    head = Text(f"{h['host']}", style="bold")
    w = h["window"]
    if w is None:
        head.append(f": {h['note']}", style="magenta")
        out.print(head)
        return
    head.append(f" — {len(h['gpus'])} GPU{'' if len(h['gpus']) == 1 else 's'}; {duration(w['seconds'])} to {w['end'][:16].replace('T', ' ')} UTC, "
                f"{h['minutes']} minute{'' if h['minutes'] == 1 else 's'} of 1-minute rollups")
    saturated = [*h["saturated"], *(f"GPU {i}" for i in h["saturated_gpus"])]
    if saturated:
        head.append(f"; SATURATED: {', '.join(saturated)}", style="bold red")
    if h["impossible"]:
        head.append(f"; IMPOSSIBLE (check topology and link speed): {', '.join(h['impossible'])}", style="bold magenta")
    out.print()
    out.print(head)
    t = Table("GPU", "max link (negotiated)", "TX p50 / p95 / p99 / max", "TX p95 of max", "RX p50 / p95 / p99 / max", "RX p95 of max",
              "link state", box=box.SIMPLE_HEAD, show_edge=False)
    for g in h["gpus"]:
        state = g["link_state"]
        st = Text(state["text"], style="yellow" if state["state"] == "below_max" else "")
        if state["slot"]:
            st.append(f"; {state['slot']}", style="yellow")
        t.add_row(str(g["index"]), f"{_link(g['link_max'])} ({_link(g['link_negotiated'])})", _quartet(g["tx"]),
                  _card_share(g, "tx"), _quartet(g["rx"]), _card_share(g, "rx"), st)
    print_figures(t, out, blank_line=False)  # whole figures at any width: blocks of lines where the table is too wide
    for g in h["gpus"]:
        if g["impossible"]:
            _note(out, f"  GPU {g['index']}: ", f"IMPOSSIBLE, {g['impossible']}", style="magenta")
    for g in h["gpus"]:
        if (kv := g.get("kv_offload")) is not None:
            out.print(Text(_kv_line(f"GPU {g['index']}", kv, "its")))
    if not h["shared"]:
        out.print(Text(h["note"] or "no shared switch or root port above these GPUs", style="dim"))
        return
    s = Table("shared port", "link", "cards (GPUs)", "TX p95 combined", "RX p95 combined", "p95 of link", "per card p95",
              f"+{review['add_cards']} cards at p95", "headroom", title="Shared switch and root ports (the cards behind each share its link)",
              title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
    for p in h["shared"]:
        style = "bold red" if p["saturated"] else "bold magenta" if p["impossible"] else ""
        per_card = max((p[d]["per_card_p95_bytes_per_second"] or 0.0) for d in ("tx", "rx"))
        last = p["projections"][-1]["p95_share"] if p["projections"] and not p["impossible"] else None  # no cards onto an impossible link
        head_room = "unknown" if p["impossible"] else "none" if p["headroom_cards"] == 0 else ("unbounded (no load)" if p["headroom_cards"] is None else f"{p['headroom_cards']} cards")
        s.add_row(f"{p['kind']} {p['port']}", _link(p["link_max"]), f"{p['cards']} ({', '.join(map(str, p['gpus']))})",
                  _rate(p["tx"]["p95_bytes_per_second"]), _rate(p["rx"]["p95_bytes_per_second"]),
                  Text(_pct(p["p95_share"]) + (" SATURATED" if p["saturated"] else " IMPOSSIBLE" if p["impossible"] else ""), style=style),
                  _rate(per_card),
                  _pct(last), Text(head_room, style=style))
    print_figures(s, out, blank_line=False)
    for p in h["shared"]:
        if p["impossible"]:
            _note(out, f"  {p['kind']} {p['port']}: ", f"IMPOSSIBLE, {p['impossible']}", style="magenta")
    for p in h["shared"]:
        if (kv := p.get("kv_offload")) is not None:
            out.print(Text(_kv_line(f"{p['kind']} {p['port']}", kv, "their")))
    for p in h["shared"]:
        for proj in p["projections"]:
            if proj["add"] == review["add_cards"] and proj["p95_share"] is not None and not p["impossible"]:
                _note(out, f"  {p['kind']} {p['port']}: ", f"adding {proj['add']} card{'s' if proj['add'] > 1 else ''} with the current "
                      f"per-card load brings the shared link to {_pct(proj['p95_share'])} at p95"
                      + (f" (saturated from {_pct(p['saturation_ratio'])}; no headroom)" if p["headroom_cards"] == 0 else ""))


def _note(out: Console, lead: str, body: str, *, style: str = "") -> None:
    """A note on a port, its text wrapped under its own start (a hanging indent), so that a
    wrapped line does not read as a note of its own."""
    grid = Table.grid()
    grid.add_column(no_wrap=True)
    grid.add_column()
    grid.add_row(Text(lead, style=style), Text(body, style=style))
    out.print(grid)


def _kv_line(where: str, kv: CardKvOffload, their: str) -> str:
    """``GPU 0: KV offload of vLLM 127.0.0.1:8000 moved 1.14 GB/s in (2.0 % of its RX traffic; 1.8 %
    of the max link) and 0.24 GB/s out (6.8 % of its TX traffic), mean over the window``."""

    def part(rate: float, *shares: tuple[float | None, str]) -> str:
        said = [f"{_pct(v)} of {what}" for v, what in shares if v is not None]
        return _rate(rate) + (f" ({'; '.join(said)})" if said else "")

    load = part(kv["load_bytes_per_second"], (kv["rx_share_of_traffic"], f"{their} RX traffic"), (kv["load_share_of_max_link"], "the max link"))
    store = part(kv["store_bytes_per_second"], (kv["tx_share_of_traffic"], f"{their} TX traffic"))
    split = f"; split evenly over the server's {kv['split']} GPUs" if kv["split"] > 1 else ""
    return f"  {where}: KV offload of vLLM {', '.join(kv['servers'])} moved {load} in and {store} out, mean over the window{split}"


def _card_share(g: GpuCapacity, d: str) -> Text:
    """A card's p95 share of its max link (``d``: tx or rx), marked SATURATED or IMPOSSIBLE on the
    direction that decides it."""
    share, other = (g["tx"], g["rx"]) if d == "tx" else (g["rx"], g["tx"])
    mine, theirs = share["p95_share_of_max_link"], other["p95_share_of_max_link"]
    text = _pct(mine)
    if mine is None or (theirs is not None and theirs > mine):
        return Text(text)
    if g["impossible"]:
        return Text(text + " IMPOSSIBLE", style="bold magenta")
    if g["saturated"]:
        return Text(text + " SATURATED", style="bold red")
    return Text(text)
