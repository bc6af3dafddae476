"""``vgpumon top``: a live view of every GPU and vLLM server of a host, refreshed each second from
the host's agent (``GET /api/v1/snapshot``: the agent's newest tick, from its memory).

The view asks the agent instead of NVML: the agent has read the GPUs already, so watching costs
one small HTTP request and a redraw a second, not a second NVML reader beside the agent, and it
shows what the agent stores and alerts on (SM activity from GPM, PCIe as a share of the link,
the vLLM servers' state). One frame fits 80 columns: each GPU is one row, each server one row.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from vgpumon.base.errors import ExitCode, NvmlUnavailableError, VgpumonError
from vgpumon.cli.options import _duration_param, _settings

Snapshot = dict[str, Any]
_GIB = 1 << 30


class AgentUnavailableError(VgpumonError):
    """``top --once`` and no agent answered with a tick."""

    exit_code = ExitCode.UNAVAILABLE


def top(
    ctx: typer.Context,
    host: Annotated[
        Optional[str],
        typer.Argument(help="HOST or HOST:PORT of the agent (port default 19400, setting diagnose.port); default: this host's agent, else NVML here.",
                       show_default=False),
    ] = None,
    interval: Annotated[str, typer.Option(callback=_duration_param, help="Time between refreshes: 1s, 0.5, 2s.")] = "1s",
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit (also when the output is not a terminal).")] = False,
    replay: Annotated[
        Optional[Path],
        typer.Option(help="Show a capture made by `vgpumon record`, a tick per refresh, as NVML would answer on its host (no agent, no GPU needed).", dir_okay=False),
    ] = None,
) -> None:
    """A live view of every GPU and vLLM server on a host, from its agent, refreshed each second.

    Per GPU: SM activity (GPM) beside utilization, memory used / total, PCIe TX/RX as a share of
    the link, power, temperature, throttle reasons and the process holding most memory; per vLLM
    server: state, running / waiting requests, KV-cache usage and prewarm time. q or Ctrl-C quits
    (exit 0). Needs a running agent (the API is open on loopback; VGPUMON_API_TOKEN off it).
    Without HOST and no agent answering on this host, it reads NVML itself (SM activity from the second refresh
    on: GPM measures between two reads; no vLLM servers). With --once, or piped, one frame;
    exit 69 when neither an agent nor NVML answers.

    Examples:
      vgpumon top
      vgpumon top gpu-host-17 --interval 2s
      vgpumon top --replay tests/data/h200-workload.jsonl.gz
    """
    settings = _settings(ctx)
    from vgpumon.diagnose.remote import parse_target

    name, port, _ = parse_target(host or "localhost", settings.diagnose.port)
    local = host is None  # "this host", not a named agent: NVML here can stand in for its agent
    token = settings.api.token.get_secret_value() if settings.api.token is not None else None
    where = f"[{name}]:{port}" if ":" in name else f"{name}:{port}"
    seconds = float(interval)  # the callback made it seconds

    def fetch() -> tuple[Snapshot | None, str | None]:
        return _fetch(name, port, token, timeout=min(5.0, max(1.0, seconds)), where=where)

    out = Console()
    if replay is not None:
        fetch = _nvml_fetcher(settings.agent.hostname or "localhost", replay=replay, note=f"replaying {replay}")
    single = once or not out.is_terminal
    if replay is None and local:
        snap, error = fetch()
        if snap is None and error is not None and "unreachable" in error:
            try:  # no agent here at start: read the GPUs ourselves
                fetch = _nvml_fetcher(settings.agent.hostname or name, note=f"read from NVML: no agent at {where}")
            except NvmlUnavailableError as exc:
                if single:
                    raise AgentUnavailableError(f"top: {error}; and {exc}") from None
                # live: nothing to read here either; keep asking for the agent (it may be starting)
    if single:
        snap, error = fetch()
        if snap is None:
            raise AgentUnavailableError(f"top: {error}")
        out.print(frame(snap, None, out.width))
        return
    _live(fetch, seconds, out)


def _nvml_fetcher(hostname: str, *, note: str, replay: Path | None = None) -> Callable[[], tuple[Snapshot | None, str | None]]:
    """Snapshots read from NVML by this process (or from a capture), in the API's form: the
    view without an agent. The source is started now (no NVIDIA stack: ``NvmlUnavailableError``)."""
    from vgpumon.exporter.api import plain
    from vgpumon.sources.nvml import NvmlSource
    from vgpumon.sources.nvml.backend import EndOfCapture
    from vgpumon.sources.nvml.capture import ReplayBackend

    source = NvmlSource(ReplayBackend(replay) if replay is not None else None)
    gpus = source.start()
    last: list[Snapshot] = []

    def fetch() -> tuple[Snapshot | None, str | None]:
        try:
            reading = source.sample()
        except EndOfCapture:
            return (last[0] if last else None), "the capture has ended"
        snap: Snapshot = {"hostname": hostname, "ts": reading.ts, "age_seconds": None, "fresh": True, "note": note,
                          "gpus": [{"identity": plain(g), "sample": plain(smp)} for g, smp in zip(source.gpus or gpus, reading.samples)],
                          "host": None, "vllm": None}
        last[:] = [snap]
        return snap, None

    return fetch


def _fetch(host: str, port: int, token: str | None, *, timeout: float, where: str) -> tuple[Snapshot | None, str | None]:
    """The agent's snapshot, or ``None`` and why there is none (one line)."""
    from vgpumon.diagnose.remote import AgentRefused, AgentUnreachable, fetch_json

    try:
        snap = fetch_json(host, port, "/api/v1/snapshot", token=token, timeout=timeout)
    except AgentUnreachable as exc:
        return None, f"the agent at {where} is unreachable ({exc}); is `vgpumon agent` running?"
    except AgentRefused as exc:
        if exc.status == 503:
            return None, f"the agent at {where} has taken no tick yet"
        return None, f"the agent at {where} refused: {exc}"
    if not isinstance(snap, dict) or not isinstance(snap.get("gpus"), list):
        return None, f"the answer of {where} is not a snapshot (is that port a vgpumon agent?)"
    return snap, None


