"""``vgpumon rules``: the rule catalogue, its Prometheus twins and runbooks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from vgpumon.base.errors import ExitCode

rules_app = typer.Typer(
    name="rules",
    help="The rule catalogue: list it, generate its Prometheus twins and runbooks.",
    no_args_is_help=True,
)


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
