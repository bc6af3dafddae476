"""Command line: parses, loads the settings, calls a core function, maps outcomes to exit codes.

Exit codes (one table for every command, README and docs/cli.md): 0 OK, 1 WARNING, 2 CRITICAL,
3 UNKNOWN (``diagnose`` only), 64 usage error, 65 bad input file (capture, config file), 69 NVML
or the store unavailable, 70 internal error, 130 interrupted (Ctrl-C; the agent and ``record``
stop cleanly with 0 instead). Every failure is one line on stderr, secrets masked, never a
traceback (except 70, which logs one to report).

Settings-backed options (``--db``, ``--interval``, ``--window``, ...) default to ``None`` here:
``None`` means "not given", and the value comes from the environment, the config file or the
default (``vgpumon.config``), which also validates it and names the option in the error.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import threading
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Optional, TypeVar

import typer

from vgpumon import __version__
from vgpumon.base.errors import ExitCode, OutputError, StoreUnavailableError, UsageError, VgpumonError
from vgpumon.base.masking import mask_secrets

if TYPE_CHECKING:
    from vgpumon.config import Flags, Settings
    from vgpumon.store import Store

log = logging.getLogger("vgpumon")
T = TypeVar("T")

# typer ≥ 0.20 vendors click as ``typer._click``; older releases use click itself. Take the
# exception classes from typer's public BadParameter so that both work.
_USAGE_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
_CLICK_EXCEPTION = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


app = typer.Typer(
    name="vgpumon",
    help=(
        "GPU fleet telemetry and diagnostics for LLM inference hosts.\n\n"
        "Run `vgpumon agent` on each GPU host to sample NVML into a store; run "
        "`vgpumon diagnose <host>` to read what the store says about a host. Settings come from "
        "flags, VGPUMON_* variables and a TOML config file (`vgpumon config show`)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DbOption = Annotated[
    Optional[str],
    typer.Option(
        "--db",
        help="Store: sqlite:///path.db, a file path, or postgresql+psycopg://user@host/db "
        "(default: vgpumon.db under the user's data directory; VGPUMON_DB, setting store.url).",
        show_default=False,
    ),
]
RawRetentionOption = Annotated[
    Optional[str], typer.Option("--raw-retention", help="How long raw per-tick rows are kept (default 3d; setting store.raw_retention).")
]
RollupRetentionOption = Annotated[
    Optional[str], typer.Option("--rollup-retention", help="How long 1-minute rollups are kept (default 90d; setting store.rollup_retention).")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the outcome as JSON.")]


class LogLevel(str, Enum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


class Pace(str, Enum):
    fast = "fast"
    recorded = "recorded"


def _version(value: bool) -> None:
    if value:
        typer.echo(f"vgpumon {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    config: Annotated[
        Optional[Path],
        typer.Option("--config", help="TOML config file (default: $VGPUMON_CONFIG, else config.toml under the user's config directory).", show_default=False),
    ] = None,
    log_level: Annotated[Optional[LogLevel], typer.Option("--log-level", help="How much to log on stderr (default warning; VGPUMON_LOG_LEVEL).")] = None,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    ctx.obj = {"config": config, "log_level": log_level.value if log_level else None}


def _setup_logging(level: str) -> None:
    from vgpumon.agent.process import setup_logging

    setup_logging(level)


def _settings(ctx: typer.Context, flags: "Flags | None" = None) -> "Settings":
    """The effective settings of this invocation: the flags given over environment, config file
    and defaults (``vgpumon.config.load_settings``); also sets up logging."""
    from vgpumon.config import load_settings
    from vgpumon.rules import rule_names

    root = ctx.find_root().obj or {}
    given = dict(flags or {})
    given[("log_level",)] = ("--log-level", root.get("log_level"))
    settings = load_settings(root.get("config"), given, rule_names=rule_names)
    _setup_logging(settings.log_level)
    return settings


def _duration_param(value: Optional[str]) -> Optional[float]:
    """Click callback of the per-run duration options (``--duration``): parsed before the
    command runs, so a bad value is refused before anything is created."""
    from vgpumon.config import parse_duration

    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _store_kwargs(settings: "Settings", *, cap_s: float | None = None) -> dict[str, Any]:
    """``Store`` timeouts from the settings; ``cap_s`` bounds them (diagnose's deadline)."""
    st = settings.store

    def cap(v: float) -> float:
        return v if cap_s is None else min(v, cap_s)

    return {
        "busy_timeout_ms": int(cap(st.busy_timeout) * 1000),
        "connect_timeout_s": cap(st.connect_timeout),
        "statement_timeout_s": cap(st.statement_timeout),
    }


def _within(seconds: float, fn: Callable[[], T], what: str) -> T:
    """Run ``fn`` on a daemon thread and wait at most ``seconds`` for it: a database that
    accepts the connection and then never answers must not hold a command (or the monitoring
    that runs it) for the kernel's TCP timeout (130 s seen).

    Raises:
        StoreUnavailableError: ``fn`` did not finish in time (``what`` names the store).
        Exception: whatever ``fn`` raised.
    """
    from vgpumon.config import format_duration

    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
            box["error"] = exc

    worker = threading.Thread(target=run, name="vgpumon-bounded", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise StoreUnavailableError(f"store {what} did not answer within {format_duration(seconds)}")
    if "error" in box:
        raise box["error"]
    return box["value"]


async def _run_until_signal(agent: "object") -> "object":
    from vgpumon.agent.process import run_until_signal

    return await run_until_signal(agent)


@app.command()
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
    pace: Annotated[Pace, typer.Option(help="Replay as fast as possible, or at the capture's recorded pace (its own timestamps; --interval does not apply).")] = Pace.fast,
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
      vgpumon agent                                     # sample into the default SQLite store\n
      vgpumon agent --replay tests/data/h200-workload.jsonl.gz --db sqlite:///demo.db
    """
    if pace is Pace.recorded and replay is None:
        raise UsageError("--pace recorded paces a replay: give --replay CAPTURE (a live agent ticks every --interval)")
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
            ("rules", "enabled"): ("--no-rules", False if no_rules else None),
            ("rules", "webhooks"): ("--alert-webhook", alert_webhook or None),
            ("rules", "alertmanagers"): ("--alertmanager", alertmanager or None),
        },
    )
    from vgpumon.agent import process as agent_main
    from vgpumon.base import signals

    plan = agent_main.make_plan(
        settings, replay=None if replay is None else str(replay), recorded_pace=pace is Pace.recorded,
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


def _echo_err(line: str) -> None:
    typer.echo(mask_secrets(line), err=True)


db_app = typer.Typer(
    name="db",
    help="Operate the store: migrate its schema, apply retention, show what it holds.",
    no_args_is_help=True,
)
app.add_typer(db_app)

config_app = typer.Typer(name="config", help="Show the effective settings.", no_args_is_help=True)
app.add_typer(config_app)


def _open_for_db(settings: "Settings", *, create: bool = False, read_only: bool = False) -> "Store":
    from vgpumon.store import Store

    assert settings.store.url is not None
    return Store(settings.store.url, create=create, read_only=read_only, **_store_kwargs(settings))


@db_app.command("upgrade")
def db_upgrade(ctx: typer.Context, db: DbOption = None) -> None:
    """Bring the store's schema to this version's newest revision (the agent does it at start).

    Safe to run while agents write and from many hosts at once: one lock (an advisory lock on
    Postgres, a file lock on SQLite) serialises schema changes. A store migrated by a newer
    vgpumon is left alone (exit 69).
    """
    from vgpumon.store.migrate import upgrade

    settings = _settings(ctx, {("store", "url"): ("--db", db)})
    store = _open_for_db(settings, create=True)
    try:
        before, after = upgrade(store.engine)
    finally:
        store.close()
    typer.echo(f"store schema at {after}" + ("" if before == after else f" (was {before or 'empty'})"))


#: ``db prune`` asks for ``--yes`` below this retention: shorter windows delete nearly all rows.
PRUNE_CONFIRM_BELOW_S = 3600.0


@db_app.command("prune")
def db_prune(
    ctx: typer.Context,
    db: DbOption = None,
    raw_retention: RawRetentionOption = None,
    rollup_retention: RollupRetentionOption = None,
    yes: Annotated[bool, typer.Option("--yes", help="Confirm a retention under 1h (it deletes nearly everything).")] = False,
    as_json: JsonOption = False,
) -> None:
    """Roll raw rows up into 1-minute rows, then drop what is older than the retention windows.

    The agent does the same in small steps while it runs; this runs it to completion. Raw rows
    are never dropped before they are rolled up. A retention under 1h needs --yes.
    """
    from vgpumon.config import format_duration
    from vgpumon.store.retention import Retention

    settings = _settings(
        ctx,
        {
            ("store", "url"): ("--db", db),
            ("store", "raw_retention"): ("--raw-retention", raw_retention),
            ("store", "rollup_retention"): ("--rollup-retention", rollup_retention),
        },
    )
    st = settings.store
    for key in ("raw_retention", "rollup_retention"):
        value = getattr(st, key)
        if value < PRUNE_CONFIRM_BELOW_S and not yes:
            origin = settings.origins.get(f"store.{key}", key)
            raise UsageError(
                f"{origin} {format_duration(value)} is under 1h: db prune would delete nearly every "
                f"{'raw row' if key == 'raw_retention' else 'rollup'}; add --yes if that is what you want"
            )
    store = _open_for_db(settings)
    try:
        res = Retention(store, raw_retention_s=st.raw_retention, rollup_retention_s=st.rollup_retention).run()
    finally:
        store.close()
    out = {
        "minutes_rolled_up": res.minutes_rolled_up,
        "rows_deleted": res.rows_deleted,
        "partitions_dropped": res.partitions_dropped,
        "partitions_created": res.partitions_created,
    }
    if as_json:
        typer.echo(json.dumps(out, indent=2))
    else:
        typer.echo(
            f"rolled up {res.minutes_rolled_up} GPU-minute{'' if res.minutes_rolled_up == 1 else 's'}; "
            f"deleted {res.rows_deleted} row{'' if res.rows_deleted == 1 else 's'}; "
            f"dropped {len(res.partitions_dropped)} partition{'' if len(res.partitions_dropped) == 1 else 's'}"
        )


@db_app.command("stats")
def db_stats(ctx: typer.Context, db: DbOption = None, as_json: JsonOption = False) -> None:
    """Rows, bytes, oldest and newest sample of each time table, and the ticks whose full
    resolution was lost (kept only as 1-minute rollups). Reads only: never creates or changes a
    file (a SQLite store is opened read-only)."""
    from vgpumon.diagnose import _iso

    settings = _settings(ctx, {("store", "url"): ("--db", db)})
    store = _open_for_db(settings, read_only=True)
    try:
        tables = store.table_stats()
        note = store.access_note
    finally:
        store.close()
    if as_json:
        typer.echo(json.dumps({"tables": tables, "store_note": note}, indent=2))
        return
    typer.echo(f"{'table':<22} {'rows':>12} {'bytes':>14} {'oldest (UTC)':<26} {'newest (UTC)':<26}")
    for t in tables:
        size = "n/a" if t["bytes"] is None else f"{t['bytes']:,}"
        typer.echo(
            f"{t['table']:<22} {t['rows']:>12,} {size:>14} {_iso(t['oldest']) or '-':<26} {_iso(t['newest']) or '-':<26}"
        )
    folded = next(t for t in tables if t["table"] == "gpu_samples_1m")["folded_samples"]
    if folded:
        typer.echo(f"{folded} raw ticks were kept only as 1-minute rollups (the store was away and the spool full)")
    if note:
        typer.echo(f"store {note}")


dashboards_app = typer.Typer(
    name="dashboards",
    help="Grafana dashboards generated from the field catalogue (needs the dashboards extra).",
    no_args_is_help=True,
)
app.add_typer(dashboards_app)


@dashboards_app.command("build")
def dashboards_build(
    out: Annotated[Path, typer.Option(help="Directory to write the dashboards into.", file_okay=False)] = Path("dashboards"),
    check: Annotated[bool, typer.Option("--check", help="Write nothing; exit 1 when a file in --out differs from what would be written.")] = False,
) -> None:
    """Write the GPU fleet, GPU host detail, vLLM serving and PCIe capacity dashboards.

    Generated with grafana-foundation-sdk's Grafana 11.6 build; regenerating gives byte-identical
    files, so CI can check the committed ones with --check.
    """
    from vgpumon.dashboards import SdkMissingError, render, write

    try:
        if check:
            stale = [name for name, text in render().items() if not (out / name).is_file() or (out / name).read_text(encoding="utf-8") != text]
            for name in stale:
                typer.echo(f"{out / name} differs from the generated dashboard", err=True)
            raise typer.Exit(1 if stale else 0)
        for path in write(out):
            typer.echo(str(path))
    except SdkMissingError as exc:
        typer.echo(f"vgpumon: {exc}", err=True)
        raise typer.Exit(ExitCode.UNAVAILABLE) from None


rules_app = typer.Typer(
    name="rules",
    help="The rule catalogue: list it, generate its Prometheus twins and runbooks.",
    no_args_is_help=True,
)
app.add_typer(rules_app)


@rules_app.command("build")
def rules_build(
    out: Annotated[Path, typer.Option(help="Directory of the Prometheus rule files.", file_okay=False)] = Path("rules"),
    runbooks: Annotated[Path, typer.Option(help="Directory of the runbooks.", file_okay=False)] = Path("docs/runbooks"),
    check: Annotated[bool, typer.Option("--check", help="Write nothing; exit 1 when a file differs from what would be written.")] = False,
) -> None:
    """Generate rules/*.rules.yml (the Prometheus twins) and docs/runbooks/*.md from the rule
    catalogue, with the default thresholds. Run from the repository root; commit the result."""
    from vgpumon.rules import docs, prometheus

    wanted = {out / name: text for name, text in prometheus.render().items()}
    wanted |= {runbooks / name: text for name, text in docs.render().items()}
    stale = [p for p, text in wanted.items() if not p.exists() or p.read_text() != text]
    if check:
        for p in stale:
            typer.echo(f"out of date: {p}", err=True)
        raise typer.Exit(ExitCode.WARNING if stale else ExitCode.OK)
    for p in stale:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(wanted[p])
    typer.echo(f"{len(wanted)} files, {len(stale)} written")


@rules_app.command("list")
def rules_list(as_json: Annotated[bool, typer.Option("--json", help="Print the catalogue as JSON.")] = False) -> None:
    """Every rule: name, severity, subject, for, summary."""
    from vgpumon.rules.catalogue import RULES

    rows = [
        {"name": r.name, "severity": r.severity, "subject": r.subject, "for_seconds": r.for_seconds,
         "keep_firing_seconds": r.keep_firing_seconds, "summary": r.summary}
        for r in RULES
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        typer.echo(f"{r['name']:<28} {r['severity']:<9} {r['subject']:<12} {r['summary']}")


@app.command()
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
    _echo_err(f"vgpumon record: {recorder.ticks_written} ticks of {stats.gpus} GPU(s) written to {file}")  # type: ignore[attr-defined]


def _since_param(value: Optional[str]) -> Optional[str]:
    """Click callback of ``--since``: checked while parsing (64 on a bad value), passed on as
    typed (the agent parses it the same way)."""
    from vgpumon.diagnose import parse_since

    if value is not None:
        try:
            parse_since(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    return value


@app.command()
def diagnose(
    ctx: typer.Context,
    host: Annotated[
        str,
        typer.Argument(
            help="HOST or HOST:PORT: the host's agent is asked (port default 19400, setting diagnose.port); with --db, "
            "the host's name in that store. `localhost` means this machine.",
            show_default=False,
        ),
    ],
    db: DbOption = None,
    window: Annotated[
        Optional[str], typer.Option(help="Window ending at the host's newest stored sample: 15m, 1h, 900s (default 15m; setting diagnose.window).")
    ] = None,
    since: Annotated[
        Optional[str],
        typer.Option(
            callback=_since_param,
            help="Look back this far for XIDs, alerts that fired and resolved, and the trends: a duration before the newest "
            "sample (6h, 3d) or a time (2026-11-30T01:00Z). Default: the window.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON (the same content).")] = False,
    max_age: Annotated[
        Optional[str],
        typer.Option(
            help="Data older than this is stale (e.g. 2m): UNKNOWN (exit 3) unless a WARNING or CRITICAL is known, which "
            "stays, with the data's age. Use it from monitoring. Default: report on whatever is stored (setting diagnose.max_age)."
        ),
    ] = None,
    timeout: Annotated[
        Optional[str],
        typer.Option(help="UNKNOWN (exit 3) when the agent or the store has not answered within this long (default 10s; setting diagnose.timeout)."),
    ] = None,
    stacks: Annotated[
        bool,
        typer.Option("--stacks", help="Also show a py-spy dump of each vLLM server process (asks the agent; its config must allow it: setting api.stacks)."),
    ] = False,
) -> None:
    """The on-call report of one host: verdict and top reasons first, then the findings with
    what to do, GPUs, health, vLLM servers, processes, trends and data freshness.

    Without --db the host's agent is asked (HOST:PORT, its /api/v1/diagnose, token from
    VGPUMON_API_TOKEN or setting api.token); when it cannot be reached, the store (setting store.url)
    answers instead, with a note. With --db only that store is read, for a host whose agent is
    down. Exit status follows monitoring-plugin convention: 0 OK, 1 WARNING, 2 CRITICAL,
    3 UNKNOWN. Reads only: never creates or changes a file.

    Examples:\n
      vgpumon diagnose gpu-host-17\n
      vgpumon diagnose gpu-host-17 --db postgresql+psycopg://monitor@db/fleet --max-age 2m\n
      vgpumon diagnose localhost --since 6h --stacks
    """
    settings = _settings(
        ctx,
        {
            ("store", "url"): ("--db", db),
            ("diagnose", "window"): ("--window", window),
            ("diagnose", "max_age"): ("--max-age", max_age),
            ("diagnose", "timeout"): ("--timeout", timeout),
        },
    )
    from vgpumon.diagnose import exit_code
    from vgpumon.diagnose.render import console, print_diagnose

    name, port, _ = _target(host, settings.diagnose.port)
    rep = None if db is not None else _report_from_agent(settings, name, port, since, stacks)
    if rep is None or rep.get("source", {}).get("kind") == "unreachable":
        note = rep["source"]["note"] if rep is not None else None
        rep = _report_from_store(settings, name, since, note=note, quiet=note is not None)
        if stacks:
            rep["stacks_note"] = "--stacks needs the host's agent; this report came from the store"
    try:
        if as_json:
            typer.echo(json.dumps(rep, indent=2))
        else:
            print_diagnose(rep, console())
        sys.stdout.flush()
    except BrokenPipeError:  # `vgpumon diagnose … | head -1` from monitoring: the verdict still counts
        _silence_stdout()
    raise typer.Exit(exit_code(rep))


def _target(host: str, default_port: int) -> tuple[str, int, bool]:
    from vgpumon.diagnose.remote import parse_target

    return parse_target(host, default_port)


def _report_from_agent(settings: "Settings", host: str, port: int, since: Optional[str], stacks: bool) -> dict[str, Any]:
    """The agent's report, or a stand-in saying why there is none: ``source.kind`` is ``agent``,
    ``refused`` (it answered with an error: UNKNOWN, no fallback — the agent is up) or
    ``unreachable`` (the caller falls back to the store)."""
    from vgpumon.config import format_duration
    from vgpumon.diagnose import resolve_host, unknown_report
    from vgpumon.diagnose.remote import AgentRefused, AgentUnreachable, fetch_report

    d, a = settings.diagnose, settings.api
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        rep = fetch_report(
            host, port, token=a.token.get_secret_value() if a.token is not None else None, timeout=d.timeout,
            window=format_duration(d.window), since=since, max_age=format_duration(d.max_age) if d.max_age else None, stacks=stacks,
        )
    except AgentRefused as exc:
        # the agent's own word carries its status; what answered otherwise names it already
        status = "" if str(exc).startswith("HTTP ") or exc.status == 200 else f" (HTTP {exc.status})"
        rep = unknown_report(resolve_host(host, settings.agent.hostname), f"the agent at {where} refused: {exc}{status}")
        rep["source"] = {"kind": "refused", "where": where}
        return rep
    except AgentUnreachable as exc:
        return {"source": {"kind": "unreachable", "where": where, "note": f"agent at {where} unreachable ({exc})"}}
    rep["source"] = {"kind": "agent", "where": where}
    return rep


def _report_from_store(settings: "Settings", host: str, since: Optional[str], *, note: str | None, quiet: bool) -> dict[str, Any]:
    """The report read from the store (``--db``, or the fallback for an unreachable agent).

    ``note`` (why the agent did not answer) goes into the report; ``quiet``: a store that cannot
    answer either makes the report's one line say both, and nothing goes to stderr."""
    from vgpumon.config.thresholds import Thresholds
    from vgpumon.diagnose import build_report, parse_since, resolve_host, unknown_report
    from vgpumon.rules.catalogue import rule_names
    from vgpumon.store import Store
    from vgpumon.store.engine import describe_store, normalise_url

    d = settings.diagnose
    url = settings.store.url
    assert url is not None
    local = settings.agent.hostname
    thresholds = Thresholds.from_mapping(settings.rules.thresholds, rule_names)
    lookback, moment = parse_since(since) if since else (None, None)
    where = describe_store(normalise_url(url))

    def report() -> dict[str, Any]:
        store = Store(url, read_only=True, **_store_kwargs(settings, cap_s=d.timeout))
        try:
            rep = build_report(store, host, window_seconds=d.window, max_age_seconds=d.max_age, local_hostname=local,
                               thresholds=thresholds, since=moment, lookback_seconds=lookback)
            if store.access_note:
                rep["store_note"] = store.access_note
            return rep
        finally:
            store.close()

    try:
        rep = _within(d.timeout, report, where)
    except StoreUnavailableError as exc:
        message = mask_secrets(str(exc))
        if not quiet:
            _echo_err(f"vgpumon: {message}")
        rep = unknown_report(resolve_host(host, local), f"{note}; {message}" if note else message)
    else:
        if note is not None and not rep.get("window"):
            # neither the agent nor the store knows anything: one line says both
            rep = unknown_report(rep["host"], f"{note}; {rep['findings'][0]['message'] if rep['findings'] else 'no data in ' + where}")
    rep["source"] = {"kind": "store", "where": mask_secrets(where)}
    if note is not None and rep.get("window"):
        rep["source_note"] = f"{note}: reported from the store {mask_secrets(where)} instead"
    return rep


@app.command()
def capacity(
    ctx: typer.Context,
    hosts: Annotated[Optional[list[str]], typer.Argument(help="Hosts as stored (default: every host in the store).", show_default=False)] = None,
    db: DbOption = None,
    window: Annotated[str, typer.Option(callback=_duration_param, help="How far back from each host's newest rollup: 7d, 72h, 30d.")] = "7d",
    add: Annotated[int, typer.Option("--add", min=1, max=64, help="Project the shared links with this many more cards (each with the current per-card load).")] = 2,
    as_json: JsonOption = False,
    html: Annotated[
        Optional[Path],
        typer.Option("--html", help="Also write plots (load over time per host, headroom bars) to this HTML file (needs the html extra: plotly).", dir_okay=False),
    ] = None,
) -> None:
    """The PCIe headroom review before cards are added: per host and GPU, TX/RX p50/p95/p99/max
    from the 1-minute rollups against the negotiated and the max link; the cards behind each
    shared switch or root port and their combined load against its link; and what adding cards
    with the current per-card load does to it.

    Reads only (a SQLite store is opened read-only). Saturated means a p95 at or above the
    rules' pcie_saturation_ratio (80 % by default) of the link. docs/capacity.md says how the
    figures are made.

    Examples:\n
      vgpumon capacity gpu-host-17 --db postgresql+psycopg://monitor@db/fleet\n
      vgpumon capacity --window 30d --add 4 --html review.html
    """
    settings = _settings(ctx, {("store", "url"): ("--db", db)})
    from vgpumon.capacity import review
    from vgpumon.capacity.render import print_review
    from vgpumon.config.thresholds import Thresholds
    from vgpumon.diagnose.render import console
    from vgpumon.rules.catalogue import rule_names

    if html is not None:
        try:
            import plotly  # noqa: F401 - checked before the review runs, not after
        except ImportError:
            from vgpumon.capacity.html import PlotlyMissingError

            raise PlotlyMissingError("--html needs plotly: pip install 'vgpumon[html]' (the terminal and --json reviews need nothing more)") from None
    ratio = Thresholds.from_mapping(settings.rules.thresholds, rule_names).pcie_saturation_ratio
    store = _open_for_db(settings, read_only=True)
    try:
        wanted = list(hosts or [])
        count = len(wanted) or len(store.hostnames())
        err = console(sys.stderr)
        if count > 1 and err.is_terminal:
            from rich.progress import Progress

            with Progress(console=err, transient=True) as bar:
                task = bar.add_task("reviewing hosts", total=count)
                result = review(store, wanted, window_seconds=window, add_cards=add, saturation_ratio=ratio,  # type: ignore[arg-type]
                                series=html is not None, progress=lambda _h: bar.advance(task))
        else:
            result = review(store, wanted, window_seconds=window, add_cards=add, saturation_ratio=ratio, series=html is not None)  # type: ignore[arg-type]
    finally:
        store.close()
    if html is not None:
        from vgpumon.capacity.html import write_html

        try:
            write_html(result, html)
        except OSError as exc:
            raise OutputError(f"--html: cannot write {html}: {exc.strerror or exc}") from None
    for name in result["unknown_hosts"]:
        _echo_err(f"vgpumon: {name} is not in the store (capacity reviews the hosts it holds)")
    if as_json:
        for h in result["hosts"]:  # the plots' series stay in the HTML file
            for item in (*h["gpus"], *h["shared"]):
                item.pop("series", None)
        typer.echo(json.dumps(result, indent=2))
    else:
        print_review(result, console())
        if html is not None:
            typer.echo(f"plots written to {html}")
    if result["unknown_hosts"]:  # a host named on the command line that the store does not hold
        raise typer.Exit(ExitCode.USAGE)


@config_app.command("show")
def config_show(ctx: typer.Context, as_json: JsonOption = False) -> None:
    """Print the effective settings (flags aside: environment, config file, defaults), each with
    where it came from; passwords are masked. The text form is a valid config file."""
    from vgpumon.config import field_descriptions, settings_document

    settings = _settings(ctx)
    doc = settings_document(settings, with_origins=True)
    if as_json:
        typer.echo(json.dumps({"config_file": str(settings.config_file) if settings.config_file else None, "settings": doc}, indent=2))
        return
    typer.echo(_toml(doc, settings.config_file, field_descriptions()))


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # an inline table ([rules] thresholds)
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(str(v), ensure_ascii=False)  # a JSON string is a valid TOML basic string


def _toml(doc: dict[str, Any], config_file: Path | None, descriptions: dict[str, str]) -> str:
    lines = [f"# vgpumon {__version__}: effective settings; config file: {config_file or 'none'}"]

    def entry(path: str, key: str, item: dict[str, Any]) -> None:
        origin = item["from"]
        if item["value"] is None:
            lines.append(f"# {key} = (unset: {descriptions.get(path, '')})")
        else:
            lines.append(f"{key} = {_toml_value(item['value'])}" + ("" if origin == "default" else f"  # from {origin}"))

    for key, item in doc.items():
        if "value" in item:
            entry(key, key, item)
    for section, items in doc.items():
        if "value" in items:
            continue
        lines += ["", f"[{section}]"]
        for key, item in items.items():
            entry(f"{section}.{key}", key, item)
    return "\n".join(lines)


def _one_line(text: str) -> str:
    from vgpumon.agent.process import one_line

    return one_line(text)


#: Errors writing the output (stdout on a full disk, a gone terminal): one line, exit 74.
_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EIO, errno.EPIPE, errno.EDQUOT})


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush at exit cannot fail
    again (a traceback after the one line)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _stdout_file() -> tuple[int, int] | None:
    """(device, inode) of what file descriptor 1 is now; ``None`` where it cannot be told."""
    try:
        st = os.fstat(1)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _names_no_command(argv: list[str]) -> bool:
    """``vgpumon`` or ``vgpumon db`` alone: a group without its command (typer shows the help)."""
    if any(a in ("--help", "-h", "--version") for a in argv):
        return False
    words = [a for a in argv if not a.startswith("-")]
    groups = {g.name or (g.typer_instance.info.name if g.typer_instance else None) for g in app.registered_groups}
    return not words or (len(words) == 1 and words[0] in groups)


def _reader_gone(stdout_was: tuple[int, int] | None) -> bool:
    """Rich met a closed pipe: it pointed stdout, which was something else, at /dev/null."""
    try:
        null = os.stat(os.devnull)
    except OSError:
        return False
    now = _stdout_file()
    return stdout_was is not None and now != stdout_was and now == (null.st_dev, null.st_ino)


def main(argv: list[str] | None = None) -> None:
    """Runs the app on ``argv`` (default: ``sys.argv[1:]``) and maps every outcome to the
    exit-code table, printing one line on stderr for each failure. Ctrl-C exits 130, or 0 in the
    commands that stop cleanly on it (``vgpumon.base.signals``)."""
    from vgpumon.base.signals import ROOT_OPTIONS, caused_by_interrupt, exit_interrupted, install_signal_handlers

    argv = sys.argv[1:] if argv is None else list(argv)
    install_signal_handlers(argv)
    stdout_was = _stdout_file()
    try:
        try:
            rv = app(args=argv, prog_name="vgpumon", standalone_mode=False)
        except SystemExit as exc:
            # typer exits 1 when the reader of stdout goes away (`vgpumon rules list | head`),
            # after wrapping stdout to pacify its last flush, and rich (the help) after pointing
            # stdout at /dev/null: not a WARNING, the output was taken
            if exc.code == 1 and (type(sys.stdout).__name__ == "PacifyFlushWrapper" or _reader_gone(stdout_was)):
                # the help a bare group shows (`vgpumon | head`) answers 64, as when read whole
                sys.exit(ExitCode.USAGE if _names_no_command(argv) else ExitCode.OK)
            raise
        if rv == ExitCode.INTERRUPTED:  # typer turns KeyboardInterrupt into Exit(130)
            exit_interrupted(argv)
    except _USAGE_ERROR as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # `vgpumon`, `vgpumon db`: the help is the answer
            try:
                exc.show()  # type: ignore[attr-defined]
            except SystemExit:  # the reader went away (`vgpumon | head -1`): the same answer
                pass
            sys.exit(ExitCode.USAGE)
        ctx = getattr(exc, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        name = getattr(exc, "option_name", None)
        if type(exc).__name__ == "NoSuchOption" and name in ROOT_OPTIONS and ctx is not None and ctx.parent is not None:
            # `vgpumon agent --log-level info`: an option of vgpumon itself, given after the command
            print(f"vgpumon: {name} is an option of vgpumon itself: give it before the command "
                  f"(vgpumon {name} … {ctx.command_path.partition(' ')[2]} …)", file=sys.stderr)
            sys.exit(ExitCode.USAGE)
        print(f"vgpumon: {mask_secrets(_one_line(exc.format_message()))}{hint}", file=sys.stderr)  # type: ignore[attr-defined]
        sys.exit(ExitCode.USAGE)
    except (typer.Abort, KeyboardInterrupt):  # the agent's loop handles a stop once it runs: this is before
        exit_interrupted(argv)
    except VgpumonError as exc:
        print(f"vgpumon: {mask_secrets(_one_line(str(exc)))}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except BrokenPipeError:  # `vgpumon … | head`: the reader had enough; not a failure
        _silence_stdout()
        sys.exit(ExitCode.OK)
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRNOS:
            raise
        _silence_stdout()
        print(f"vgpumon: cannot write the output: {exc.strerror or exc}", file=sys.stderr)
        sys.exit(ExitCode.IOERR)
    except _CLICK_EXCEPTION as exc:
        print(f"vgpumon: {mask_secrets(_one_line(exc.format_message()))}", file=sys.stderr)  # type: ignore[attr-defined]
        sys.exit(ExitCode.USAGE)
    except Exception as exc:  # noqa: BLE001 - the one place an unexpected error becomes exit 70
        if caused_by_interrupt(exc):  # Ctrl-C inside an import's class creation (Python 3.11)
            exit_interrupted(argv)
        from vgpumon.agent.process import exit_internal_error

        exit_internal_error()
    sys.exit(int(rv) if isinstance(rv, int) else 0)
