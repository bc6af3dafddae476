"""Alembic environment of the vgpumon store.

Run through ``vgpumon.store.migrate`` (``vgpumon db upgrade``, the agent at start), which hands in
an open connection (``config.attributes["connection"]``) inside a transaction that already holds
the Postgres advisory lock. The ``alembic`` command line works too, for writing new revisions:
``alembic -c vgpumon/store/migrations/alembic.ini -x url=sqlite:///dev.db revision --autogenerate``.
"""

from __future__ import annotations

from typing import Literal

from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy import Connection, TypeDecorator

from vgpumon.store.engine import make_engine
from vgpumon.store.schema import metadata

config = context.config
target_metadata = metadata


def render_item(type_: str, obj: object, autogen_context: AutogenContext) -> str | Literal[False]:
    """Render our fixed-point ``TypeDecorator``s as their integer column type, so that revisions
    never import ``vgpumon.store.schema`` (a revision must keep working after the models change).

    ``obj`` is whatever Alembic renders (a type, a constraint, an index…): opaque until checked."""
    if type_ == "type" and isinstance(obj, TypeDecorator):
        impl = obj.impl_instance if hasattr(obj, "impl_instance") else obj.impl
        return f"sa.{type(impl).__name__}()"
    return False


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things: batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        render_item=render_item,
        compare_type=True,
    )


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("give the store URL: alembic -x url=sqlite:///dev.db ...")
    engine = make_engine(url)
    with engine.begin() as conn:
        _configure(conn)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run `vgpumon db upgrade`")
run_migrations_online()
