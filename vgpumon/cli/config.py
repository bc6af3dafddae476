"""``vgpumon config``: the effective settings, each with where it came from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from vgpumon import __version__
from vgpumon.cli.options import JsonOption, _settings

config_app = typer.Typer(name="config", help="Show the effective settings.", no_args_is_help=True)


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
