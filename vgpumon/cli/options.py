"""What the commands share: the options several of them take, and the settings, logging and
store of one invocation (the flags given over environment, config file and defaults)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

if TYPE_CHECKING:
    from vgpumon.config import Flags, Settings
    from vgpumon.store import Store


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


def _setup_logging(level: str) -> None:
    from vgpumon.base.logs import setup_logging

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


def _open_for_db(settings: "Settings", *, create: bool = False, read_only: bool = False) -> "Store":
    from vgpumon.store import Store

    assert settings.store.url is not None
    return Store(settings.store.url, create=create, read_only=read_only, **_store_kwargs(settings))


def _checkout_or_given(command: str, defaults: dict[str, str]) -> None:
    """``rules build`` and ``dashboards build`` write the repository's generated files into
    directories relative to the working directory: where one of them is left at its default
    (``defaults``: flag → directory) the working directory must be a vgpumon checkout's root,
    or the files land wherever the command was typed. Refuses (64) naming the flags to give."""
    from pathlib import Path

    from vgpumon.base.errors import UsageError

    here = Path.cwd()
    if not defaults or ((here / "pyproject.toml").is_file() and (here / "vgpumon" / "__init__.py").is_file()):
        return
    dirs = " and ".join(f"{d}/" for d in defaults.values())
    flags = " ".join(f"{flag} DIR" for flag in defaults)
    raise UsageError(f"{command}: {here} is not the root of a vgpumon checkout, where {dirs} belong{'s' if len(defaults) == 1 else ''}: "
                     f"run it there, or say where to write with {flags}")
