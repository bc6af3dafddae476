"""Schema migrations: one code path (Alembic) for SQLite and Postgres.

The revisions live in ``vgpumon/store/migrations`` inside the package and are found through
``importlib.resources``, so an installed wheel migrates its store without a checkout. The agent
runs ``upgrade`` at start; ``vgpumon db upgrade`` runs it on request.

Agents that start together never race in the migration: on Postgres the upgrade runs in one
transaction (Postgres DDL is transactional) that first takes a transaction-level advisory lock; on
SQLite a file lock beside the database (``<file>.migrate.lock``) serialises it. Exactly one
agent migrates; the others wait, then find the schema at head and do nothing.

Two stores are refused rather than changed: one whose revision this version does not know (a
newer vgpumon migrated it: rolling upgrades on a shared Postgres), and one that holds tables of
something else (vgpumon does not add its tables to another application's database).
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, cast

from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.exc import SQLAlchemyError

from vgpumon.base.errors import StoreUnavailableError
from vgpumon.base.files import PRIVATE_FILE_MODE, open_private
from vgpumon.store.engine import describe_store, sqlite_file, unavailable

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic (and Mako under it) is imported only when a schema has to change: a store already at
# the packaged head is recognised from its ``alembic_version`` row (``at_head``), which keeps
# ~50 modules and several MB out of every agent and report (docs/benchmarks.md, footprint).

log = logging.getLogger(__name__)

#: ``pg_advisory_xact_lock`` key of schema changes ("vgpumon" as the bytes of a bigint).
MIGRATION_LOCK_KEY = 0x7667_7075_6D6F_6E
#: The revision that holds the schema the store had before migrations existed (``create_all``).
BASELINE_REVISION = "0001"
#: How long an agent waits for another one's SQLite migration (seconds); they take well under one.
SQLITE_LOCK_TIMEOUT_S = 120.0


class SchemaTooNewError(StoreUnavailableError):
    """The store was migrated by a newer vgpumon: its revision is unknown to this version."""


class ForeignStoreError(StoreUnavailableError):
    """The database holds tables of something else; vgpumon does not add its tables to it."""


def _script_location() -> Path:
    return Path(str(resources.files("vgpumon.store") / "migrations"))


def alembic_config(connection: Connection | None = None) -> "Config":
    """An Alembic ``Config`` for the packaged revisions, bound to ``connection`` when given."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_script_location()))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The newest revision shipped with this version of vgpumon."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


_REVISION = re.compile(r'^revision(?:: *str)? *= *["\']([^"\']+)["\']', re.M)
_DOWN = re.compile(r'^down_revision(?:: *[^=]+)? *= *["\']([^"\']+)["\']', re.M)


@lru_cache(maxsize=1)
def packaged_revisions() -> frozenset[str]:
    """Every revision shipped with this version of vgpumon, read from the revision files
    without Alembic."""
    out = set()
    for path in (_script_location() / "versions").glob("*.py"):
        rev = _REVISION.search(path.read_text(encoding="utf-8"))
        if rev is not None:
            out.add(rev.group(1))
    return frozenset(out)


@lru_cache(maxsize=1)
def packaged_head() -> str | None:
    """The head revision read from the revision files' ``revision``/``down_revision`` lines,
    without Alembic: the one revision no other revises. ``None`` when that is not exactly one
    (a branch: only Alembic can say; ``tests/store/test_store.py`` checks this agrees with it)."""
    revisions: set[str] = set()
    revised: set[str] = set()
    for path in (_script_location() / "versions").glob("*.py"):
        source = path.read_text(encoding="utf-8")
        rev = _REVISION.search(source)
        if rev is None:
            continue
        revisions.add(rev.group(1))
        down = _DOWN.search(source)
        if down is not None:
            revised.add(down.group(1))
    heads = revisions - revised
    return heads.pop() if len(heads) == 1 else None


