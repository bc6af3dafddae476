"""The on-call report on a terminal (rich): verdict and top reasons first, then the findings, the
GPUs, health, vLLM servers, processes, trends as sparklines, XIDs and freshness.

Rendering only: the report is data (``vgpumon.diagnose``), the same that ``--json`` prints and the
agent's API serves; "N/A (reason)" lives here only. Every value is printed by its catalogue
entry's display (``vgpumon.catalogue.fmt``), so a field's unit and format are decided in one
place.

The verdict is printed without wrapping, on one line, so that the first line of the output
answers the question even in a narrow pager or a monitoring plugin's output field; every other
line wraps at word boundaries within the console's width (``console``), never mid-word.
"""

from __future__ import annotations

import io
import os
from typing import IO, Any, Iterable, Sequence, cast

from rich import box
from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from vgpumon import catalogue
from vgpumon.base.figures import print_figures
from vgpumon.base.fmt import duration, keep_units, printable, unjoin_units
from vgpumon.diagnose.render_signals import signals_line, slo_line
from vgpumon.diagnose.schema import Earlier, Finding, GpuBlock, Report, VllmServer

SPARKS = "▁▂▃▄▅▆▇█"
STYLE = {"critical": "bold red", "warning": "yellow", "unknown": "magenta", "ok": "green", "info": "dim"}
HEALTH_STYLE = {"FAIL": "bold red", "WARN": "yellow", "PASS": "green", "UNKNOWN": "magenta", "N/A": "dim"}
#: Width used when the output is not a terminal (a file, a pipe, a monitoring plugin): wide
#: enough for the GPU table.
PIPE_WIDTH = 200


def sparkline(values: Sequence[float | None], top: float | None = None) -> str:
    """One character per value, ``▁``…``█`` from 0 to ``top`` (default: the largest value); a
    space for ``None``. Zero and ``None`` differ: zero is ``▁``."""
    known = [v for v in values if v is not None]
    hi = top if top else (max(known) if known else 0.0)
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        elif hi <= 0:
            out.append(SPARKS[0])
        else:
            out.append(SPARKS[min(len(SPARKS) - 1, max(0, int(v / hi * (len(SPARKS) - 1) + 0.5)))])
    return "".join(out)


class _ReportConsole(Console):
    """A console whose reader may stop reading (``| head -1`` in a monitoring check): the rest of
    the output is dropped and the command goes on to its own exit code. rich's default exits 1,
    which is WARNING in vgpumon's exit-code table.

    It wraps a figure and its unit as one word: every text it renders has their space joined
    (``vgpumon.base.fmt.keep_units``) and gets it back as it is written, so "63.0 GB/s" or
    "(read 5 s ago)" never end a line between the number and the unit."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return _joined(super().render_str(text, **kwargs))

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        return super().render(_joined(renderable) if isinstance(renderable, Text) else renderable, options)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:  # rich's one place where segments become text
        return unjoin_units(super()._render_buffer(buffer))

    def on_broken_pipe(self) -> None:
        self.quiet = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.file.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass


def _joined(text: Text) -> Text:
    """``text`` with its figures' units joined; the same object when it holds none."""
    plain = keep_units(text.plain)
    if plain == text.plain:
        return text
    out = text.copy()
    out.plain = plain  # as long as before: every span keeps its offsets
    return out


def pipe_width() -> int:
    """Columns of output that is not a terminal: ``$COLUMNS`` when it is exported (``COLUMNS=80
    vgpumon … | less``: the reader's terminal), else ``PIPE_WIDTH``."""
    given = os.environ.get("COLUMNS", "").strip()
    return int(given) if given.isdigit() and 20 <= int(given) <= 1000 else PIPE_WIDTH


def console(file: IO[str] | None = None, *, width: int | None = None, color: bool | None = None) -> Console:
    """A rich console for reports. ``color`` ``None``: colour and width of a terminal when the
    output is one; otherwise (a file, a pipe, a monitoring plugin) no colour and ``pipe_width()``
    columns. Text wraps at word boundaries within the width. ``NO_COLOR`` is honoured by rich."""
    probe = Console(file=file)
    terminal = probe.is_terminal if color is None else color
    if width is None and not probe.is_terminal:
        width = pipe_width()
    return _ReportConsole(file=file, width=width, force_terminal=terminal, no_color=not terminal, highlight=False)