@contextlib.contextmanager
def _keys() -> Iterator[Callable[[float], str]]:
    """A function that waits up to its timeout for a key and returns it ("" for none). The
    terminal is in cbreak mode meanwhile (keys come one at a time, Ctrl-C still interrupts)."""
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    if fd is None:
        def wait(timeout: float) -> str:
            time.sleep(max(0.0, timeout))  # no keyboard: the refresh's pace only
            return ""

        yield wait
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        def key(timeout: float) -> str:
            ready, _, _ = select.select([fd], [], [], max(0.0, timeout))
            return os.read(fd, 32).decode(errors="replace") if ready else ""

        yield key
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _live(fetch: Callable[[], tuple[Snapshot | None, str | None]], interval: float, out: Console) -> None:
    from rich.live import Live

    snap: Snapshot | None = None
    try:
        with Live(console=out, screen=True, auto_refresh=False, redirect_stdout=False, redirect_stderr=False) as live, _keys() as key:
            while True:
                started = time.monotonic()
                new, error = fetch()
                snap = new or snap  # a failed refresh keeps the last frame, with the error above it
                live.update(frame(snap, error, out.width) if snap else Text(error or ""), refresh=True)
                pressed = key(interval - (time.monotonic() - started))
                if "q" in pressed.lower():
                    return
    except KeyboardInterrupt:  # Ctrl-C: quitting, as q
        return


# -- one frame -----------------------------------------------------------------------------------


def _pct(value: object) -> str:
    return "–" if not isinstance(value, (int, float)) else f"{value * 100:.0f}%"


def _share(rate: object, cap: float | None) -> str:
    if not isinstance(rate, (int, float)) or not cap:
        return "–"
    return f"{rate / cap * 100:.0f}"


def _throttle(mask: object) -> str:
    """The clock event reasons that slow the GPU (idle is no slowdown), short."""
    from vgpumon import catalogue

    if not isinstance(mask, int):
        return "–"
    names = [n.strip() for n in catalogue.fmt(("gpu_samples", "clocks_event_reasons"), mask & ~1, None).split(",")]
    names = [n.replace("_slowdown", "").replace("hw_", "HW ").replace("sw_", "SW ").replace("_", " ") for n in names if n and n != "none"]
    return ", ".join(names) or "-"


def _top_process(sample: Snapshot, names: dict[str, str]) -> str:
    procs = [p for p in sample.get("processes") or [] if isinstance(p, list) and len(p) == 2]
    if not procs:
        return ""
    pid, used = max(procs, key=lambda p: p[1] if isinstance(p[1], (int, float)) else -1)
    mem = f" {used / _GIB:.1f}G" if isinstance(used, (int, float)) else ""
    return f"{pid} {names.get(str(pid), '')}".rstrip() + mem


