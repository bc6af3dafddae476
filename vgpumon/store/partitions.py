"""Day partitions of the time tables on Postgres.

Time tables are declared ``PARTITION BY RANGE (ts)`` (epoch ms) by the migrations; each day
``[00:00, 24:00)`` UTC is one partition named ``<table>_pYYYYMMDD``. There is no DEFAULT partition:
creating a day's partition after rows of that day had landed in a default one would fail, so the
writer creates the partitions a batch needs before writing it (cached, so this costs nothing per
batch) and the maintenance job creates the next days ahead. Retention then drops whole partitions
(``DROP TABLE``: no dead rows, no vacuum), instead of deleting rows.

SQLite has no partitions; every function here is a no-op there.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Iterable

from sqlalchemy import Connection, text

DAY_MS = 86_400_000
#: ``pg_advisory_xact_lock`` key serialising partition DDL between agents sharing a database.
PARTITION_LOCK_KEY = 0x7667_7075_7061_7274
_BOUND = re.compile(r"FROM \('?(-?\d+)'?\) TO \('?(-?\d+)'?\)")


def day_of(ts_ms: int) -> int:
    """Start (epoch ms, UTC midnight) of the day holding ``ts_ms``."""
    return ts_ms - ts_ms % DAY_MS


def partition_name(table: str, day_ms: int) -> str:
    """``gpu_samples_p20261130`` for the day starting at ``day_ms``."""
    day = dt.datetime.fromtimestamp(day_ms / 1000, dt.timezone.utc)
    return f"{table}_p{day:%Y%m%d}"


def ensure(conn: Connection, table: str, days: Iterable[int]) -> list[str]:
    """Create the day partitions of ``table`` for ``days`` (epoch ms of UTC midnights) that do not
    exist yet; no-op on SQLite.

    Returns:
        Names of the partitions created.
    """
    if conn.dialect.name != "postgresql":
        return []
    wanted = sorted(set(days))
    existing = {name for name, _, _ in list_partitions(conn, table)}
    missing = [d for d in wanted if partition_name(table, d) not in existing]
    if not missing:
        return []
    # Two agents creating the same partition at once would collide on the catalog: serialise.
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PARTITION_LOCK_KEY})
    created = []
    for d in missing:
        name = partition_name(table, d)
        conn.execute(
            text(f'CREATE TABLE IF NOT EXISTS "{name}" PARTITION OF "{table}" FOR VALUES FROM ({d}) TO ({d + DAY_MS})')
        )
        created.append(name)
    return created


def list_partitions(conn: Connection, table: str) -> list[tuple[str, int, int]]:
    """``(name, lower ms, upper ms)`` of each partition of ``table``, oldest first; ``[]`` on
    SQLite."""
    if conn.dialect.name != "postgresql":
        return []
    rows = conn.execute(
        text(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent "
            "JOIN pg_namespace n ON n.oid = p.relnamespace "
            "WHERE p.relname = :t AND n.nspname = current_schema()"
        ),
        {"t": table},
    ).all()
    out = []
    for name, bound in rows:
        m = _BOUND.search(bound or "")
        if m:
            out.append((name, int(m.group(1)), int(m.group(2))))
    return sorted(out, key=lambda p: p[1])


def drop_before(conn: Connection, table: str, cutoff_ms: int, *, limit: int = 2) -> list[str]:
    """Drop up to ``limit`` partitions of ``table`` that end at or before ``cutoff_ms``. Agents
    sharing the database may try at once: whichever takes the DDL lock drops them, the others
    drop nothing this time (the lock is released when the caller commits).

    Returns:
        Names of the partitions dropped (oldest first).
    """
    dropped: list[str] = []
    if conn.dialect.name != "postgresql" or not conn.scalar(
        text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": PARTITION_LOCK_KEY}
    ):
        return dropped
    for name, _, upper in list_partitions(conn, table):
        if upper <= cutoff_ms and len(dropped) < limit:
            conn.execute(text(f'DROP TABLE "{name}"'))
            dropped.append(name)
    return dropped
