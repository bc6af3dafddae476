"""The agent's writes: GPU rows, rollups, a tick's other rows (the host row upserted once per
batch), the PCIe topology; partitions on Postgres."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, cast

from sqlalchemy import Connection, and_, select
from sqlalchemy.exc import SQLAlchemyError

from vgpumon.store import partitions
from vgpumon.store.codec import GPU_ROW_COLUMNS, ROLLUP_ROW_COLUMNS, TS, GpuRow, RollupRow, StoredValue
from vgpumon.store.core import StoreBase
from vgpumon.store.schema import (
    TIME_TABLES,
    PcieLink,
    Process,
)
from vgpumon.store.tables import (
    _PROCESS_KEYS,
    EXTRA_TABLES,
    ExtraRow,
    TickRows,
    inserted_id,
    store_unavailable,
)

if TYPE_CHECKING:
    from vgpumon.model import PcieHop


class Writes(StoreBase):
    """The writes (a part of ``Store``; the agent's store thread is the only writer)."""

    def ensure_partitions(self, conn: Connection, table: str, days: Iterable[int]) -> None:
        """Create the day partitions ``table`` needs for ``days`` (epoch ms) on Postgres; no-op on
        SQLite. Known partitions are cached, so calling this per batch costs nothing."""
        if self.dialect != "postgresql":
            return
        missing = {d for d in days if (table, d) not in self._partitions}
        if missing:
            partitions.ensure(conn, table, missing)
            conn.commit()  # DDL out of the way of the batch: a failed batch must not undo it
            self._partitions.update((table, d) for d in missing)

    def forget_partitions(self) -> None:
        """Drop the partition cache (after retention dropped some)."""
        self._partitions.clear()

    def _copy_insert(self, conn: Connection, table: str, columns: Sequence[str], rows: Sequence[tuple[StoredValue, ...]]) -> int:
        """Postgres: ``COPY`` the batch straight into ``table``; if some rows are already stored
        (a replayed spool file, a capture replayed twice) COPY fails on the primary key, and the
        batch goes again through a session-local staging table and ``INSERT ... SELECT ... ON
        CONFLICT DO NOTHING``. The common case thus runs at the driver's COPY rate
        (docs/benchmarks.md); duplicates cost one extra round."""
        import psycopg

        cols = ", ".join(f'"{c}"' for c in columns)
        raw = conn.connection.driver_connection
        if not conn.in_transaction():
            conn.begin()  # COPY runs on the driver connection: let SQLAlchemy own the commit
        try:
            with raw.cursor() as cur:  # type: ignore[union-attr]
                with cur.copy(f'COPY "{table}" ({cols}) FROM STDIN') as copy:
                    for r in rows:
                        copy.write_row(r)
            return len(rows)
        except psycopg.errors.UniqueViolation:
            conn.rollback()
            conn.begin()
        stage = f"_stage_{table}"
        conn.exec_driver_sql(
            f'CREATE TEMP TABLE IF NOT EXISTS "{stage}" (LIKE "{table}" INCLUDING DEFAULTS) ON COMMIT DELETE ROWS'
        )
        with raw.cursor() as cur:  # type: ignore[union-attr]
            with cur.copy(f'COPY "{stage}" ({cols}) FROM STDIN') as copy:
                for r in rows:
                    copy.write_row(r)
        return conn.exec_driver_sql(
            f'INSERT INTO "{table}" ({cols}) SELECT {cols} FROM "{stage}" ON CONFLICT DO NOTHING'  # noqa: S608  identifiers come from the schema, never from input; values are bound parameters
        ).rowcount

    def _insert_rows(self, table: str, columns: Sequence[str], rows: Sequence[tuple[StoredValue, ...]]) -> int:
        """Insert rows, skipping those already stored; returns how many were inserted."""
        dbapi_error = self.engine.dialect.loaded_dbapi.Error
        try:
            with self.engine.connect() as conn:
                self.ensure_partitions(conn, table, {partitions.day_of(r[TS]) for r in rows})
                if self.dialect == "postgresql":
                    try:
                        inserted = self._copy_insert(conn, table, columns, rows)
                    except dbapi_error as exc:
                        # COPY runs on the driver connection, outside SQLAlchemy's error
                        # handling: a server that went away mid-COPY leaves a dead connection
                        # that must not go back to the pool (nor may one left mid-transaction
                        # by a row the server refused).
                        conn.invalidate()
                        if store_unavailable(exc):
                            raise self._fail(exc) from None
                        raise
                else:
                    marks = ", ".join("?" for _ in columns)
                    cols = ", ".join(f'"{c}"' for c in columns)
                    # sqlite3 sums the changes of an executemany: the rows inserted
                    inserted = conn.exec_driver_sql(
                        f'INSERT INTO "{table}" ({cols}) VALUES ({marks}) ON CONFLICT DO NOTHING', list(rows)  # noqa: S608  identifiers come from the schema, never from input; values are bound parameters
                    ).rowcount
                conn.commit()
                return max(inserted, 0)
        except SQLAlchemyError as exc:
            if store_unavailable(exc):
                raise self._fail(exc) from None
            raise

    def write_gpu_rows(self, rows: Sequence[GpuRow]) -> int:
        """Write stored ``gpu_samples`` rows (``codec.GPU_ROW_COLUMNS`` order) in one transaction;
        rows already stored are skipped, so a batch written twice is stored once.

        Returns:
            The rows inserted (the others were stored already: a replayed spool, a capture
            replayed twice).

        Raises:
            StoreUnavailableError: the database is unreachable, locked, full, ...; nothing of the
                batch is stored then.
            Exception: the driver's own error (SQLAlchemy ``IntegrityError``/``DataError``,
                ``OverflowError`` from sqlite3, ...) when the store refuses a row for what it
                holds (``store_unavailable`` is false for it); nothing of the batch is stored.
        """
        return self._insert_rows("gpu_samples", GPU_ROW_COLUMNS, rows) if rows else 0

    def write_rollup_rows(self, rows: Sequence[RollupRow]) -> None:
        """Write ``gpu_samples_1m`` rows (``codec.ROLLUP_ROW_COLUMNS`` order), skipping minutes
        already summarised. Raises ``StoreUnavailableError`` like ``write_gpu_rows``."""
        if rows:
            self._insert_rows("gpu_samples_1m", ROLLUP_ROW_COLUMNS, rows)

    def write_extra_rows(self, ticks: Sequence[TickRows]) -> None:
        """Write the non-GPU rows of whole ticks (``EXTRA_TABLES``: host samples, XID events, GPU
        process samples, rejected values, host events) in one transaction; rows already stored are skipped.

        ``gpu_process_samples`` rows also carry the process identity (``host_id`` and
        ``_PROCESS_KEYS``): the ``processes`` row is created on first sight and referenced by id.

        Raises:
            StoreUnavailableError: the database is unreachable; nothing of the batch is stored.
            Exception: the driver's own error when the store refuses a row for what it holds,
                as in ``write_gpu_rows``; nothing of the batch is stored.
        """
        merged: dict[str, list[ExtraRow]] = {t: [] for t in EXTRA_TABLES}
        for tick in ticks:
            for table, rows in tick.items():
                if table in merged:
                    merged[table].extend(cast("list[ExtraRow]", rows))  # the tables of EXTRA_TABLES hold dict rows
        if not any(merged.values()):
            return
        try:
            with self.engine.connect() as conn:
                for table in EXTRA_TABLES:
                    if merged[table] and table in TIME_TABLES:
                        self.ensure_partitions(conn, table, {partitions.day_of(int(round(r["ts"] * 1000))) for r in merged[table]})
                if merged["gpu_process_samples"]:
                    merged["gpu_process_samples"] = [self._with_process_id(conn, r) for r in merged["gpu_process_samples"]]
                for table in EXTRA_TABLES:
                    if merged[table]:
                        conn.execute(self._extra_inserts[table], merged[table])
                conn.commit()
        except Exception as exc:
            self._process_ids.clear()  # ids inserted by a rolled-back transaction are void
            if isinstance(exc, SQLAlchemyError) and store_unavailable(exc):
                raise self._fail(exc) from None
            raise

    def _with_process_id(self, conn: Connection, row: ExtraRow) -> ExtraRow:
        key = (row["host_id"], row["pid"], row["start_time"])
        pid = self._process_ids.get(key)
        if pid is None:
            t = Process.__table__
            cond = [t.c.host_id == row["host_id"], t.c.pid == row["pid"]]
            cond.append(t.c.start_time.is_(None) if row["start_time"] is None else t.c.start_time == row["start_time"])
            pid = conn.scalar(select(t.c.id).where(and_(*cond)))
            if pid is None:
                values = {k: row[k] for k in _PROCESS_KEYS}
                pid = inserted_id(conn.execute(t.insert().values(host_id=row["host_id"], **values)).inserted_primary_key)
            self._process_ids[key] = pid
        return {
            "gpu_id": row["gpu_id"],
            "ts": row["ts"],
            "process_id": pid,
            "used_gpu_memory_bytes": row["used_gpu_memory_bytes"],
            "rss_bytes": row["rss_bytes"],
            "cpu_seconds_total": row["cpu_seconds_total"],
        }

    def replace_topology(self, host_id: int, hops: Sequence[PcieHop], gpu_ids: dict[str, int], observed_at: float) -> None:
        """Replace a host's stored PCIe tree with ``hops`` (``PcieHop``s) in one transaction."""
        t = PcieLink.__table__
        rows = [
            {
                "host_id": host_id, "bdf": h.bdf, "parent_bdf": h.parent_bdf, "kind": h.kind,
                "gpu_id": gpu_ids.get(h.uuid) if h.uuid else None,
                "link_gen_current": h.link_gen_current, "link_width_current": h.link_width_current,
                "link_gen_max": h.link_gen_max, "link_width_max": h.link_width_max, "observed_at": observed_at,
            }
            for h in hops
        ]
        try:
            with self.engine.begin() as conn:
                conn.execute(t.delete().where(t.c.host_id == host_id))
                if rows:
                    conn.execute(t.insert(), rows)
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
