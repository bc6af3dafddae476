"""Every query the agent and the reports make, in one place, on SQLite and Postgres alike."""

from __future__ import annotations

from typing import TypedDict, Unpack

from sqlalchemy import Engine

from vgpumon.store.identity import Registration
from vgpumon.store.reads_rollups import RollupReads
from vgpumon.store.reads_series import SeriesReads
from vgpumon.store.reads_window import WindowReads
from vgpumon.store.writes import Writes


class Store(Registration, Writes, WindowReads, SeriesReads, RollupReads):
    """The time-series store.

    Args:
        url: SQLAlchemy URL (see ``make_engine``).
        engine: an existing engine instead of ``url`` (tests).
        create: allow creating a new SQLite file; readers pass False so that a mistyped path
            reports "no store" instead of creating an empty one.
        read_only: open for reading only (``diagnose``, ``db stats``): no file is created or
            changed, SQLite is opened ``mode=ro`` or as an immutable snapshot
            (``vgpumon.store.engine``); implies ``create=False``.
        busy_timeout_ms: SQLite: how long a write waits for a lock held by another writer.
        connect_timeout_s: Postgres: give up connecting after this long; ``None`` waits.
        statement_timeout_s: Postgres: the server cancels a longer statement; ``None``: its
            setting.

    Every method raises ``StoreUnavailableError`` when the database cannot be reached or queried.
    """


class StoreOptions(TypedDict, total=False):
    """``Store``'s keyword arguments (``open_store``)."""

    engine: Engine | None
    create: bool
    read_only: bool
    busy_timeout_ms: int
    connect_timeout_s: float | None
    statement_timeout_s: float | None


def open_store(url: str, **kw: Unpack[StoreOptions]) -> Store:
    """Open (create if needed) the store at ``url`` and bring its schema to the newest revision;
    ``kw`` go to ``Store``. Raises ``StoreUnavailableError``."""
    store = Store(url, **kw)
    store.init_schema()
    return store
