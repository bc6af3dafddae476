"""``vgpumon rules``: the rule catalogue, its Prometheus twins and runbooks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from vgpumon.base.errors import ExitCode, UsageError

rules_app = typer.Typer(
    name="rules",
    help="The rule catalogue: list it, generate its Prometheus twins and runbooks.",
    no_args_is_help=True,
)


@rules_app.command("build")
def rules_build(
    out: Annotated[Optional[Path], typer.Option(help="Directory of the Prometheus rule files (default rules/ of the checkout).", file_okay=False, show_default=False)] = None,
    runbooks: Annotated[Optional[Path], typer.Option(help="Directory of the runbooks (default docs/runbooks/ of the checkout).", file_okay=False, show_default=False)] = None,
    check: Annotated[bool, typer.Option("--check", help="Write nothing; exit 1 when a file differs from what would be written.")] = False,
    runbook_base_url: Annotated[
        Optional[str],
        typer.Option(
            "--runbook-base-url",
            help="Prefix of every alert's runbook_url, e.g. https://git.example.com/vgpumon/blob/main/docs/runbooks/ "
            "(default docs/runbooks/, the path in this repository).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Generate rules/*.rules.yml (the Prometheus twins) and docs/runbooks/*.md from the rule
    catalogue, with the default thresholds. Run from the repository root (elsewhere, give --out
    and --runbooks); commit the result.

    Alertmanager and Grafana show runbook_url as a link: give --runbook-base-url where your
    copy of docs/runbooks/ is served, so that the link opens it."""
    from vgpumon.cli.options import _checkout_or_given
    from vgpumon.config.thresholds import Thresholds
    from vgpumon.rules import docs, prometheus

    _checkout_or_given("rules build", {flag: d for flag, d, given in (("--out", "rules", out), ("--runbooks", "docs/runbooks", runbooks)) if given is None})
    out, runbooks = out or Path("rules"), runbooks or Path("docs/runbooks")
    th = Thresholds() if runbook_base_url is None else Thresholds(runbook_base_url=_base_url(runbook_base_url))
    wanted = {out / name: text for name, text in prometheus.render(th).items()}
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


def _base_url(value: str) -> str:
    """A runbook base URL checked at the door: an http(s) URL or a relative path, no spaces or
    quotes (it goes into YAML and Markdown links); a ``/`` is added where it has none."""
    from urllib.parse import urlsplit

    bad = next((c for c in value if c.isspace() or c in "\"'<>`"), None)
    if not value or bad is not None:
        raise UsageError(f"--runbook-base-url {value!r}: {'empty' if not value else f'contains {bad!r}'}; give a URL such as https://git.example.com/vgpumon/blob/main/docs/runbooks/")
    parts = urlsplit(value)
    if parts.scheme and (parts.scheme not in ("http", "https") or not parts.netloc):
        raise UsageError(f"--runbook-base-url {value!r}: not an http(s) URL with a host, nor a relative path")
    return value if value.endswith("/") else value + "/"


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
    from rich import box
    from rich.table import Table

    from vgpumon.config import format_duration
    from vgpumon.diagnose.render import console

    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1))
    for name in ("name", "severity", "subject", "for"):
        t.add_column(name, no_wrap=True)
    t.add_column("summary")
    for rule in RULES:
        t.add_row(rule.name, rule.severity, rule.subject, format_duration(rule.for_seconds), rule.summary)
    console().print(t)
