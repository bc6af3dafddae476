"""The store's core: the engine and its pool, prepared statements, the schema check, the errors;
the parts of ``Store`` (registration, writes, reads by reader) build on it."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import TypeVar, cast

from sqlalchemy import BindParameter, Connection, Engine, Executable, bindparam

from vgpumon.base.errors import StoreUnavailableError
from vgpumon.store.engine import (
    ConnectionWatch,
    check_reachable,
    describe_store,
    make_engine,
    normalise_url,
    sqlite_access,
    sqlite_file,
    unavailable,
)
from vgpumon.store.schema import (
    Host,
)
from vgpumon.store.tables import (
    _TABLES,
    StoredGpu,
    insert_ignoring_duplicates,
)

_S = TypeVar("_S", bound=Executable)


class StoreBase:
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

    def __init__(
        self,
        url: str | None = None,
        *,
        engine: Engine | None = None,
        create: bool = True,
        read_only: bool = False,
        busy_timeout_ms: int = 5000,
        connect_timeout_s: float | None = None,
        statement_timeout_s: float | None = None,
    ) -> None:
        if engine is None:
            if url is None:
                raise ValueError("Store needs a URL or an engine")
            create = create and not read_only
            file = sqlite_file(normalise_url(url))
            if file is not None:
                check_reachable(file)  # a path it may not enter: one line, not pathlib's PermissionError
            if not create and file is not None and not file.is_file():
                what = "is not a file" if file.exists() else "does not exist"
                raise StoreUnavailableError(f"no store at {file}: it {what} (has an agent written there? see --db)")
            engine = make_engine(
                url,
                create_dirs=create,
                read_only=read_only,
                busy_timeout_ms=busy_timeout_ms,
                connect_timeout_s=connect_timeout_s,
                statement_timeout_s=statement_timeout_s,
            )
        self.engine = engine
        self.dialect = engine.dialect.name
        #: the pool's connections and its last movement: the agent cuts a silent store's (``ConnectionWatch``)
        self.watch = ConnectionWatch(engine)
        #: (table, day ms) partitions known to exist (Postgres).
        self._partitions: set[tuple[str, int]] = set()
        self._extra_inserts = {name: insert_ignoring_duplicates(self.dialect, t) for name, t in _TABLES.items()}
        self._process_ids: dict[tuple[int, int, float | None], int] = {}
        # statements the agent's rules run every cycle, built once with bound parameters: building
        # a SQLAlchemy statement and its cache key costs more than running it on a small window
        self._stmts: dict[tuple[Hashable, ...], Executable] = {}
        self._schema_ok = False  # a reader found the tables at the revision this vgpumon reads
        self._gpus: dict[str, tuple[float, tuple[StoredGpu, ...]]] = {}  # gpus_of, with when it was read

    @staticmethod
    def _ids(n: int) -> list[BindParameter[int]]:
        """``n`` bound parameters ``id0``… for an ``IN`` list whose length is part of the
        statement's key (an expanding parameter is re-compiled at every execution)."""
        return [bindparam(f"id{i}") for i in range(n)]

    @staticmethod
    def _id_params(ids: Sequence[int]) -> dict[str, int]:
        return {f"id{i}": g for i, g in enumerate(ids)}

    def _stmt(self, key: tuple[Hashable, ...], build: Callable[[], _S]) -> _S:
        """The statement ``build()`` makes, made once per ``key``."""
        stmt = self._stmts.get(key)
        if stmt is None:
            stmt = self._stmts[key] = build()
        # a key names one statement, always made by the same kind of builder: its type is ``_S``
        return cast(_S, stmt)

    @property
    def access_note(self) -> str | None:
        """Says how a reader sees a SQLite store when that is not plain read-only access: an
        immutable snapshot (no agent has it open, or it cannot be opened read-only here);
        ``None`` otherwise."""
        if sqlite_access(self.engine) != "immutable":
            return None
        file = sqlite_file(self.engine.url)
        wal = Path(f"{file}-wal") if file is not None else None
        if wal is not None and wal.exists() and wal.stat().st_size > 0:
            return f"read as an immutable snapshot (cannot open it read-only here); rows still in {wal} are not shown"
        return "read as an immutable snapshot (no agent has it open)"

    def _fail(self, exc: Exception) -> StoreUnavailableError:
        return unavailable(self.engine, exc)

    def _require_tables(self, conn: Connection) -> None:
        """Raise ``StoreUnavailableError`` when the database holds no vgpumon tables (an empty
        file, another application's database), so readers say that instead of "no such table"."""
        if not self.engine.dialect.has_table(conn, Host.__table__.name):
            raise StoreUnavailableError(f"{describe_store(self.engine)} holds no vgpumon data (no tables)")
        if self._schema_ok:
            return
        # an older schema than this vgpumon reads: say so, not "no such column" (a newer one is
        # read: its additions are left alone)
        from vgpumon.store.migrate import packaged_head, packaged_revisions

        head = packaged_head()
        current = None
        if self.engine.dialect.has_table(conn, "alembic_version"):
            current = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
        if head is not None and current != head and (current is None or current in packaged_revisions()):
            raise StoreUnavailableError(
                f"{describe_store(self.engine)} has schema revision {current or '(from before migrations)'}, older than "
                f"this vgpumon reads ({head}): run `vgpumon db upgrade --db URL` (an agent of this version upgrades it "
                "when it starts)"
            )
        self._schema_ok = True

    def init_schema(self) -> None:
        """Bring the schema to the newest revision (Alembic; under an advisory lock on Postgres).

        Raises:
            StoreUnavailableError: the database cannot be reached or a migration fails.
        """
        from vgpumon.store.migrate import at_head, upgrade

        if not at_head(self.engine):  # the common case costs one query, and no Alembic import
            upgrade(self.engine)

    def close(self) -> None:
        """Release pooled connections."""
        self.engine.dispose()

    # -- writes --------------------------------------------------------------------------------

    # -- reads ---------------------------------------------------------------------------------

    #: How far back raw rows are read for a newest value (``last_values``): the slow set reads
    #: every 10 ticks; an older value is taken from the rollups (which trail by minutes: a value
    #: read only in that gap is found in the rollups once they catch up).
    LAST_RAW_SECONDS = 120.0
    #: How far back the rollups are searched beyond that: a counter last read more than a week
    #: before the report's end is not "the current count"; searching further would scan months of
    #: a column the GPU never reports (SQLite cannot stop early on ``IS NOT NULL``).
    LAST_ROLLUP_SECONDS = 7 * 86400.0

