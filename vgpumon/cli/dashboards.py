"""``vgpumon dashboards``: the Grafana dashboards generated from the field catalogue."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from vgpumon.base.errors import ExitCode

dashboards_app = typer.Typer(
    name="dashboards",
    help="Grafana dashboards generated from the field catalogue (needs the dashboards extra).",
    no_args_is_help=True,
)


@dashboards_app.command("build")
def dashboards_build(
    out: Annotated[Optional[Path], typer.Option(help="Directory to write the dashboards into (default dashboards/ of the checkout).", file_okay=False, show_default=False)] = None,
    check: Annotated[bool, typer.Option("--check", help="Write nothing; exit 1 when a file in --out differs from what would be written.")] = False,
) -> None:
    """Write the GPU fleet, GPU host detail, vLLM serving and PCIe capacity dashboards.

    Generated with grafana-foundation-sdk's Grafana 11.6 build; regenerating gives byte-identical
    files, so CI can check the committed ones with --check.
    """
    from vgpumon.cli.options import _checkout_or_given
    from vgpumon.dashboards import SdkMissingError, render, write

    if out is None:
        _checkout_or_given("dashboards build", {"--out": "dashboards"})
        out = Path("dashboards")
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
