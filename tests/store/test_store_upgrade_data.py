"""A SQLite store that holds data upgrades across a migration that rebuilds a referenced table.

Revision 0009 changes ``gpus``' constraints; SQLite cannot ALTER them, so Alembic copies the
table and drops the old one, which every sample row refers to: with foreign keys on, that drop
failed ("FOREIGN KEY constraint failed", exit 69) and a store written by an older vgpumon could
not be upgraded at all, by ``vgpumon db upgrade`` or by the agent's start.
"""

from __future__ import annotations

import subprocess
import sys

from vgpumon.store import migrate
from vgpumon.store.engine import make_engine


def test_a_sqlite_store_with_samples_at_0008_upgrades_to_head_and_keeps_them(tmp_path):
    db = tmp_path / "old.db"
    engine = make_engine(f"sqlite:///{db}")
    assert migrate.upgrade(engine, "0008") == (None, "0008")
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO hosts (id, hostname, first_seen) VALUES (1, 'h', '2026-01-01 00:00:00')")
        conn.exec_driver_sql(
            'INSERT INTO gpus (id, uuid, host_id, "index", gpm_supported, first_seen, last_seen) '
            "VALUES (1, 'GPU-1', 1, 0, 1, '2026-01-01 00:00:00', '2026-01-01 00:00:00')"
        )
        conn.exec_driver_sql("INSERT INTO gpu_samples (gpu_id, ts, up) VALUES (1, 1000, 1), (1, 2000, 1)")
    engine.dispose()
    out = subprocess.run([sys.executable, "-m", "vgpumon", "db", "upgrade", "--db", f"sqlite:///{db}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    engine = make_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == migrate.head_revision()
        assert conn.exec_driver_sql("SELECT count(*) FROM gpu_samples").scalar() == 2
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1  # back on for the pool's connection
        assert conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall() == []
    engine.dispose()


def test_readers_of_a_store_at_an_older_revision_say_to_upgrade_it(tmp_path):
    """``diagnose --db`` and ``db stats`` on a store an older vgpumon wrote: one line naming its
    revision and the command that upgrades it, not the SQL error of a missing column."""
    db = tmp_path / "old.db"
    engine = make_engine(f"sqlite:///{db}")
    migrate.upgrade(engine, "0008")
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO hosts (id, hostname, first_seen) VALUES (1, 'h', '2026-01-01 00:00:00')")
    engine.dispose()
    for args, code in ((["diagnose", "h", "--db", str(db)], 3), (["db", "stats", "--db", str(db)], 69)):
        out = subprocess.run([sys.executable, "-m", "vgpumon", *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == code, out.stderr
        said = out.stdout if args[0] == "diagnose" else out.stderr  # diagnose: its UNKNOWN report's first line
        assert "schema revision 0008, older than this vgpumon reads" in said
        assert "vgpumon db upgrade" in said and "no such" not in out.stderr + out.stdout


def test_a_first_migration_interrupted_half_way_leaves_an_empty_store(tmp_path, monkeypatch):
    """Ctrl-C during an agent's first start, while its store is being created: SQLite committed
    each CREATE TABLE at once, and the store was left with tables and no recorded revision
    ("from before migrations", and `db upgrade` then said it "was empty"). The migration is one
    transaction: nothing of it stays, and the next start creates the store whole."""
    from alembic import command
    from sqlalchemy import inspect

    engine = make_engine(f"sqlite:///{tmp_path / 'first.db'}")
    real = command.upgrade

    def interrupted(cfg, revision):
        real(cfg, "0003")  # a few revisions in: tables exist inside the transaction
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "upgrade", interrupted)
    try:
        migrate.upgrade(engine)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the migration was not interrupted")
    assert inspect(engine).get_table_names() == []
    monkeypatch.setattr(command, "upgrade", real)
    assert migrate.upgrade(engine) == (None, migrate.head_revision())
    engine.dispose()
