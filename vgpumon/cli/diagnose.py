"""``vgpumon diagnose``: the on-call report of one host, from its agent or from the store, within
a deadline."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Callable, Optional, TypeVar

import typer

from vgpumon.base.errors import StoreUnavailableError
from vgpumon.base.masking import mask_secrets
from vgpumon.cli.options import DbOption, _settings, _store_kwargs
from vgpumon.cli.outcomes import _echo_err, _silence_stdout
from vgpumon.cli.prometheus import PrometheusOption, exclusive

if TYPE_CHECKING:
    from vgpumon.config import Settings
    from vgpumon.diagnose.schema import Report

T = TypeVar("T")


def _within(seconds: float, fn: Callable[[], T], what: str) -> T:
    """``fn()`` within ``seconds`` (``vgpumon.base.workers.within``): a database that accepts
    the connection and then never answers must not hold a command (or the monitoring that runs
    it) for the kernel's TCP timeout (130 s seen).

    Raises:
        StoreUnavailableError: ``fn`` did not finish in time (``what`` names the store).
        Exception: whatever ``fn`` raised.
    """
    from vgpumon.base.workers import within
    from vgpumon.config import format_duration

    return within(fn, seconds, lambda: StoreUnavailableError(f"store {what} did not answer within {format_duration(seconds)}"))


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
    prometheus: PrometheusOption = None,
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
      vgpumon diagnose gpu-host-17 --db postgresql+psycopg://db/fleet --max-age 2m\n
      vgpumon diagnose localhost --since 6h --stacks\n
      vgpumon diagnose gpu-host-17 --prometheus http://prometheus:9090
    """
    exclusive(db, prometheus)
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
    asked: "Report | str | None"
    if prometheus is not None:
        from vgpumon.cli.prometheus import report_from_prometheus

        asked = report_from_prometheus(settings, prometheus, name, since)
        if stacks:
            asked["stacks_note"] = "--stacks needs the host's agent; this report came from Prometheus"
    else:
        asked = None if db is not None else _report_from_agent(settings, name, port, since, stacks)
    if asked is None or isinstance(asked, str):  # --db, or the agent is unreachable (``asked`` says why)
        # a store that cannot answer is the UNKNOWN report's own first line: a second copy on
        # stderr read as a stray line at a terminal. With --json the reader is a program and the
        # person running it sees stderr only: the line goes there too
        rep = _report_from_store(settings, name, since, note=asked, quiet=asked is not None or not as_json)
        if stacks:
            rep["stacks_note"] = "--stacks needs the host's agent; this report came from the store"
    else:
        rep = asked
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


def _report_from_agent(settings: "Settings", host: str, port: int, since: Optional[str], stacks: bool) -> "Report | str":
    """The agent's report (``source.kind`` ``agent``), a stand-in saying why there is none
    (``refused``: it answered with an error: UNKNOWN, no fallback — the agent is up), or, when
    the agent is unreachable, the note saying so (the caller falls back to the store)."""
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
        return f"agent at {where} unreachable ({exc})"
    rep["source"] = {"kind": "agent", "where": where}
    return rep


def _report_from_store(settings: "Settings", host: str, since: Optional[str], *, note: str | None, quiet: bool) -> "Report":
    """The report read from the store (``--db``, or the fallback for an unreachable agent).

    ``note`` (why the agent did not answer) goes into the report; ``quiet``: a store that cannot
    answer is said by the report's one line only (with ``note``: both), nothing on stderr."""
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

    def report() -> "Report":
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
