"""Engine creation: SQLite (default) or Postgres through one SQLAlchemy URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from vgpumon.errors import StoreUnavailableError


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cur = dbapi_connection.cursor()
    # WAL: readers (diagnose, capacity) never block the agent's writes, and the agent never
    # blocks them.
    cur.execute("PRAGMA journal_mode=WAL")
    # A reader's checkpoint or a second writer can hold the lock briefly: wait rather than fail.
    cur.execute("PRAGMA busy_timeout=5000")
    # In WAL mode NORMAL is durable across application crashes and only a power loss can undo
    # the last commits; FULL would fsync on every batch for little gain in a telemetry store.
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(url: str, *, create_dirs: bool = True) -> Engine:
    """Create an engine for a store URL.

    Args:
        url: SQLAlchemy URL, e.g. ``sqlite:///var/lib/vgpumon/vgpumon.db`` or
            ``postgresql+psycopg://user@host/db``.
        create_dirs: create the parent directory of a SQLite file when missing.

    Raises:
        StoreUnavailableError: the URL is malformed or its driver is not installed.
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreUnavailableError(f"not a database URL: {url!r} (e.g. sqlite:///vgpumon.db)") from None
    kwargs: dict[str, Any] = {}
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:" and create_dirs:
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    else:
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(parsed, **kwargs)
    except (NoSuchModuleError, ModuleNotFoundError, ImportError) as exc:
        raise StoreUnavailableError(f"no driver for {parsed.drivername}: {exc}") from None
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine
