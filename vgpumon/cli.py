"""Command line: parses, calls a core function, maps domain errors to exit codes.

Exit codes (one table for every command, see README): 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN,
64 usage error, 65 unreadable input file, 69 NVML (driver) unavailable, 70 internal error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from vgpumon import __version__
from vgpumon.errors import ExitCode, StoreUnavailableError, VgpumonError

if TYPE_CHECKING:
    from vgpumon.store import Store

log = logging.getLogger("vgpumon")

# typer ≥ 0.20 vendors click as ``typer._click``; older releases use click itself. Take the
# exception classes from typer's public BadParameter so that both work.
_USAGE_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
_CLICK_EXCEPTION = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")

app = typer.Typer(
    name="vgpumon",
    help=(
        "GPU fleet telemetry and diagnostics for LLM inference hosts.\n\n"
        "Run `vgpumon agent` on each GPU host to sample NVML into a store; run "
        "`vgpumon diagnose <host>` to read what the store says about a host."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DbOption = Annotated[
    Optional[str],
    typer.Option(
        "--db",
        envvar="VGPUMON_DB",
        help="Store URL: sqlite:///path.db (default: a file under the user's data directory) or postgresql+psycopg://...",
        show_default=False,
    ),
]


RulesConfigOption = Annotated[
    Optional[Path],
    typer.Option(
        "--rules-config",
        envvar="VGPUMON_RULES_CONFIG",
        help="TOML file whose rules table overrides rule thresholds (keys: docs/rules.md).",
        exists=True,
        dir_okay=False,
    ),
]


def _thresholds(path: Optional[Path]) -> "object":
    """The rules' thresholds: defaults, or the ``[rules]`` section of a TOML file."""
    from vgpumon.rules.thresholds import Thresholds

    if path is None:
        return Thresholds()
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        raise typer.BadParameter("--rules-config needs Python 3.11 or newer (tomllib)") from None
    try:
        section = tomllib.loads(path.read_text()).get("rules", {})
        return Thresholds.from_mapping(section)
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise typer.BadParameter(f"{path}: {exc}") from None


