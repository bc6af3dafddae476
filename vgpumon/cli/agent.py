"""``vgpumon agent`` (sample the GPUs into the store, or replay a capture) and ``vgpumon
record`` (write a capture)."""

from __future__ import annotations

import logging
import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from vgpumon import __version__
from vgpumon.base.errors import UsageError
from vgpumon.cli.options import DbOption, RawRetentionOption, RollupRetentionOption, _duration_param, _settings
from vgpumon.cli.outcomes import _echo_err

if TYPE_CHECKING:
    from vgpumon.agent import Agent, AgentStats

log = logging.getLogger("vgpumon")


class Pace(str, Enum):
    fast = "fast"
    recorded = "recorded"


class Clock(str, Enum):
    wall = "wall"
    capture = "capture"


async def _run_until_signal(agent: Agent) -> AgentStats:
    from vgpumon.agent.process import run_until_signal

    return await run_until_signal(agent)


def agent(
    ctx: typer.Context,
    db: DbOption = None,
    interval: Annotated[Optional[str], typer.Option(help="Time between ticks: 1s, 0.5 (default 1s; setting agent.interval).")] = None,
    duration: Annotated[
        Optional[str], typer.Option(callback=_duration_param, help="Stop after this long (90s, 15m, 2h); default: until SIGINT/SIGTERM.")
    ] = None,
    replay: Annotated[
        Optional[Path],
        typer.Option(help="Replay a capture made by `vgpumon record` instead of reading the GPUs (no GPU needed)."),
    ] = None,
    shift_to_now: Annotated[
        bool,
        typer.Option("--shift-to-now", help="Move a replay's times by whole minutes so that its last tick falls in the past minute: a capture of any age is stored, kept and judged as fresh data."),
    ] = False,
    pace: Annotated[Pace, typer.Option(help="Replay as fast as possible, or at the capture's recorded pace (its own spacing; --interval does not apply).")] = Pace.fast,
    replay_clock: Annotated[
        Optional[Clock],
        typer.Option(
            "--replay-clock",
            help="The clock a replay's rows are stamped with: wall (the first tick lands now; the default at --pace recorded, so a Prometheus beside it judges the same ages) or capture (the capture's own times, moved by --shift-to-now; the default and only choice at --pace fast). capture at --pace recorded replays an incident on its own times, with no Prometheus beside it.",
        ),
    ] = None,
    hostname: Annotated[
        Optional[str],
        typer.Option(help="Name this host is stored under, also for a replay (default: the system host name; VGPUMON_HOSTNAME, setting agent.hostname)."),
    ] = None,
    slow_every: Annotated[
        Optional[int], typer.Option(help="Read the slow set (ECC, remapped rows, ...) every N ticks (default: 10, or the capture's cadence); energy and the other minute-set calls on the first slow tick a minute after their last read.")
    ] = None,
    no_gpm: Annotated[bool, typer.Option("--no-gpm", help="Do not use GPM (forces the pre-Hopper path).")] = False,
    reprobe_every: Annotated[
        Optional[int], typer.Option(help="Ask again every N ticks the calls a GPU answered 'not supported' (default 600; setting agent.reprobe_every).")
    ] = None,
    call_deadline: Annotated[
        Optional[str],
        typer.Option(help="A GPU whose read takes longer is wedged: marked down and skipped until its call returns (default: half the interval; setting agent.call_deadline)."),
    ] = None,
    host_every: Annotated[
        Optional[int], typer.Option(help="Sample host CPU/memory and GPU processes' owners, RSS and CPU every N ticks (default 5).")
    ] = None,
    flush_interval: Annotated[
        Optional[str],
        typer.Option(help="Time between batched writes to the store (default 10s, 5s for a replay as fast as possible; "
                     "setting agent.flush_interval). Shorter loses less to a kill -9 and costs more CPU."),
    ] = None,
    vllm_url: Annotated[
        Optional[list[str]],
        typer.Option("--vllm-url", help="Also scrape this vLLM server (repeatable), e.g. one in a container (VGPUMON_VLLM_URLS, setting vllm.urls)."),
    ] = None,
    no_vllm: Annotated[bool, typer.Option("--no-vllm", help="Do not discover or scrape vLLM servers.")] = False,
    vllm_interval: Annotated[Optional[str], typer.Option(help="Time between vLLM scrapes (default 2s; setting vllm.interval).")] = None,
    spool: Annotated[
        Optional[Path],
        typer.Option(
            help="Directory where ticks wait while the store is unreachable; put it on another disk than a SQLite store "
            "(default: under the user's state directory; VGPUMON_SPOOL, setting agent.spool).",
            file_okay=False,
        ),
    ] = None,
    spool_max_mb: Annotated[
        Optional[int], typer.Option(help="Spool size above which its oldest ticks are folded into 1-minute rollups (default 1024).")
    ] = None,
    buffer_max_rows: Annotated[
        Optional[int],
        typer.Option(help="Rows held in memory when the spool cannot be written; above it the oldest are folded into 1-minute rollups (default 28800)."),
    ] = None,
    raw_retention: RawRetentionOption = None,
    rollup_retention: RollupRetentionOption = None,
    listen: Annotated[
        Optional[str],
        typer.Option(
            "--listen",
            help="Serve /metrics and /healthz (Prometheus) on host:port (IPv6 in brackets), :port for every interface, "
            "or off (default 127.0.0.1:19400; VGPUMON_LISTEN, setting exporter.listen).",
        ),
    ] = None,
    metrics_file: Annotated[
        Optional[Path],
        typer.Option("--metrics-file", help="Serve only the metric families this selection file lists (format: exporters/metrics.csv; setting exporter.metrics_file).", dir_okay=False),
    ] = None,
    sysfs: Annotated[
        Optional[Path],
        typer.Option("--sysfs", help="Read the PCIe topology above the GPUs from this sysfs tree (default /sys; a replay reads none unless given).", file_okay=False, exists=True),
    ] = None,
    kubelet_socket: Annotated[
        Optional[str],
        typer.Option(
            "--kubelet-socket",
            help="The kubelet's pod-resources socket, for pod/namespace/container labels (default /var/lib/kubelet/pod-resources/kubelet.sock; off to skip; a replay asks none unless given; setting exporter.kubelet_socket).",
        ),
    ] = None,
    otlp: Annotated[
        Optional[str],
        typer.Option(
            "--otlp",
            help="Also push the GPU fields over OTLP/HTTP to this OpenTelemetry collector, e.g. http://otel-collector:4318 "
            "(hw.gpu.* names; headers from OTEL_EXPORTER_OTLP_HEADERS; needs the otlp extra; VGPUMON_OTLP_URL, setting exporter.otlp_url).",
        ),
    ] = None,
    otlp_interval: Annotated[
        Optional[str],
        typer.Option("--otlp-interval", help="Time between OTLP pushes (default 15s; setting exporter.otlp_interval)."),
    ] = None,
    no_rules: Annotated[bool, typer.Option("--no-rules", help="Do not evaluate the rules (no alerts; setting rules.enabled).")] = False,
    alert_webhook: Annotated[
        Optional[list[str]],
        typer.Option("--alert-webhook", help="POST firing and resolved alerts as JSON to this URL (repeatable; VGPUMON_ALERT_WEBHOOKS, setting rules.webhooks)."),
    ] = None,
    alertmanager: Annotated[
        Optional[list[str]],
        typer.Option("--alertmanager", help="Send alerts to this Alertmanager (base URL; API v2; repeatable; VGPUMON_ALERTMANAGERS, setting rules.alertmanagers)."),
    ] = None,
) -> None:
    """Sample every NVIDIA GPU each interval and store one row per GPU per tick.

    Runs until SIGINT/SIGTERM or --duration; the tick in progress and every pending row are
    written before it exits (0). Without an NVIDIA driver, or with a store it cannot use, it
    exits 69 with one line naming the cause.

    Examples:\n
      vgpumon agent                # sample into the default SQLite store\n
      vgpumon agent --replay tests/data/h200-workload.jsonl.gz --db demo.db
    """
    if pace is Pace.recorded and replay is None:
        raise UsageError("--pace recorded paces a replay: give --replay CAPTURE (a live agent ticks every --interval)")
    if shift_to_now and replay is None:
        raise UsageError("--shift-to-now moves a replay in time: give --replay CAPTURE")
    if replay_clock is not None and replay is None:
        raise UsageError("--replay-clock stamps a replay: give --replay CAPTURE (a live agent reads the wall clock)")
    if replay_clock is Clock.wall and pace is not Pace.recorded:
        raise UsageError("--replay-clock wall needs --pace recorded: a replay as fast as possible runs ahead of the wall clock")
    settings = _settings(
        ctx,
        {
            ("store", "url"): ("--db", db),
            ("store", "raw_retention"): ("--raw-retention", raw_retention),
            ("store", "rollup_retention"): ("--rollup-retention", rollup_retention),
            ("agent", "interval"): ("--interval", interval),
            ("agent", "hostname"): ("--hostname", hostname),
            ("agent", "slow_every"): ("--slow-every", slow_every),
            ("agent", "host_every"): ("--host-every", host_every),
            ("agent", "flush_interval"): ("--flush-interval", flush_interval),
            ("agent", "reprobe_every"): ("--reprobe-every", reprobe_every),
            ("agent", "call_deadline"): ("--call-deadline", call_deadline),
            ("agent", "gpm"): ("--no-gpm", False if no_gpm else None),
            ("agent", "spool"): ("--spool", spool),
            ("agent", "spool_max_mb"): ("--spool-max-mb", spool_max_mb),
            ("agent", "buffer_max_rows"): ("--buffer-max-rows", buffer_max_rows),
            ("vllm", "urls"): ("--vllm-url", vllm_url or None),
            ("vllm", "enabled"): ("--no-vllm", False if no_vllm else None),
            ("vllm", "interval"): ("--vllm-interval", vllm_interval),
            ("exporter", "listen"): ("--listen", listen),
            ("exporter", "metrics_file"): ("--metrics-file", metrics_file),
            ("exporter", "kubelet_socket"): ("--kubelet-socket", kubelet_socket),
            ("exporter", "otlp_url"): ("--otlp", otlp),
            ("exporter", "otlp_interval"): ("--otlp-interval", otlp_interval),
            ("rules", "enabled"): ("--no-rules", False if no_rules else None),
            ("rules", "webhooks"): ("--alert-webhook", alert_webhook or None),
            ("rules", "alertmanagers"): ("--alertmanager", alertmanager or None),
        },
    )
    from vgpumon.agent import process as agent_main
    from vgpumon.base import signals

    shift_s = 0.0
    if shift_to_now and replay is not None:
        import time

        from vgpumon.sources.nvml.capture import capture_end

        # by whole minutes, so that the last tick lands in the minute just past and every tick
        # keeps its place within its minute: the 1-minute rollups then cut the data where they
        # cut the capture, whatever second of the minute the replay starts at (the demo's review
        # read the copy phase's minute on some runs and an idle one on others)
        shift_s = (time.time() - capture_end(replay)) // 60 * 60
    plan = agent_main.make_plan(
        settings, replay=None if replay is None else str(replay), recorded_pace=pace is Pace.recorded, shift_s=shift_s,
        capture_clock=replay_clock is Clock.capture,
        duration=duration, sysfs=None if sysfs is None else str(sysfs),  # type: ignore[arg-type]  # seconds
    )
    if signals.exec_allowed and agent_main.can_exec():
        # the CLI's libraries stay behind: the agent runs in a lean process (agent_main)
        try:
            agent_main.exec_agent(plan, sys.argv[1:])
        except OSError as exc:
            log.warning("could not start the agent's own process (%s); running it in this one", exc)
    code = agent_main.run(plan)
    if code:
        raise typer.Exit(code)