def _show(table: str | None, name: str, value: float | None, reason: str | None = None) -> str:
    return catalogue.fmt((table, name), value, reason)


def _g(name: str, value: float | None, reason: str | None = None) -> str:
    return _show("gpu_samples", name, value, reason)


def _pair(name: str, mean: float | None, top: float | None, reason: str | None) -> str:
    """``mean / max`` of a field, or one ``N/A (reason)`` when neither is known."""
    if mean is None and top is None:
        return _g(name, None, reason)
    return f"{_g(name, mean, reason)} / {_g(name, top, reason)}"


def _rate(name: str, value: float | None, share: float | None, reason: str | None) -> str:
    """A PCIe rate with its share of the max link, or ``N/A (reason)``."""
    if value is None:
        return _g(name, None, reason)
    return f"{_g(name, value)} ({_g('sm_active_ratio', share, 'link unknown')})"


def _age(seconds: float | None) -> str:
    return "N/A" if seconds is None else f"{duration(seconds)} ago"


def _clock(iso: str | None) -> str:
    return "?" if not iso else iso[11:19]


def _gpu_name(f: Finding) -> str:
    gpu = f.get("gpu")
    if gpu is not None:
        return f"GPU {gpu['index']}"
    subject = f.get("subject") or {}
    return next((f"{k} {v}" for k, v in subject.items() if k in ("server", "port", "source")), "host")


def _hang(out: Console, lead: str | Text, body: str | Text, style: str = "") -> None:
    """``lead`` then ``body``, ``body`` wrapped at word boundaries with its continuation lines
    under its own start (a hanging indent), so a wrapped line never reads as a new entry."""
    grid = Table.grid()
    grid.add_column(no_wrap=True)
    grid.add_column()
    grid.add_row(lead if isinstance(lead, Text) else Text(lead, style=style), body if isinstance(body, Text) else Text(body, style=style))
    out.print(grid)


def render_diagnose(report: Report, *, width: int | None = None, color: bool = False) -> str:
    """The report as text (``color``: with ANSI styles, as on a terminal)."""
    buf = io.StringIO()
    print_diagnose(report, console(buf, width=width or PIPE_WIDTH, color=color))
    return buf.getvalue()


def print_diagnose(report: Report, out: Console) -> None:
    """Print the report on ``out``, in the order of docs/diagnose.md (outside text made printable)."""
    report = cast(Report, printable(report))
    _verdict(report, out)
    if not report.get("window"):
        return
    _findings(report, out)
    _gpus(report, out)
    _health(report, out)
    _servers(report, out)
    _processes(report, out)
    _trends(report, out)
    _xids(report, out)
    _paths(report, out)
    _history(report, out)
    _freshness(report, out)
    _unknown_rules(report, out)


def one_line(report: Report) -> str:
    """The verdict and its first reason on one line (an unreachable host, a report with no data)."""
    v = report["verdict"]
    reason = v["reasons"][0]["headline"] if v["reasons"] else ""
    return f"{report['status'].upper()} {report['host']}" + (f": {reason}" if reason else "")


# -- sections -----------------------------------------------------------------------------------


def _verdict(report: Report, out: Console) -> None:
    v = report["verdict"]
    status = report["status"]
    if not report.get("window"):
        out.print(Text(one_line(report), style=STYLE[status]), soft_wrap=True)
        return
    counts = ", ".join(f"{n} {s}" for s in ("critical", "warning", "unknown") if (n := v["counts"].get(s)))
    fresh = report.get("freshness")
    age = fresh.get("age_seconds") if fresh else None
    head = Text(f"{status.upper()} ", style=STYLE[status])
    head.append(f"{report['host']}", style="bold")
    earlier = _earlier(v.get("earlier") or [])
    said = counts or ("nothing firing now" if earlier else "nothing to act on")
    head.append(f" — {said}{'; ' + earlier if earlier else ''}; data as of {_clock(fresh.get('newest_sample') if fresh else None)} UTC, {_age(age)}")
    if fresh and fresh.get("stale"):
        head.append(" (STALE: findings are the last known)", style="magenta")
    source = report.get("source")
    if source:
        head.append(f"; from {source['kind']} {source['where']}", style="dim")
    ev = report.get("evaluation")
    if ev and ev["by"] == "diagnose":
        head.append(f"; verdicts from {ev['note']}", style="yellow")
    out.print(head, soft_wrap=True)
    for f in v["reasons"]:
        lead = Text("  ")
        lead.append(f"{f['severity'].upper():<8} ", style=STYLE[f["severity"]])
        line = Text(f"{_gpu_name(f)}: ", style="bold")
        line.append(f["headline"])
        if f.get("next_step"):
            line.append(f" → {f['next_step']}", style="cyan")
        _hang(out, lead, line)  # wrapped at word boundaries; the first line alone is never wrapped


