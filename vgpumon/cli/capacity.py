"""``vgpumon capacity``: the PCIe headroom review before cards are added."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional, cast

import typer

from vgpumon.base.errors import ExitCode, OutputError
from vgpumon.base.masking import mask_secrets
from vgpumon.cli.options import DbOption, JsonOption, _duration_param, _open_for_db, _settings
from vgpumon.cli.outcomes import _echo_err
from vgpumon.cli.prometheus import PrometheusOption, exclusive

if TYPE_CHECKING:
    from vgpumon.capacity.schema import Review
    from vgpumon.store import Store


def capacity(
    ctx: typer.Context,
    hosts: Annotated[Optional[list[str]], typer.Argument(help="Hosts as stored (default: every host in the store).", show_default=False)] = None,
    db: DbOption = None,
    prometheus: PrometheusOption = None,
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
      vgpumon capacity --window 30d --add 4 --html review.html\n
      vgpumon capacity --prometheus http://prometheus:9090 --window 3d
    """
    exclusive(db, prometheus)
    settings = _settings(ctx, {("store", "url"): ("--db", db)})
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
    span = cast(float, window)  # _duration_param made it seconds
    notes: list[str] = []
    missing: list[str] = []
    with contextlib.ExitStack() as stack:
        if prometheus is not None:
            from vgpumon.cli.prometheus import hydrated_for_capacity

            store, notes, missing = stack.enter_context(hydrated_for_capacity(prometheus, list(hosts or []), span, settings.diagnose.timeout))
            hosts = [h for h in hosts if h not in missing] if hosts else None  # [] when none asked for is there
        else:
            store = stack.enter_context(contextlib.closing(_open_for_db(settings, read_only=True)))
        result = _review(store, hosts, span, add, ratio, html is not None)
    result["unknown_hosts"] = [*missing, *result["unknown_hosts"]]
    if prometheus is not None:
        result["source"] = {"kind": "prometheus", "where": mask_secrets(prometheus.rstrip("/")), "notes": notes}
        if not notes:
            notes.append(f"no host asked for has GPU series in Prometheus at {result['source']['where']}")
    if html is not None:
        from vgpumon.capacity.html import write_html

        try:
            write_html(result, html)
        except OSError as exc:
            raise OutputError(f"--html: cannot write {html}: {exc.strerror or exc}") from None
    where = "the store" if prometheus is None else "Prometheus"
    for name in result["unknown_hosts"]:
        _echo_err(f"vgpumon: {name} is not in {where} (capacity reviews the hosts it holds)")
    if as_json:
        for h in result["hosts"]:  # the plots' series stay in the HTML file
            for item in (*h["gpus"], *h["shared"]):
                item.pop("series", None)
        typer.echo(json.dumps(result, indent=2))
    else:
        print_review(result, console())
        for line in notes:
            typer.echo(line)
        if html is not None:
            typer.echo(f"plots written to {html}")
    if result["unknown_hosts"]:  # a host named on the command line that the store does not hold
        raise typer.Exit(ExitCode.USAGE)


def _review(store: "Store", hosts: Optional[list[str]], window: float, add: int, ratio: float, series: bool) -> "Review":
    """The review of ``hosts`` (every host when empty), with a progress bar at a terminal."""
    from vgpumon.capacity import review
    from vgpumon.diagnose.render import console

    wanted = list(hosts or [])
    if hosts is not None and not hosts:  # every host asked for was unknown
        return {"window_seconds": window, "add_cards": add, "saturation_ratio": ratio, "hosts": [], "unknown_hosts": []}
    count = len(wanted) or len(store.hostnames())
    err = console(sys.stderr)
    if count > 1 and err.is_terminal:
        from rich.progress import Progress

        with Progress(console=err, transient=True) as bar:
            task = bar.add_task("reviewing hosts", total=count)
            return review(store, wanted, window_seconds=window, add_cards=add, saturation_ratio=ratio,
                          series=series, progress=lambda _h: bar.advance(task))
    return review(store, wanted, window_seconds=window, add_cards=add, saturation_ratio=ratio, series=series)