RawRetentionOption = Annotated[
    str, typer.Option("--raw-retention", envvar="VGPUMON_RAW_RETENTION", help="How long raw per-tick rows are kept (72h, 3d).")
]
RollupRetentionOption = Annotated[
    str, typer.Option("--rollup-retention", envvar="VGPUMON_ROLLUP_RETENTION", help="How long 1-minute rollups are kept (90d).")
]


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
    log_level: Annotated[LogLevel, typer.Option("--log-level", envvar="VGPUMON_LOG_LEVEL", help="How much to log on stderr.")] = LogLevel.warning,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    logging.basicConfig(
        level=getattr(logging, log_level.value.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Alembic narrates every migration step at INFO; one line from vgpumon.store.migrate says it.
    logging.getLogger("alembic").setLevel(max(logging.WARNING, logging.getLogger().level))


def _parse_duration(text: str) -> float:
    """'90', '90s', '15m', '2h', '1d' → seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m:
        raise typer.BadParameter(f"{text!r} is not a duration (e.g. 90s, 15m, 2h)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


async def _run_until_signal(agent: "object") -> "object":
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return await agent.run(stop)  # type: ignore[attr-defined]


@app.command()
def agent(
    db: DbOption = None,
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between ticks.")] = 1.0,
    duration: Annotated[Optional[str], typer.Option(help="Stop after this long (90s, 15m, 2h); default: until SIGINT/SIGTERM.")] = None,
    replay: Annotated[
        Optional[Path],
        typer.Option(help="Replay a capture made by `vgpumon record` instead of reading the GPUs (no GPU needed).", exists=True, dir_okay=False),
    ] = None,
    pace: Annotated[Pace, typer.Option(help="Replay as fast as possible, or at the capture's recorded pace.")] = Pace.fast,
    hostname: Annotated[Optional[str], typer.Option(envvar="VGPUMON_HOSTNAME", help="Name this host is stored under (default: the system host name).")] = None,
    slow_every: Annotated[
        Optional[int], typer.Option(min=1, help="Read the slow set (ECC, remapped rows, energy, ...) every N ticks (default: 10, or the capture's cadence).")
    ] = None,
    no_gpm: Annotated[bool, typer.Option("--no-gpm", help="Do not use GPM (forces the pre-Hopper path).")] = False,
    host_every: Annotated[int, typer.Option(min=1, help="Sample host CPU/memory and GPU processes' owners, RSS and CPU every N ticks.")] = 5,
    vllm_url: Annotated[
        Optional[list[str]],
        typer.Option("--vllm-url", envvar="VGPUMON_VLLM_URLS", help="Also scrape this vLLM server (repeatable), e.g. one in a container."),
    ] = None,
    no_vllm: Annotated[bool, typer.Option("--no-vllm", help="Do not discover or scrape vLLM servers.")] = False,
    vllm_interval: Annotated[float, typer.Option(min=0.1, help="Seconds between vLLM scrapes.")] = 2.0,
    spool: Annotated[
        Optional[Path],
        typer.Option(envvar="VGPUMON_SPOOL", help="Directory where ticks wait while the store is unreachable; put it on another disk than a SQLite store (default: under the user's state directory).", file_okay=False),
    ] = None,
    spool_max_mb: Annotated[int, typer.Option(min=1, help="Spool size above which its oldest ticks are folded into 1-minute rollups.")] = 1024,
    buffer_max_rows: Annotated[int, typer.Option(min=1, help="Rows held in memory when the spool cannot be written; above it the oldest are folded into 1-minute rollups.")] = 8 * 3600,
    raw_retention: RawRetentionOption = "72h",
    rollup_retention: RollupRetentionOption = "90d",
    no_rules: Annotated[bool, typer.Option("--no-rules", help="Do not evaluate the rules (no alerts).")] = False,
    rules_config: RulesConfigOption = None,
    alert_webhook: Annotated[
        Optional[list[str]],
        typer.Option("--alert-webhook", envvar="VGPUMON_ALERT_WEBHOOKS", help="POST firing and resolved alerts as JSON to this URL (repeatable)."),
    ] = None,
    alertmanager: Annotated[
        Optional[list[str]],
        typer.Option("--alertmanager", envvar="VGPUMON_ALERTMANAGERS", help="Send alerts to this Alertmanager (base URL; API v2; repeatable)."),
    ] = None,
) -> None:
    """Sample every NVIDIA GPU each interval and store one row per GPU per tick.

    Runs until SIGINT/SIGTERM or --duration; the tick in progress and every pending row are
    written before it exits. Without an NVIDIA driver it exits 69 with one line naming the cause.

    Examples:\n
      vgpumon agent                                     # sample into the default SQLite store\n
      vgpumon agent --replay tests/data/h200-workload.jsonl.gz --db sqlite:///demo.db
    """
    from vgpumon.agent import Agent
    from vgpumon.config import default_db_url, default_hostname, default_spool_dir
    from vgpumon.sources.nvml import NvmlSource
    from vgpumon.sources.nvml_backend import ReplayBackend
    from vgpumon.store import open_store
    from vgpumon.store.retention import Retention
    from vgpumon.store.spool import Backlog

    backend = ReplayBackend(replay) if replay else None
    if slow_every is None:  # a replay asks for the slow set at the cadence it was recorded with
        slow_every = int(backend.header.get("slow_every", 10)) if backend else 10
    source = NvmlSource(backend, slow_every=slow_every, use_gpm=not no_gpm)
    source.start()  # no NVIDIA stack: exit 69 here, before a store is created for nothing
    url = db or default_db_url()
    raw_s, rollup_s = _retention_pair(raw_retention, rollup_retention)
    try:
        store = open_store(url)  # runs the migrations (under an advisory lock on Postgres)
    except StoreUnavailableError as exc:
        raise StoreStartError(str(exc)) from None
    from vgpumon.sources.host import HostSource

    vllm = None
    if not no_vllm and (replay is None or vllm_url):
        from vgpumon.sources.vllm import NoProcesses, VllmSource

        # a replay reads a recorded host: only configured servers, no discovery on this one
        vllm = VllmSource(static_urls=vllm_url or (), processes=NoProcesses() if replay else None, interval=vllm_interval)
    backlog = Backlog(spool or default_spool_dir(url), max_spool_bytes=spool_max_mb << 20, max_memory_rows=buffer_max_rows)
    rules = None
    if not no_rules:
        import time

        from vgpumon.alerts.sinks import AlertmanagerSink, LogSink, WebhookSink
        from vgpumon.rules.engine import Engine
        from vgpumon.rules.runner import RuleRunner

        sinks = [LogSink(), *(WebhookSink(u) for u in alert_webhook or ()), *(AlertmanagerSink(u) for u in alertmanager or ())]
        # a replay is judged in the capture's time, not against today's clock
        rules = RuleRunner(Engine(_thresholds(rules_config)), sinks=sinks, wall=time.time if replay is None else None)  # type: ignore[arg-type]
    runner = Agent(
        source,
        store,
        host=None if replay else HostSource(),
        sysfs_root=None if replay else "/sys",
        host_every=host_every,
        hostname=hostname or default_hostname(),
        interval=interval,
        duration=_parse_duration(duration) if duration else None,
        paced=replay is None or pace is Pace.recorded,
        vllm=vllm,
        backlog=backlog,
        retention=Retention(store, raw_retention_s=raw_s, rollup_retention_s=rollup_s),
        rules=rules,
    )
    try:
        stats = asyncio.run(_run_until_signal(runner))
    finally:
        store.close()
    typer.echo(
        f"vgpumon agent: {stats.ticks} ticks of {stats.gpus} GPU(s), {stats.rows_written} rows stored in {url}",  # type: ignore[attr-defined]
        err=True,
    )
    if stats.rows_folded:  # type: ignore[attr-defined]
        typer.echo(
            f"vgpumon agent: {stats.rows_folded} ticks were kept only as 1-minute rollups (store away, spool/buffer full)",  # type: ignore[attr-defined]
            err=True,
        )
    if stats.rows_spooled:  # type: ignore[attr-defined]
        typer.echo(f"vgpumon agent: {stats.rows_spooled} rows wait in the spool {backlog.spool_dir} for the next run", err=True)  # type: ignore[attr-defined]
    if stats.rows_pending:  # type: ignore[attr-defined]
        raise typer.Exit(ExitCode.UNAVAILABLE)


class StoreStartError(VgpumonError):
    """The agent's store cannot be opened at start, or a ``db`` command cannot reach its store."""

    exit_code = ExitCode.UNAVAILABLE


def _retention_pair(raw: str, rollup: str) -> tuple[float, float]:
    raw_s, rollup_s = _parse_duration(raw), _parse_duration(rollup)
    if rollup_s < raw_s:
        raise typer.BadParameter("--rollup-retention must be at least --raw-retention")
    return raw_s, rollup_s


db_app = typer.Typer(
    name="db",
    help="Operate the store: migrate its schema, apply retention, show what it holds.",
    no_args_is_help=True,
)
app.add_typer(db_app)


def _open_for_db(db: Optional[str], *, create: bool) -> "Store":
    from vgpumon.config import default_db_url
    from vgpumon.store import Store

    url = db or default_db_url()
    try:
        return Store(url, create=create)
    except StoreUnavailableError as exc:
        raise StoreStartError(str(exc)) from None


@db_app.command("upgrade")
def db_upgrade(db: DbOption = None) -> None:
    """Bring the store's schema to this version's newest revision (the agent does it at start).

    Safe to run while agents write and from many hosts at once: on Postgres one advisory lock
    serialises schema changes.
    """
    from vgpumon.store.migrate import upgrade

    store = _open_for_db(db, create=True)
    try:
        before, after = upgrade(store.engine)
    except StoreUnavailableError as exc:
        raise StoreStartError(str(exc)) from None
    finally:
        store.close()
    typer.echo(f"store schema at {after}" + ("" if before == after else f" (was {before or 'empty'})"))


@db_app.command("prune")
def db_prune(
    db: DbOption = None,
    raw_retention: RawRetentionOption = "72h",
    rollup_retention: RollupRetentionOption = "90d",
    as_json: Annotated[bool, typer.Option("--json", help="Print the outcome as JSON.")] = False,
) -> None:
    """Roll raw rows up into 1-minute rows, then drop what is older than the retention windows.

    The agent does the same in small steps while it runs; this runs it to completion. Raw rows
    are never dropped before they are rolled up.
    """
    from vgpumon.store.retention import Retention

    raw_s, rollup_s = _retention_pair(raw_retention, rollup_retention)
    store = _open_for_db(db, create=False)
    try:
        res = Retention(store, raw_retention_s=raw_s, rollup_retention_s=rollup_s).run()
    except StoreUnavailableError as exc:
        raise StoreStartError(str(exc)) from None
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
            f"rolled up {res.minutes_rolled_up} GPU-minutes; deleted {res.rows_deleted} rows; "
            f"dropped {len(res.partitions_dropped)} partitions"
        )


@db_app.command("stats")
def db_stats(
    db: DbOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the statistics as JSON.")] = False,
) -> None:
    """Rows, bytes, oldest and newest sample of each time table, and the ticks whose full
    resolution was lost (kept only as 1-minute rollups)."""
    from vgpumon.diagnose import _iso

    store = _open_for_db(db, create=False)
    try:
        tables = store.table_stats()
    except StoreUnavailableError as exc:
        raise StoreStartError(str(exc)) from None
    finally:
        store.close()
    if as_json:
        typer.echo(json.dumps({"tables": tables}, indent=2))
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
    file: Annotated[Path, typer.Argument(help="Capture file to write (.jsonl, or .jsonl.gz to compress).", dir_okay=False)],
    duration: Annotated[str, typer.Option(help="How long to record (60s, 5m).")] = "60s",
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between ticks.")] = 1.0,
    mask: Annotated[bool, typer.Option("--mask", help="Replace GPU UUIDs, serials and the host name with neutral values.")] = False,
    slow_every: Annotated[int, typer.Option(min=1, help="Read ECC counters and energy every N ticks.")] = 10,
    no_gpm: Annotated[bool, typer.Option("--no-gpm", help="Do not use GPM (records the pre-Hopper path).")] = False,
) -> None:
    """Record every NVML answer the agent gets, per tick, to a capture file.

    `vgpumon agent --replay FILE` answers the same calls from it through the same collector code,
    keeping the capture's timestamps. Use --mask before sharing a capture.
    """
    from vgpumon.agent import Agent
    from vgpumon.config import default_hostname
    from vgpumon.sources.nvml import NvmlSource
    from vgpumon.sources.nvml_backend import LiveBackend, RecordingBackend

    probe = NvmlSource(LiveBackend())
    probe.start()  # no NVIDIA stack: exit 69 before a capture file is created
    probe.close()
    recorder = RecordingBackend(
        LiveBackend(),
        file,
        mask=mask,
        meta={"interval_s": interval, "slow_every": slow_every, "vgpumon": __version__},
    )
    source = NvmlSource(recorder, slow_every=slow_every, use_gpm=not no_gpm)
    runner = Agent(source, None, hostname=default_hostname(), interval=interval, duration=_parse_duration(duration))
    try:
        stats = asyncio.run(_run_until_signal(runner))
    finally:
        recorder.close()
    typer.echo(f"vgpumon record: {recorder.ticks_written} ticks of {stats.gpus} GPU(s) written to {file}", err=True)  # type: ignore[attr-defined]


