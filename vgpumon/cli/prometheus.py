"""``--prometheus URL`` of ``diagnose`` and ``capacity``: the report from a Prometheus-compatible
engine's copy of the agents' series, through a temporary store hydrated from its HTTP API and the
unchanged report builders (docs/store.md, "Prometheus-compatible source")."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from vgpumon.base.errors import StoreUnavailableError, UsageError
from vgpumon.base.masking import mask_secrets

if TYPE_CHECKING:
    from vgpumon.config import Settings
    from vgpumon.diagnose.schema import Report
    from vgpumon.store import Store
    from vgpumon.store.prometheus_api import PrometheusApi

#: The environment variable holding the bearer token the API wants (never a flag: a flag shows
#: in the process list).
TOKEN_ENV = "VGPUMON_PROMETHEUS_TOKEN"  # noqa: S105  the variable's name, not a token
#: Rules read up to an hour before the window's end (trends, leaks): hydrated whatever the window.
RULES_SPAN_S = 3600.0

def _checked_url(value: Optional[str]) -> Optional[str]:
    """``--prometheus`` as typed: an ``http(s)://host[:port][/path]`` base URL, without a query
    or a fragment (the API's paths go after it); else a usage error (64), one line."""
    if value is None:
        return None
    from vgpumon.config.checks import check_alert_url

    try:
        url = check_alert_url(value, example="http://prometheus:9090")
    except ValueError as exc:
        raise typer.BadParameter(mask_secrets(str(exc))) from None
    parts = urllib.parse.urlsplit(url)
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise typer.BadParameter(f"{mask_secrets(url)!r} has a query or a fragment: give the API's base URL (http://prometheus:9090)")
    return url


PrometheusOption = Annotated[
    Optional[str],
    typer.Option(
        "--prometheus",
        callback=_checked_url,
        help=f"Read the agents' exported series from this Prometheus-compatible API (Prometheus, Thanos, Mimir, VictoriaMetrics: "
        f"http://prometheus:9090) instead of a store; bearer token from {TOKEN_ENV}. Not with --db.",
        show_default=False,
    ),
]


def exclusive(db: str | None, prometheus: str | None) -> None:
    """``--db`` and ``--prometheus`` name two sources of one report: only one may be given."""
    if db is not None and prometheus is not None:
        raise UsageError("--db and --prometheus are two sources of history: give one")


def api_of(url: str, timeout: float) -> "PrometheusApi":
    """The API at ``url`` with the token of ``VGPUMON_PROMETHEUS_TOKEN``.

    Raises:
        UsageError: a token that cannot go in a header (a space, a control character, a newline
            a file's last line left in it): a setting to fix, not an unreachable server.
    """
    from vgpumon.store.prometheus_api import PrometheusApi

    token = os.environ.get(TOKEN_ENV) or None
    if token is not None and not all("!" <= c <= "~" for c in token):
        raise UsageError(f"{TOKEN_ENV} has a space, a newline, a control character or non-ASCII in it, "
                         "which no bearer credential has: set it to the credential alone")
    return PrometheusApi(url, token=token, timeout=timeout)


@contextlib.contextmanager
def temporary_store() -> Iterator["Store"]:
    """An empty store in a temporary directory, removed afterwards."""
    from vgpumon.store import open_store

    with tempfile.TemporaryDirectory(prefix="vgpumon-prometheus-") as tmp:
        store = open_store(f"sqlite:///{tmp}/history.db")
        try:
            yield store
        finally:
            store.close()


def report_from_prometheus(settings: "Settings", url: str, host: str, since: Optional[str]) -> "Report":
    """The diagnose report of ``host`` from the series at ``url``; UNKNOWN with one line when the
    API cannot answer or does not know the host."""
    from vgpumon.config.thresholds import Thresholds
    from vgpumon.diagnose import build_report, parse_since, resolve_host, unknown_report
    from vgpumon.rules.catalogue import rule_names
    from vgpumon.store.prometheus_source import hostnames, hydrate, newest_sample

    d = settings.diagnose
    name = resolve_host(host, settings.agent.hostname)
    lookback, moment = parse_since(since) if since else (None, None)
    thresholds = Thresholds.from_mapping(settings.rules.thresholds, rule_names)
    try:
        api = api_of(url, d.timeout)
        now = time.time()
        newest = newest_sample(api, name, now)
        if newest is None:
            known = hostnames(api, now)
            there = f"hosts there: {', '.join(known[:20])}{' …' if len(known) > 20 else ''}" if known else "it holds no vgpumon series"
            rep = unknown_report(name, f"host {name!r} has no GPU series in Prometheus at {api.where} in the last 7 days ({there})")
        else:
            reach = max(d.window, RULES_SPAN_S, lookback or 0.0, newest - moment if moment is not None else 0.0)
            with temporary_store() as store:
                got = hydrate(store, api, name, newest - reach, newest)
                rep = build_report(store, name, window_seconds=d.window, max_age_seconds=d.max_age, local_hostname=name,
                                   thresholds=thresholds, since=moment, lookback_seconds=lookback)
            info = got.as_dict(api.where)
            rep["prometheus"] = info  # type: ignore[typeddict-item]  # as_dict returns the PrometheusSource keys
            rep["source_note"] = f"from Prometheus at {api.where}, {got.resolution}. " + " ".join(got.notes)
        rep["source"] = {"kind": "prometheus", "where": api.where}
        return rep
    except StoreUnavailableError as exc:
        rep = unknown_report(name, mask_secrets(str(exc)))
        rep["source"] = {"kind": "prometheus", "where": mask_secrets(url)}
        return rep


def hydrated_for_capacity(url: str, hosts: list[str], window_s: float, timeout: float) -> "contextlib.AbstractContextManager[tuple[Store, list[str], list[str]]]":
    """A temporary store holding the hosts' series over the window, rolled up as an agent would;
    with the notes to print and the hosts Prometheus does not know."""
    return _hydrated(url, hosts, window_s, timeout)


@contextlib.contextmanager
def _hydrated(url: str, hosts: list[str], window_s: float, timeout: float) -> Iterator[tuple["Store", list[str], list[str]]]:
    from vgpumon.store.prometheus_source import hostnames, hydrate, newest_sample
    from vgpumon.store.retention import Retention

    api = api_of(url, timeout)
    now = time.time()
    known = hostnames(api, now)
    wanted = hosts or known
    notes: list[str] = []
    missing: list[str] = []
    with temporary_store() as store:
        for h in wanted:
            newest = newest_sample(api, h, now) if h in known else None
            if newest is None:
                missing.append(h)
                continue
            got = hydrate(store, api, h, newest - window_s, newest)
            notes.append(f"{h}: from Prometheus at {api.where}, {got.resolution}; the 1-minute rollups were made from those points.")
        ten_years = 3650 * 86400.0
        Retention(store, raw_retention_s=ten_years, rollup_retention_s=ten_years, clock=lambda: now + 3600.0).run()
        yield store, notes, missing