def record(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="Capture file to write (.jsonl, or .jsonl.gz to compress).", dir_okay=False)],
    duration: Annotated[str, typer.Option(callback=_duration_param, help="How long to record (60s, 5m).")] = "60s",
    interval: Annotated[Optional[str], typer.Option(help="Time between ticks (default 1s; setting agent.interval).")] = None,
    mask: Annotated[bool, typer.Option("--mask", help="Replace GPU UUIDs, serials and the host name with neutral values.")] = False,
    slow_every: Annotated[Optional[int], typer.Option(help="Read ECC counters and energy every N ticks (default 10).")] = None,
    no_gpm: Annotated[bool, typer.Option("--no-gpm", help="Do not use GPM (records the pre-Hopper path).")] = False,
) -> None:
    """Record every NVML answer the agent gets, per tick, to a capture file.

    `vgpumon agent --replay FILE` answers the same calls from it through the same collector code,
    keeping the capture's timestamps. Use --mask before sharing a capture. Ctrl-C stops it
    cleanly (0) with the ticks so far.
    """
    settings = _settings(
        ctx,
        {
            ("agent", "interval"): ("--interval", interval),
            ("agent", "slow_every"): ("--slow-every", slow_every),
            ("agent", "gpm"): ("--no-gpm", False if no_gpm else None),
        },
    )
    from vgpumon.agent import Agent
    from vgpumon.sources.nvml import NvmlSource
    from vgpumon.sources.nvml.backend import LiveBackend
    from vgpumon.sources.nvml.capture import RecordingBackend

    a = settings.agent
    slow = a.slow_every or 10
    probe = NvmlSource(LiveBackend())
    probe.start()  # no NVIDIA stack: exit 69 before a capture file is created
    probe.close()
    recorder = RecordingBackend(
        LiveBackend(),
        file,
        mask=mask,
        meta={"interval_s": a.interval, "slow_every": slow, "vgpumon": __version__},
    )
    source = NvmlSource(recorder, slow_every=slow, use_gpm=a.gpm)
    assert a.hostname is not None
    runner = Agent(source, None, hostname=a.hostname, interval=a.interval, duration=duration)  # type: ignore[arg-type]
    try:
        import asyncio

        stats = asyncio.run(_run_until_signal(runner))
    finally:
        recorder.close()
    _echo_err(f"vgpumon record: {recorder.ticks_written} ticks of {stats.gpus} GPU(s) written to {file}")