@app.command()
def diagnose(
    host: Annotated[str, typer.Argument(help="Host name as stored by its agent; `localhost` means this machine.")],
    db: DbOption = None,
    window: Annotated[str, typer.Option(help="Window ending at the host's newest stored sample (15m, 1h, 900s).")] = "15m",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    max_age: Annotated[
        Optional[str],
        typer.Option(help="UNKNOWN (exit 3) when the host's newest sample is older than this (e.g. 2m): use it from monitoring. Default: report on whatever is stored."),
    ] = None,
    rules_config: RulesConfigOption = None,
) -> None:
    """Report per GPU what the store shows for a recent window, for the on-call engineer.

    Exit status follows monitoring-plugin convention: 0 OK, 1 WARNING, 2 CRITICAL,
    3 UNKNOWN (host not in the store, no samples, store unreachable).
    """
    from vgpumon.config import default_db_url
    from vgpumon.diagnose import build_report, exit_code, resolve_host, unknown_report
    from vgpumon.render import render_diagnose
    from vgpumon.store import Store

    seconds = _parse_duration(window)
    max_age_s = _parse_duration(max_age) if max_age else None
    thresholds = _thresholds(rules_config)
    url = db or default_db_url()
    try:
        store = Store(url, create=False)
        try:
            report = build_report(store, host, window_seconds=seconds, max_age_seconds=max_age_s, thresholds=thresholds)
        finally:
            store.close()
    except StoreUnavailableError as exc:
        typer.echo(f"vgpumon: {exc}", err=True)
        report = unknown_report(resolve_host(host), str(exc))
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        typer.echo(render_diagnose(report))
    raise typer.Exit(exit_code(report))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: runs the app and maps every outcome to the exit-code table."""
    try:
        rv = app(args=argv, prog_name="vgpumon", standalone_mode=False)
    except _USAGE_ERROR as exc:
        exc.show()  # type: ignore[attr-defined]
        sys.exit(ExitCode.USAGE)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(130)
    except VgpumonError as exc:
        print(f"vgpumon: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except _CLICK_EXCEPTION as exc:
        exc.show()  # type: ignore[attr-defined]
        sys.exit(ExitCode.USAGE)
    except Exception:  # noqa: BLE001 - the one place an unexpected error becomes exit 70
        log.exception("internal error")
        sys.exit(ExitCode.SOFTWARE)
    sys.exit(int(rv) if isinstance(rv, int) else 0)