def at_head(engine: Engine) -> bool:
    """True when the store's ``alembic_version`` holds exactly the packaged head: nothing to
    migrate, and Alembic need not be imported. Any doubt (no table, no row, an error) is False:
    ``upgrade`` then decides, with its locks and refusals."""
    head = packaged_head()
    if head is None:
        return False
    reader = engine
    file = sqlite_file(engine.url) if engine.dialect.name == "sqlite" else None
    if file is not None:  # looked at read-only: the file may be another application's
        if not file.is_file() or file.stat().st_size == 0:
            return False
        from vgpumon.store.engine import make_engine

        reader = make_engine(str(file), read_only=True)
    try:
        with reader.connect() as conn:
            if not reader.dialect.has_table(conn, "alembic_version"):
                return False
            rows = conn.execute(text("SELECT version_num FROM alembic_version")).all()
    except SQLAlchemyError:
        return False
    finally:
        if reader is not engine:
            reader.dispose()
    return [r[0] for r in rows] == [head]


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at; ``None`` for an empty (or pre-migration) database.

    Raises:
        StoreUnavailableError: the database cannot be reached.
    """
    from alembic.runtime.migration import MigrationContext

    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    except SQLAlchemyError as exc:
        raise _fail(engine, exc) from None


def _fail(engine: Engine, exc: Exception) -> StoreUnavailableError:
    return unavailable(engine, exc)


def _known(revision: str) -> bool:
    from alembic.script import ScriptDirectory
    from alembic.util.exc import CommandError

    try:
        return ScriptDirectory.from_config(alembic_config()).get_revision(revision) is not None
    except CommandError:
        return False


@contextmanager
def _sqlite_migration_lock(engine: Engine) -> Iterator[None]:
    """Serialise migrations of one SQLite file across processes (no-op for other engines)."""
    file = sqlite_file(engine.url) if engine.dialect.name == "sqlite" else None
    if file is None:
        yield
        return
    from filelock import FileLock, Timeout

    path = f"{file}.migrate.lock"
    try:  # where the file cannot be made (a read-only or pseudo file system such as /proc), say so
        os.close(open_private(path, "a"))  # now: the lock would take every failure to open it for "held"
    except OSError as exc:
        raise unavailable(engine, f"cannot create {path}: {exc.strerror or exc}") from None
    lock = FileLock(path, timeout=SQLITE_LOCK_TIMEOUT_S, mode=PRIVATE_FILE_MODE)
    try:
        with lock:
            yield
    except Timeout:
        raise unavailable(engine, f"another vgpumon has been migrating it for over {SQLITE_LOCK_TIMEOUT_S:.0f} s ({lock.lock_file})") from None
    except OSError as exc:  # the lock file cannot be created: the directory is not writable
        raise unavailable(engine, f"cannot create {file}.migrate.lock: {exc.strerror or exc}") from None


def _refuse_foreign(engine: Engine, tables: set[str]) -> None:
    """Refuse a database whose tables are none of vgpumon's. Any one of ours (or Alembic's) makes
    it ours: another agent may be migrating it right now, and on SQLite each ``CREATE TABLE``
    of a migration is visible as it happens."""
    from vgpumon.store.schema import metadata

    if tables and not tables & (set(metadata.tables) | {"alembic_version"}):
        tables = tables - {"alembic_version"}
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise ForeignStoreError(
            f"store {describe_store(engine)} holds tables of something else ({shown}): "
            "vgpumon does not add its tables to it; give --db an empty database or a new file"
        )


def _look_before_writing(engine: Engine) -> None:
    """An existing SQLite file is first looked at read-only: the first read-write connection
    switches it to WAL (a change to its header) and the migration lock adds a file beside it, and
    neither may happen to another application's database."""
    file = sqlite_file(engine.url) if engine.dialect.name == "sqlite" else None
    if file is None or not file.is_file() or file.stat().st_size == 0:
        return
    from vgpumon.store.engine import make_engine

    reader = make_engine(str(file), read_only=True)
    try:
        with reader.connect() as conn:
            _refuse_foreign(engine, set(inspect(conn).get_table_names()))
    except SQLAlchemyError as exc:
        raise _fail(engine, exc) from None
    finally:
        reader.dispose()


