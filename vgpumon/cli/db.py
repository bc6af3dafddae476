"""``vgpumon db``: operate the store (upgrade its schema, prune it, show what it holds)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from vgpumon.base.errors import UsageError
from vgpumon.cli.options import DbOption, JsonOption, RawRetentionOption, RollupRetentionOption, _open_for_db, _settings

db_app = typer.Typer(
    name="db",
    help="Operate the store: migrate its schema, apply retention, show what it holds.",
    no_args_is_help=True,
)


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
