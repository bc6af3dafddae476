"""Schema migrations: one code path (Alembic) for SQLite and Postgres.

The revisions live in ``vgpumon/store/migrations`` inside the package and are found through
``importlib.resources``, so an installed wheel migrates its store without a checkout. The agent
runs ``upgrade`` at start; ``vgpumon db upgrade`` runs it on request.

On Postgres many agents share one database and may start together: the upgrade runs in one
transaction (Postgres DDL is transactional) that first takes a transaction-level advisory lock, so
exactly one agent migrates and the others wait, then find the schema at head and do nothing.
"""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import SQLAlchemyError

from vgpumon.errors import StoreUnavailableError

log = logging.getLogger(__name__)

#: ``pg_advisory_xact_lock`` key of schema changes ("vgpumon" as the bytes of a bigint).
MIGRATION_LOCK_KEY = 0x7667_7075_6D6F_6E
#: The revision that holds the schema the store had before migrations existed (``create_all``).
BASELINE_REVISION = "0001"


def _script_location() -> Path:
    return Path(str(resources.files("vgpumon.store") / "migrations"))


def alembic_config(connection: Any | None = None) -> Config:
    """An Alembic ``Config`` for the packaged revisions, bound to ``connection`` when given."""
    cfg = Config()
    cfg.set_main_option("script_location", str(_script_location()))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The newest revision shipped with this version of vgpumon."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at; ``None`` for an empty (or pre-migration) database.

    Raises:
        StoreUnavailableError: the database cannot be reached.
    """
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    except SQLAlchemyError as exc:
        raise _fail(engine, exc) from None


def _fail(engine: Engine, exc: Exception) -> StoreUnavailableError:
    url = engine.url.render_as_string(hide_password=True)
    detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
    return StoreUnavailableError(f"store {url} unavailable: {detail}")


def upgrade(engine: Engine, revision: str = "head") -> tuple[str | None, str]:
    """Bring the schema to ``revision`` (idempotent; safe with many agents on one Postgres).

    A database whose tables were created before migrations existed (``gpu_samples`` present, no
    ``alembic_version``) is stamped at the baseline revision first, then upgraded.

    Returns:
        ``(revision before, revision after)``; before is ``None`` for an empty database.

    Raises:
        StoreUnavailableError: the database cannot be reached or a migration fails.
    """
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                # Held until this transaction ends: other agents wait here, then see head.
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            before = MigrationContext.configure(conn).get_current_revision()
            cfg = alembic_config(conn)
            if before is None and inspect(conn).has_table("gpu_samples"):
                log.warning("store has tables but no migration history: stamping revision %s", BASELINE_REVISION)
                command.stamp(cfg, BASELINE_REVISION)
            command.upgrade(cfg, revision)
            after = MigrationContext.configure(conn).get_current_revision()
    except SQLAlchemyError as exc:
        raise _fail(engine, exc) from None
    if before != after:
        log.info("store schema upgraded from %s to %s", before or "empty", after)
    return before, after or ""