def _findings(report: Report, out: Console) -> None:
    findings = report["findings"]
    if not findings:
        return
    major = [f for f in findings if f["severity"] in ("critical", "warning", "unknown")]
    minor = [f for f in findings if f not in major]
    out.print()
    out.print(Text("Findings, most severe first", style="bold underline"))
    for f in major:
        head = Text(f"{f['severity'].upper():<8} ", style=STYLE[f["severity"]])
        head.append(_gpu_name(f), style="bold")
        if f.get("alert"):
            head.append(f" · {f['alert']}")
        if f.get("since"):
            head.append(f" · since {_clock(f['since'])} UTC" + ("" if f.get("since_exact") else " or earlier"))
        out.print(head)
        gpu = f.get("gpu")
        if gpu is not None:
            _hang(out, "  GPU       ", f"{gpu['index']}  {gpu['name'] or 'N/A'}  {gpu['uuid']}  serial {gpu['serial'] or 'N/A'}  bus {gpu['pci_bus_id'] or 'N/A'}")
        _hang(out, "  evidence  ", f["message"])
        xids = f.get("xids")
        if xids:
            table = Table("XID", "meaning", "NVIDIA", "action", "events (UTC)", box=None, padding=(0, 1), show_edge=False)
            for x in xids:
                table.add_row(str(x["code"]), x["meaning"], x["bucket"], x["action"], ", ".join(_clock(t) for t in x["times"]))
            out.print(table)
        elif f.get("meaning"):
            _hang(out, "  means     ", f["meaning"] or "")
        if f.get("next_step"):
            _hang(out, "  next      ", f["next_step"] or "", style="cyan")
        if f.get("runbook_url"):
            out.print(f"  runbook   {f['runbook_url']}", style="dim")
    if minor:
        lead = "and " if major else ""
        out.print(Text(f"{lead}{len(minor)} pending or informational:", style="dim"))
        for f in minor:
            _hang(out, "  ", f"{_gpu_name(f)}: {f['message']}", style="dim")