@contextmanager
def _sqlite_foreign_keys_off(conn: Connection) -> Iterator[None]:
    """SQLite only: foreign keys off on ``conn`` while it migrates. A migration that rebuilds a
    referenced table (SQLite cannot ALTER most things: Alembic copies the table, drops the old
    one and renames the copy) would otherwise fail on the drop of a table that sample rows refer
    to ("FOREIGN KEY constraint failed", a store that holds data stuck at its revision). The
    references are checked after the migrations (``PRAGMA foreign_key_check``) and switched on
    again before the connection goes back to the pool. SQLite ignores the pragma inside a
    transaction: it is set before ``conn.begin()``."""
    if conn.dialect.name != "sqlite":
        yield
        return
    conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
    conn.commit()
    try:
        yield
    finally:
        conn.exec_driver_sql("PRAGMA foreign_keys=ON")
        conn.commit()


@contextmanager
def _sqlite_transactional_ddl(conn: Connection) -> Iterator[None]:
    """SQLite only: make the migration one transaction, DDL included. Python's ``sqlite3`` opens
    a transaction before INSERT/UPDATE/DELETE but not before CREATE or DROP, which so commit
    at once: a migration interrupted half-way (Ctrl-C during a first start) left tables without
    a recorded revision. Here the driver's own transaction handling is off and the migration
    begins with an explicit BEGIN; commit and rollback end it as usual."""
    if conn.dialect.name != "sqlite":
        yield
        return
    raw = cast(sqlite3.Connection, conn.connection.dbapi_connection)  # a SQLite engine's: the sqlite3 module's
    before = raw.isolation_level
    raw.isolation_level = None
    try:
        yield
    finally:
        raw.isolation_level = before


def upgrade(engine: Engine, revision: str = "head") -> tuple[str | None, str]:
    """Bring the schema to ``revision`` (idempotent; safe with many agents on one store).

    A database whose tables were created before migrations existed (``gpu_samples`` present, no
    ``alembic_version``) is stamped at the baseline revision first, then upgraded.

    Returns:
        ``(revision before, revision after)``; before is ``None`` for an empty database.

    Raises:
        SchemaTooNewError: a newer vgpumon migrated the store (its revision is unknown here).
        ForeignStoreError: the database holds tables of something else.
        StoreUnavailableError: the database cannot be reached or a migration fails.
    """
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    _look_before_writing(engine)
    try:
        with (_sqlite_migration_lock(engine), engine.connect() as conn, _sqlite_foreign_keys_off(conn),
              _sqlite_transactional_ddl(conn), conn.begin()):
            if conn.dialect.name == "sqlite":
                conn.exec_driver_sql("BEGIN IMMEDIATE")  # the whole migration, DDL included, or nothing
            if conn.dialect.name == "postgresql":
                # Held until this transaction ends: other agents wait here, then see head.
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            before = MigrationContext.configure(conn).get_current_revision()
            if before is not None and not _known(before):
                raise SchemaTooNewError(
                    f"store {describe_store(engine)} has schema revision {before}, newer than this "
                    f"vgpumon knows (its newest is {head_revision()}): upgrade vgpumon here, or use another store"
                )
            cfg = alembic_config(conn)
            if before is None:
                tables = set(inspect(conn).get_table_names())
                _refuse_foreign(engine, tables)
                if "gpu_samples" in tables:
                    log.warning("store has tables but no migration history: stamping revision %s", BASELINE_REVISION)
                    command.stamp(cfg, BASELINE_REVISION)
            command.upgrade(cfg, revision)
            after = MigrationContext.configure(conn).get_current_revision()
            if conn.dialect.name == "sqlite":
                broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                if broken:  # rolled back: the store stays at its old revision
                    raise StoreUnavailableError(
                        f"store {describe_store(engine)}: upgrading to {after} would leave {len(broken)} rows "
                        f"referring to missing rows (first: table {broken[0][0]}); nothing was changed"
                    )
    except SQLAlchemyError as exc:
        raise _fail(engine, exc) from None
    if before != after:
        log.info("store schema upgraded from %s to %s", before or "empty", after)
    return before, after or ""
