"""Engine creation: SQLite (default) or Postgres through one SQLAlchemy URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from vgpumon.errors import StoreUnavailableError

DEFAULT_BUSY_TIMEOUT_MS = 5000


def _sqlite_pragmas(busy_timeout_ms: int) -> Any:
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        _apply_pragmas(dbapi_connection, busy_timeout_ms)

    return on_connect


def _apply_pragmas(dbapi_connection: Any, busy_timeout_ms: int) -> None:
    cur = dbapi_connection.cursor()
    # WAL: readers (diagnose, capacity) never block the agent's writes, and the agent never
    # blocks them (tests/test_store.py holds a read transaction open while the agent writes).
    cur.execute("PRAGMA journal_mode=WAL")
    # A reader's checkpoint or a second writer can hold the lock briefly: wait rather than fail.
    # After this long the agent's write fails and its batch goes to the spool instead.
    cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    # In WAL mode NORMAL is durable across application crashes and only a power loss can undo
    # the last commits; FULL would fsync on every batch for little gain in a telemetry store.
    cur.execute("PRAGMA synchronous=NORMAL")
    # Identity rows (hosts, gpus) are referenced by every sample: keep the references honest.
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(url: str, *, create_dirs: bool = True, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> Engine:
    """Create an engine for a store URL.

    Args:
        url: SQLAlchemy URL, e.g. ``sqlite:///var/lib/vgpumon/vgpumon.db`` or
            ``postgresql+psycopg://user@host/db``; a plain path means a SQLite file.
        create_dirs: create the parent directory of a SQLite file when missing.
        busy_timeout_ms: SQLite: how long a write waits for another writer's lock before it
            fails (ms).

    Raises:
        StoreUnavailableError: the URL is malformed or its driver is not installed.
    """
    if "://" not in url:  # a plain file path: the SQLite store people mean when they type one
        url = f"sqlite:///{Path(url).expanduser().resolve()}"
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
        event.listen(engine, "connect", _sqlite_pragmas(busy_timeout_ms))
    return engine