def _gpus(snap: Snapshot) -> Table:
    from vgpumon.base.pcie import link_capacity_bytes_per_second

    t = Table(box=None, padding=(0, 1), pad_edge=False, header_style="bold reverse")
    for name, justify in (("GPU", "right"), ("SM", "right"), ("util", "right"), ("memory", "right"), ("TX/RX%", "right"),
                          ("W", "right"), ("°C", "right")):
        t.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    t.add_column("throttle", no_wrap=True, overflow="ellipsis", max_width=12)
    t.add_column("top process", no_wrap=True, overflow="ellipsis", ratio=1)
    host = snap.get("host") or {}
    names = {str(pid): str(info.get("name") or "") for pid, info in (host.get("processes") or {}).items() if isinstance(info, dict)}
    for g in snap["gpus"]:
        ident, s = g.get("identity") or {}, g.get("sample") or {}
        index = str(ident.get("index", "?"))
        if not s.get("up", True):
            reason = str((s.get("missing") or {}).get("*") or "not answering").split(";")[0].removeprefix("device down: ")
            t.add_row(index, *["–"] * 6, "", Text(f"DOWN: {reason}", style="bold red"))
            continue
        cap = link_capacity_bytes_per_second(ident.get("pcie_link_gen_max"), ident.get("pcie_link_width_max"))
        used, total = s.get("memory_used_bytes"), s.get("memory_total_bytes") or ident.get("memory_total_bytes")
        mem = f"{used / _GIB:.1f}/{total / _GIB:.0f}G" if isinstance(used, (int, float)) and isinstance(total, (int, float)) else "–"
        power, temp = s.get("power_watts"), s.get("temperature_celsius")
        throttle = _throttle(s.get("clocks_event_reasons"))
        t.add_row(index, _pct(s.get("sm_active_ratio")), _pct(s.get("utilization_gpu_ratio")), mem,
                  f"{_share(s.get('pcie_tx_bytes_per_second'), cap)}/{_share(s.get('pcie_rx_bytes_per_second'), cap)}",
                  f"{power:.0f}" if isinstance(power, (int, float)) else "–", f"{temp:.0f}" if isinstance(temp, (int, float)) else "–",
                  Text(throttle, style="yellow" if throttle not in ("-", "–") else ""), _top_process(s, names))
    return t


def _servers(snap: Snapshot) -> Table | None:
    servers = snap.get("vllm") or []
    if not servers:
        return None
    t = Table(box=None, padding=(0, 1), pad_edge=False, header_style="bold reverse")
    for name in ("vLLM server", "model", "state", "run/wait", "KV", "prewarm"):
        t.add_column(name, no_wrap=True, overflow="ellipsis", justify="right" if name in ("run/wait", "KV", "prewarm") else "left")
    bad = {"hung", "dead", "failed", "telemetry_down"}
    for v in servers:
        inst = v.get("instance") or {}
        where = f"{inst.get('host', '?')}:{inst.get('port', '?')}"
        models = ",".join(v.get("model_names") or []) or "?"
        state = str(v.get("state") or "?")
        run, wait = v.get("running"), v.get("waiting")
        rw = f"{run:.0f}/{wait:.0f}" if isinstance(run, (int, float)) and isinstance(wait, (int, float)) else "–"
        pre = v.get("prewarm_seconds")
        t.add_row(where, models, Text(state, style="bold red" if state in bad else ("green" if state in ("ready", "busy", "idle") else "yellow")),
                  rw, _pct(v.get("kv_cache_usage_ratio")), f"{pre:.0f}s" if isinstance(pre, (int, float)) else "–")
    return t


def frame(snap: Snapshot, error: str | None, width: int) -> RenderableType:
    """One screen of the view: the host line, the GPU rows, the vLLM rows, the key line."""
    from vgpumon.base.fmt import clock, duration

    age = snap.get("age_seconds")
    head = Text(f"{snap.get('hostname', '?')}", style="bold")
    head.append(f" — {len(snap['gpus'])} GPU{'' if len(snap['gpus']) == 1 else 's'}, tick {clock(snap.get('ts'))} UTC")
    if isinstance(age, (int, float)):
        head.append(f", {duration(age)} old", style="" if snap.get("fresh", True) else "bold magenta")
    if snap.get("note"):
        head.append(f" ({snap['note']})", style="dim")
    parts: list[RenderableType] = [head]
    if error:
        parts.append(Text(error, style="bold red"))
    parts.append(_gpus(snap))
    servers = _servers(snap)
    if servers is not None:
        parts.append(servers)
    elif snap.get("vllm") is not None:  # None: no agent, so nothing looked for them
        parts.append(Text("no vLLM server seen by the agent", style="dim"))
    parts.append(Text("SM: GPM SM activity; util: utilization.gpu; TX/RX: % of the max link. q quits", style="dim"))
    return Group(*parts)