def _gpus(report: Report, out: Console) -> None:
    w = report["window"]
    assert w is not None  # print_diagnose prints the sections of a report with data only
    t = Table(title=f"GPUs, {duration(w['seconds'])} window to {_clock(w['end'])} UTC (mean / max)", title_justify="left",
              caption="SM act.: GPM SM activity, the SMs' work; util.: utilization.gpu, the time any kernel or copy ran "
              "(a host→device copy reads util 100 % with SM act. 0 %). PCIe: share of the max link.",
              caption_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
    # each column says which figure it holds: "(mean / max)" for the pairs, "max" where only
    # the highest reading is shown (memory, PCIe, temperature), as the title promises
    for name in ("GPU", "model", "SM act.", "util.", "memory used max / total", "PCIe TX max", "PCIe RX max", "max link",
                 "temp max", "power", "readable"):
        t.add_column(name, no_wrap=name in ("GPU", "temp max"))
    for g in report["gpus"]:
        u = g["unknown"]
        sm, ut, m, p = g["sm_active"], g["utilization"], g["memory"], g["pcie"]
        lm = p["link_max"]
        readable = g["readable"]
        t.add_row(
            str(g["index"]),
            g["name"] or "N/A",
            _pair("sm_active_ratio", sm["mean_ratio"], sm["max_ratio"], u.get("sm_active_ratio.mean")),
            _pair("utilization_gpu_ratio", ut["mean_ratio"], ut["max_ratio"], u.get("utilization_gpu_ratio.mean")),
            f"{_g('memory_used_bytes', m['used_max_bytes'], 'no sample')} / {_g('memory_total_bytes', m['total_bytes'])}",
            _rate("pcie_tx_bytes_per_second", p["tx"]["max_bytes_per_second"], p["tx"]["max_share_of_max_link"], u.get("pcie_tx_bytes_per_second.max")),
            _rate("pcie_rx_bytes_per_second", p["rx"]["max_bytes_per_second"], p["rx"]["max_share_of_max_link"], u.get("pcie_rx_bytes_per_second.max")),
            f"Gen{lm['generation'] or '?'} x{lm['width'] or '?'}",
            _g("temperature_celsius", g["temperature"]["max_celsius"], u.get("temperature_celsius.max")),
            _pair("power_watts", g["power"]["mean_watts"], g["power"]["max_watts"], u.get("power_watts.mean")),
            Text("yes", style="green") if readable["now"] else Text(f"NO: {readable['reason']}", style="bold red"),
        )
    _print_figures(t, out)


def _print_figures(t: Table, out: Console) -> None:
    """A table of figures after a blank line, as blocks of lines where it is wider than the
    console (``vgpumon.base.figures``)."""
    print_figures(t, out)


def _iso(ts: float | None) -> str | None:
    from vgpumon.base.fmt import iso

    return iso(ts)


def _health_note(g: GpuBlock, area: str) -> str:
    """The evidence beside an area's status: what an on-call engineer checks first."""
    u = g["unknown"]
    if area == "readable":
        r = g["readable"]
        return f"{g['up_samples']}/{g['samples']} ticks read" if r["now"] else f"{r['reason']}"
    if area == "memory":
        e, rr = g["ecc"], g["remapped_rows"]
        ecc = (f"ECC uncorr. {_g('ecc_uncorrected_volatile_total', e['uncorrected_volatile'], u.get('ecc.uncorrected_volatile'))} vol."
               f" / {_g('ecc_uncorrected_aggregate_total', e['uncorrected_aggregate'], 'n/a')} agg.")
        return ecc + (" · remap pending" if rr["pending"] else "") + (" · remap FAILED" if rr["failure"] else "")
    if area == "pcie":
        lc = g["pcie"]["link_current"]
        return f"now Gen{lc['generation'] or '?'} x{lc['width'] or '?'}"
    if area == "thermal":
        return f"max {_g('temperature_celsius', g['temperature']['max_celsius'], 'n/a')}"
    if area == "power":
        return f"max {_g('power_watts', g['power']['max_watts'], 'n/a')}"
    if area == "xid":
        codes = sorted(g.get("xid_counts", {}), key=int)
        return ("XID " + ", ".join(codes)) if codes else "no XID"
    return ""


def _health(report: Report, out: Console) -> None:
    gpus = report["gpus"]
    if not gpus:
        return
    areas = list(gpus[0]["health"])
    t = Table("GPU", *areas, title="Health (DCGM-style)", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
    for g in gpus:
        cells = []
        for a in areas:
            h = g["health"][a]
            cell = Text(h["status"], style=HEALTH_STYLE[h["status"]])
            # a GPU NVML cannot read: its areas' last readings are no evidence, the reason is
            lost = a != "readable" and not g["readable"]["now"] and h["status"] == "UNKNOWN"
            cell.append(f" ({h['reason']})" if lost else f" {_health_note(g, a)}", style="")
            cells.append(cell)
        t.add_row(str(g["index"]), *cells)
    _print_figures(t, out)


def _servers(report: Report, out: Console) -> None:
    out.print()
    if not report["vllm"]:
        out.print(Text("vLLM servers: none seen in the look-back", style="dim"))
        if note := report.get("stacks_note"):  # --stacks asked for: say why there are none
            out.print(Text(f"stacks: {note}", style="yellow"))
        return
    v = "vllm_samples"
    t = Table("server", "model", "state (since)", "prewarm (GPU activity)", "running / waiting", "KV usage", "KV fragmentation",
              "GPUs", "pid", title="vLLM servers", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
    for s in report["vllm"]:
        t.add_row(
            s["server"], s["model"] or "N/A",
            f"{s['state'] or 'N/A'} ({_clock(s['state_since'])})" + (f" — {s['reason']}" if s["state"] in ("dead", "hung", "failed_to_start", "telemetry_down") else ""),
            _prewarm(s),
            f"{_show(v, 'running', s['running'], 'n/a')} / {_show(v, 'waiting', s['waiting'], 'n/a')}",
            _show(v, "kv_cache_usage_ratio", s["kv_cache_usage_ratio"], "n/a"),
            _fragmentation(s),
            ", ".join(map(str, s["gpus"])) or "none seen", str(s["pid"] or "N/A"),
        )
    out.print(t)
    for s in report["vllm"]:
        for line in (_energy(s), slo_line(s), signals_line(s)):
            if line is not None:
                out.print(Text(line))
    if (host := _host_energy(report["vllm"])) is not None:
        out.print(Text(host))
    for s in report["vllm"]:
        for dump in s.get("stacks") or []:
            out.print(Text(f"py-spy dump of {s['server']} pid {dump['pid']} ({dump.get('role', 'server')}):", style="bold"))
            if error := dump.get("error"):
                out.print(Text(f"  {error}", style="yellow"))
            else:
                out.print(dump.get("text", "").rstrip(), markup=False, highlight=False)
        if server_note := s.get("stacks_note"):
            out.print(Text(f"stacks of {s['server']}: {server_note}", style="yellow"))
    if note := report.get("stacks_note"):
        out.print(Text(f"stacks: {note}", style="yellow"))


def _energy(s: VllmServer) -> str | None:
    """``<server>: energy per generated token 0.631 J`` (with its note), or ``None`` when the
    server has neither a figure nor a reason for none (no GPU, no energy read yet)."""
    joules, note = s.get("energy_per_token_joules"), s.get("energy_per_token_note")
    if joules is None and not note:
        return None
    figure = "N/A" if joules is None else f"{joules:.4g} J"
    return f"{s['server']}: energy per generated token {figure}" + (f" ({note})" if note else "")


def _host_energy(servers: list[VllmServer]) -> str | None:
    """The host's energy per generated token over its servers' newest intervals: all the energy
    charged to them (idle ones included) over all their tokens; ``None`` with fewer than two
    servers with energy (one server's line says it) or no token at all."""
    with_energy = [s for s in servers if s.get("energy_interval_joules") is not None]
    if len(with_energy) < 2:
        return None
    joules = sum(s.get("energy_interval_joules") or 0.0 for s in with_energy)
    tokens = sum((s.get("energy_interval_joules") or 0.0) / jpt for s in with_energy if (jpt := s.get("energy_per_token_joules")))
    figure = f"{joules / tokens:.4g} J" if tokens > 0 else "N/A (no tokens generated)"
    return f"host: energy per generated token {figure} over {len(with_energy)} servers' newest intervals"


def _prewarm(s: VllmServer) -> str:
    """Prewarm time and the GPU activity during it, or why it is not known."""
    if s["prewarm_seconds"] is None:
        return _show("vllm_instances", "prewarm_seconds", None, "start not watched")
    activity = s["prewarm_gpu_active_ratio"]
    return _show("vllm_instances", "prewarm_seconds", s["prewarm_seconds"]) + (
        "" if activity is None else f" (GPU {_show('vllm_instances', 'prewarm_gpu_active_ratio', activity)})")


def _fragmentation(s: VllmServer) -> str:
    """The newest KV fragmentation estimate and its 15-minute mean, or why there is none."""
    v = "vllm_samples"
    if s["kv_fragmentation_ratio"] is None and s["kv_fragmentation_mean_ratio"] is None:
        return _show(v, "kv_fragmentation_ratio", None, "nothing running" if s["running"] == 0 else "not reported")
    return (f"{_show(v, 'kv_fragmentation_ratio', s['kv_fragmentation_ratio'], 'n/a')}"
            f" (15 min mean {_show(v, 'kv_fragmentation_ratio', s['kv_fragmentation_mean_ratio'], 'n/a')})")


def _processes(report: Report, out: Console) -> None:
    procs = report["processes"]
    out.print()
    if not procs:
        out.print(Text("GPU processes: none recorded in the window (the host source samples them every few ticks)", style="dim"))
        return
    t = Table("GPU", "pid", "process", "owner", "container / pod", "GPU memory", title="Processes holding most GPU memory",
              title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
    for p in procs:
        container = p.get("container_id")
        where = p.get("pod") or (container[:12] if container else "not in a container")
        t.add_row(str(p["gpu"]), str(p["pid"]), p["name"] or "N/A (not resolved)", p["username"] or "N/A", where,
                  _show("gpu_process_samples", "used_gpu_memory_bytes", p["used_gpu_memory_bytes"], "withheld by the driver"))
    out.print(t)


def _trends(report: Report, out: Console) -> None:
    tr = report.get("trends")
    if not tr or not tr["gpus"]:
        return
    src = "raw samples" if tr["source"] == "raw" else "1-minute rollups"
    out.print()
    out.print(Text(f"Trends {_clock(tr['start'])} → {_clock(tr['end'])} UTC ({duration(tr['bucket_seconds'])} a character, from {src})",
                   style="bold underline"))
    for g in tr["gpus"]:
        mem = g["memory_used_bytes"]
        known = [v for v in mem if v is not None]
        slope = g["memory_slope_bytes_per_second"]
        slope_txt = "N/A" if slope is None else f"{slope * 3600 / 1e9:+.2f} GB/h"
        lo_hi = f"{_g('memory_used_bytes', min(known))} → max {_g('memory_used_bytes', max(known))}" if known else "no readings"
        out.print(f"GPU {g['index']:<3} memory    {sparkline(mem)}  {lo_hi}; slope {slope_txt}")
        cap = g["pcie_capacity_bytes_per_second"]
        both = [max(a or 0.0, b or 0.0) if a is not None or b is not None else None
                for a, b in zip(g["pcie_tx_p95_bytes_per_second"], g["pcie_rx_p95_bytes_per_second"])]
        peak = g["pcie_peak"]
        peak_txt = "no readings" if peak is None else (
            f"peak {peak['direction'].upper()} {_g('pcie_rx_bytes_per_second', peak['bytes_per_second'])}"
            f" ({_g('sm_active_ratio', peak['share_of_max_link'], 'n/a')} of the max link) at {_clock(peak['at'])}")
        out.print(f"        PCIe p95  {sparkline(both, cap)}  {peak_txt} (scale: the max link)")


def _xids(report: Report, out: Console) -> None:
    if not report.get("xids"):
        return
    t = Table("XID", "mnemonic", "meaning", "NVIDIA bucket", "what to do", "events (GPU @ UTC)",
              title="XIDs in the look-back (our table of NVIDIA's Xid catalog)", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
    for x in report["xids"]:
        t.add_row(str(x["code"]), x["mnemonic"] or "—", x["meaning"], x["bucket"], x["action"],
                  ", ".join(f"GPU {e['gpu']} @ {_clock(e['at'])}" for e in x["events"]))
    out.print()
    out.print(t)


def _paths(report: Report, out: Console) -> None:
    lines = []
    for g in report["gpus"]:
        path = g["pcie"].get("path") or []
        if len(path) <= 1:
            continue
        hops = []
        for hop in path[1:]:
            if hop["kind"] == "host_bridge":
                hops.append(f"host bridge {hop['bdf']}")
                continue
            lm = hop["link_max"]
            shared = f", shared with GPU {', '.join(map(str, hop['shared_with_gpus']))}" if hop["shared_with_gpus"] else ""
            hops.append(f"{hop['kind']} {hop['bdf']} Gen{lm['generation'] or '?'} x{lm['width'] or '?'}{shared}")
        lines.append(f"GPU {g['index']}: " + " → ".join(hops))
    if lines:
        out.print()
        out.print(Text("PCIe paths (vgpumon capacity reviews the shared links)", style="bold underline"))
        for line in lines:
            out.print(line)


def _earlier(episodes: list[Earlier]) -> str:
    """The headline's words for the episodes that fired in the window and are not open now:
    ``1 warning earlier in the window: GpuPcieSaturated GPU 0 17:12–17:14``."""
    if not episodes:
        return ""
    counts = ", ".join(f"{n} {s}" for s in ("critical", "warning", "info")
                       if (n := sum(1 for e in episodes if e["severity"] == s)))

    def one(e: Earlier) -> str:
        gpu = f" GPU {e['gpu']}" if e.get("gpu") is not None else ""
        if e["resolved_at"] is None:  # the agent stopped while it fired, or has not evaluated since
            return f"{e['name']}{gpu} from {_clock(_iso(e['fired_at']))}, open at the agent's last evaluation"
        return f"{e['name']}{gpu} {_clock(_iso(e['fired_at']))}–{_clock(_iso(e['resolved_at']))}"

    named = ", ".join(one(e) for e in episodes[:3])
    more = f" and {len(episodes) - 3} more" if len(episodes) > 3 else ""
    return f"{counts} earlier in the window: {named}{more}"


def _history(report: Report, out: Console) -> None:
    hist = report.get("alert_history") or []
    ev = report.get("evaluation")
    if ev and ev["by"] == "agent":
        out.print()
        last = ev["agent_last_evaluation"]
        out.print(Text(f"Alert lifecycle: {ev['note']}; {ev['alert_rows']} stored episodes"
                       + (f", newest evaluation {_clock(last)} UTC" if last else ""), style="dim"))
    if not hist:
        return
    out.print()
    out.print(Text("Alerts the agent raised in the look-back, not open now", style="bold underline"))
    for a in hist:
        gpu = f"GPU {a['gpu']}" if a.get("gpu") is not None else ", ".join(f"{k}={v}" for k, v in a["labels"].items() if k != "hostname")
        if a.get("open_at_last_evaluation"):
            ended = (f"still firing at the agent's last evaluation, {_clock(_iso(a.get('last_evaluated_at')))} UTC "
                     "(the agent stopped, or has not evaluated since)")
        else:
            ended = f"{_clock(_iso(a['resolved_at']))} UTC"
        out.print(f"  {a['severity'].upper():<8} {a['name']} {gpu}: {_clock(_iso(a['fired_at']))} → {ended} — {a['description']}")


def _freshness(report: Report, out: Console) -> None:
    fr = report.get("freshness")
    if not fr:
        return
    names = {"gpu_samples": "GPU samples (NVML)", "host_samples": "host samples", "vllm": "vLLM polls", "rollups": "1-minute rollups"}
    parts = []
    for key, item in fr["sources"].items():
        parts.append(f"{names[key]} {_clock(item['newest']) + ' UTC, ' + _age(item['age_seconds']) if item['newest'] else 'none'}")
    out.print()
    line = Text("Data freshness: ", style="bold")
    line.append("; ".join(parts))
    if fr.get("max_age_seconds") is not None:
        line.append(f"; --max-age {duration(fr['max_age_seconds'])}: {'STALE' if fr['stale'] else 'fresh'}",
                    style="magenta" if fr["stale"] else "")
    out.print(line)
    if store_note := report.get("store_note"):
        out.print(f"store {store_note}", style="dim")
    if source_note := report.get("source_note"):
        out.print(Text(source_note, style="yellow"))


def _unknown_rules(report: Report, out: Console) -> None:
    grouped: dict[tuple[str, str], list[str]] = {}
    for g in report["gpus"]:
        for rule, reason in g.get("rules_unknown", {}).items():
            grouped.setdefault((rule, reason), []).append(str(g["index"]))
    for u in report.get("rules_unknown", []):
        subject = ", ".join(f"{k}={v}" for k, v in u["labels"].items() if k != "hostname" and v)
        grouped.setdefault((u["rule"], u["reason"] or ""), []).append(subject or "host")
    if grouped:
        out.print()
        out.print(Text("Rules that could not judge (inputs absent or too short a history; never taken as healthy)", style="dim"))
        for (rule, reason), who in sorted(grouped.items()):
            where = f"GPU {', '.join(who)}" if all(w.isdigit() for w in who) else ", ".join(who)
            _hang(out, f"  {rule} ({where}): ", reason, style="dim")
    # rules that do not apply here (no GPM, no ECC on the board): no blind spot, said apart
    idle: dict[str, list[str]] = {}
    for g in report["gpus"]:
        for rule in g.get("rules_not_applicable", {}):
            idle.setdefault(rule, []).append(str(g["index"]))
    for u in report.get("rules_not_applicable", []):
        idle.setdefault(u["rule"], []).append(", ".join(f"{k}={v}" for k, v in u["labels"].items() if k != "hostname" and v) or "host")
    if idle:
        out.print(Text("Not applicable here: " + "; ".join(
            f"{rule} ({'GPU ' + ', '.join(who) if all(w.isdigit() for w in who) else ', '.join(who)})" for rule, who in sorted(idle.items())),
            style="dim"))
