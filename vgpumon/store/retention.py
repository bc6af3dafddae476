"""Retention and rollups: raw rows for a window (default 72 h), 1-minute rollups for longer
(default 90 days), done in small steps so that the agent's writes never wait long.

``Retention.step()`` does a bounded amount of work and says whether more is left:

1. creates the day partitions of today and the next two days ahead (Postgres);
2. rolls up, per GPU, at most ``max_minutes`` complete minutes past its watermark
   (``rollup_watermarks``) into ``gpu_samples_1m``;
3. prunes raw rows older than the raw window — but never rows not yet rolled up — and rollups
   older than the rollup window: whole day partitions on Postgres, at most ``max_delete_rows``
   rows per table on SQLite.

A minute is complete when the GPU has a raw row after it (the agent writes in time order, spool
replays included). The newest minute of a GPU that stopped reporting is closed ``stale_after``
later: for a GPU of the running agent (``active_gpus``) "later" is measured on the data of the
agent's other GPUs (a replayed capture or a spool replay runs in the data's time, not the wall
clock's); for any other GPU, on the wall clock.

An agent (``host_id`` set) maintains its own host only: it rolls up and prunes the rows of its own
GPUs, vLLM servers and host, so its cost on a shared store is the same in a fleet of 10 hosts as
of 5 000. What is the store's as a whole runs as one statement each, whoever runs it: the
expired day partitions on Postgres (dropped by whichever agent takes the DDL lock first, and only
once every GPU of the store has rolled those days up, which one query says) and the age-based
deletes. ``vgpumon db prune`` (no ``host_id``) maintains every host of the store.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from sqlalchemy import Connection, text
from sqlalchemy.exc import SQLAlchemyError

from vgpumon.store import partitions
from vgpumon.store.codec import GPU_ROW_COLUMNS, ROLLUP_ROW_COLUMNS
from vgpumon.store.repository import Store
from vgpumon.store.rollup import MINUTE_MS, minute_of, rollup_rows
from vgpumon.store.schema import TIME_TABLES, metadata

DEFAULT_RAW_RETENTION_S = 72 * 3600.0
DEFAULT_ROLLUP_RETENTION_S = 90 * 86400.0
_COLS = ", ".join(f'"{c}"' for c in GPU_ROW_COLUMNS)
_ROLLUP_INSERT = "INSERT INTO gpu_samples_1m ({}) VALUES ({}) ON CONFLICT DO NOTHING".format(  # noqa: S608  identifiers come from the schema, never from input; values are bound parameters
    ", ".join(f'"{c}"' for c in ROLLUP_ROW_COLUMNS), ", ".join(f":c{i}" for i in range(len(ROLLUP_ROW_COLUMNS)))
)


@dataclass
class StepResult:
    """What one ``Retention.step`` did."""

    minutes_rolled_up: int = 0
    rows_deleted: int = 0
    partitions_dropped: list[str] = field(default_factory=list)
    partitions_created: list[str] = field(default_factory=list)
    more: bool = False  # work was left for the next step


class Retention:
    """Rollup and prune job over a ``Store``.

    Args:
        store: the store.
        raw_retention_s: seconds of raw rows kept (at least; on Postgres up to one day more,
            since whole day partitions are dropped).
        rollup_retention_s: seconds of 1-minute rollups kept.
        max_minutes: minutes rolled up per GPU per step.
        max_delete_rows: rows deleted per table per step (SQLite).
        stale_after: seconds after which the newest minute of a silent GPU is rolled up anyway.
        active_gpus: ``gpus.id`` of the GPUs the calling agent is writing (see module docstring);
            the agent sets it after registering its GPUs.
        host_id: ``hosts.id`` of the calling agent's host: only its rows are rolled up and pruned
            (None: every host's, as ``vgpumon db prune`` does). The agent sets it with
            ``active_gpus``.
        clock: wall clock, epoch seconds (``time.time``).
    """

    def __init__(
        self,
        store: Store,
        *,
        raw_retention_s: float = DEFAULT_RAW_RETENTION_S,
        rollup_retention_s: float = DEFAULT_ROLLUP_RETENTION_S,
        max_minutes: int = 10,
        max_delete_rows: int = 20_000,
        stale_after: float = 600.0,
        clock: Callable[[], float] = time.time,
        active_gpus: set[int] | None = None,
        host_id: int | None = None,
    ) -> None:
        if rollup_retention_s < raw_retention_s:
            raise ValueError("rollups must be kept at least as long as raw rows")
        self.store = store
        self.raw_retention_ms = int(raw_retention_s * 1000)
        self.rollup_retention_ms = int(rollup_retention_s * 1000)
        self.max_minutes = max_minutes
        self.max_delete_rows = max_delete_rows
        self.stale_after_ms = int(stale_after * 1000)
        self.clock = clock
        self.active_gpus: set[int] = set(active_gpus or ())
        self.host_id = host_id

    def step(self) -> StepResult:
        """Do one bounded step of partition upkeep, rollups and pruning.

        Raises:
            StoreUnavailableError: the database cannot be reached.
        """
        res = StepResult()
        now = int(self.clock() * 1000)
        try:
            with self.store.engine.connect() as conn:
                if conn.dialect.name == "postgresql":
                    today = partitions.day_of(now)
                    for table in TIME_TABLES:
                        res.partitions_created += partitions.ensure(
                            conn, table, [today + k * partitions.DAY_MS for k in range(3)]
                        )
                    conn.commit()
                active_newest = None
                if self.active_gpus:
                    active_newest = conn.scalar(
                        text("SELECT max(ts) FROM gpu_samples WHERE gpu_id IN ({})".format(",".join(str(int(g)) for g in self.active_gpus)))  # noqa: S608  identifiers come from the schema, never from input; values are bound parameters
                    )
                for gpu_id in self._owners(conn, "gpus"):
                    n, more = self._rollup_gpu(conn, gpu_id, now, active_newest)
                    res.minutes_rolled_up += n
                    res.more |= more
                    conn.commit()
                self._prune(conn, now, res)
                conn.commit()
        except SQLAlchemyError as exc:
            raise self.store._fail(exc) from None
        if res.partitions_dropped:
            self.store.forget_partitions()
        return res

    def run(self, max_steps: int = 1_000_000) -> StepResult:
        """Step until no work is left (``vgpumon db prune``); returns the summed result."""
        total = StepResult()
        for _ in range(max_steps):
            r = self.step()
            total.minutes_rolled_up += r.minutes_rolled_up
            total.rows_deleted += r.rows_deleted
            total.partitions_dropped += r.partitions_dropped
            total.partitions_created += r.partitions_created
            if not r.more:
                break
        return total

    def _owners(self, conn: Connection, table: str) -> list[int]:
        """The ids in ``table`` (``hosts``, ``gpus`` or a vLLM instance table) this job maintains:
        those of its own host, or every one."""
        if self.host_id is None:
            return [int(i) for i in conn.scalars(text(f'SELECT id FROM "{table}" ORDER BY id')).all()]  # noqa: S608  identifiers come from the schema, never from input; values are bound parameters
        if table == "hosts":
            return [self.host_id]
        return [
            int(i) for i in conn.scalars(
                text(f'SELECT id FROM "{table}" WHERE host_id = :h ORDER BY id'), {"h": self.host_id}  # noqa: S608  identifiers come from the schema, never from input; values are bound parameters
            ).all()
        ]

    # -- rollups -------------------------------------------------------------------------------

    def _rollup_gpu(self, conn: Connection, gpu_id: int, now: int, active_newest: int | None) -> tuple[int, bool]:
        wm = conn.scalar(text("SELECT rolled_until FROM rollup_watermarks WHERE gpu_id = :g"), {"g": gpu_id})
        newest = conn.scalar(text("SELECT max(ts) FROM gpu_samples WHERE gpu_id = :g"), {"g": gpu_id})
        if newest is None:
            return 0, False
        if wm is None:
            oldest = conn.scalar(text("SELECT min(ts) FROM gpu_samples WHERE gpu_id = :g"), {"g": gpu_id})
            wm = minute_of(int(oldest))
        newest = int(newest)
        complete_until = minute_of(newest)  # minutes before the newest row's are complete
        # a silent GPU: close its last minute (measured in data time for the agent's own GPUs)
        reference = (active_newest or 0) if gpu_id in self.active_gpus else now
        if minute_of(newest) + MINUTE_MS + self.stale_after_ms <= reference:
            complete_until = minute_of(newest) + MINUTE_MS
        if complete_until <= wm:
            return 0, False
        until = min(complete_until, wm + self.max_minutes * MINUTE_MS)
        rows = conn.execute(
            text(f"SELECT {_COLS} FROM gpu_samples WHERE gpu_id = :g AND ts >= :a AND ts < :b ORDER BY ts"),  # noqa: S608  identifiers come from the schema, never from input; values are bound parameters
            {"g": gpu_id, "a": wm, "b": until},
        ).all()
        summary = rollup_rows([tuple(r) for r in rows])
        if summary:
            self.store.ensure_partitions(conn, "gpu_samples_1m", {partitions.day_of(r[1]) for r in summary})
            conn.execute(text(_ROLLUP_INSERT), [{f"c{i}": v for i, v in enumerate(r)} for r in summary])
        updated = conn.execute(
            text("UPDATE rollup_watermarks SET rolled_until = :u WHERE gpu_id = :g"), {"u": until, "g": gpu_id}
        ).rowcount
        if not updated:
            conn.execute(text("INSERT INTO rollup_watermarks (gpu_id, rolled_until) VALUES (:g, :u)"), {"g": gpu_id, "u": until})
        return len(summary), until < complete_until

    # -- pruning -------------------------------------------------------------------------------

    def _raw_safe_until(self, conn: Connection, cutoff: int, gpu_ids: list[int] | None) -> int:
        """Newest time before which the raw rows of ``gpu_ids`` (None: every GPU of the store) are
        rolled up, capped at ``cutoff``: one statement, whatever the number of GPUs (a GPU with no
        watermark holds back at its oldest row, one with rows past its watermark at the watermark)."""
        only = "" if gpu_ids is None else "WHERE g.id IN ({})".format(",".join(str(int(g)) for g in gpu_ids) or "NULL")
        held = conn.scalar(text(
            "SELECT min(CASE WHEN w.rolled_until IS NULL THEN (SELECT min(s.ts) FROM gpu_samples s WHERE s.gpu_id = g.id) "  # noqa: S608  identifiers come from the schema, never from input; values are bound parameters
            "WHEN EXISTS (SELECT 1 FROM gpu_samples s WHERE s.gpu_id = g.id AND s.ts >= w.rolled_until) THEN w.rolled_until END) "
            f"FROM gpus g LEFT JOIN rollup_watermarks w ON w.gpu_id = g.id {only}"
        ))
        return cutoff if held is None else min(cutoff, int(held))

    def _prune(self, conn: Connection, now: int, res: StepResult) -> None:
        raw_cutoff = now - self.raw_retention_ms
        # the agent's own host only: a constant clause, the values bound
        own = "" if self.host_id is None else " AND host_id = :h"
        args = {"u": now - self.rollup_retention_ms, "h": self.host_id}
        # Host events explain steps and gaps in long trends: they live as long as the rollups. So do
        # resolved alert episodes (diagnose's and capacity's history); open ones stay whatever their age.
        for delete in ("DELETE FROM host_events WHERE ts < :u", "DELETE FROM alerts WHERE resolved_at IS NOT NULL AND resolved_at < :u"):
            res.rows_deleted += max(conn.execute(text(delete + own), args).rowcount, 0)
        conn.commit()
        if conn.dialect.name == "postgresql":
            self._drop_partitions(conn, now, raw_cutoff, res)
            return
        gpu_ids = None if self.host_id is None else self._owners(conn, "gpus")
        targets = [("gpu_samples", self._raw_safe_until(conn, raw_cutoff, gpu_ids))]
        targets += [(t, raw_cutoff) for t in TIME_TABLES if t not in {"gpu_samples", "gpu_samples_1m"}]
        targets.append(("gpu_samples_1m", now - self.rollup_retention_ms))
        for table, until in targets:
            key = TIME_TABLES[table]
            (fk,) = metadata.tables[table].c[key].foreign_keys
            for owner in self._owners(conn, fk.column.table.name):
                # the ts of the max_delete_rows-th oldest row bounds this step's delete (PK seek)
                bound = conn.scalar(
                    text(f'SELECT ts FROM "{table}" WHERE {key} = :k AND ts < :u ORDER BY ts LIMIT 1 OFFSET :n'),  # noqa: S608  identifiers come from the schema, never from input; values are bound parameters
                    {"k": owner, "u": until, "n": self.max_delete_rows},
                )
                limit = until if bound is None else int(bound)
                n = conn.execute(text(f'DELETE FROM "{table}" WHERE {key} = :k AND ts < :u'), {"k": owner, "u": limit}).rowcount  # noqa: S608  identifiers come from the schema, never from input; values are bound parameters
                res.rows_deleted += max(n, 0)
                res.more |= bound is not None
                conn.commit()

    def _drop_partitions(self, conn: Connection, now: int, raw_cutoff: int, res: StepResult) -> None:
        """Drop the expired day partitions (Postgres): the store's as a whole, so the raw ones go
        only once every GPU of the store has rolled them up. A GPU that holds them back and has
        stopped reporting (a host gone for good) is rolled up here, by whichever agent finds it,
        a few minutes per step, so a dead host never blocks the drops."""
        targets = [(t, raw_cutoff) for t in TIME_TABLES if t != "gpu_samples_1m"]
        targets.append(("gpu_samples_1m", now - self.rollup_retention_ms))
        for table, until in targets:
            expired = [upper for _, _, upper in partitions.list_partitions(conn, table) if upper <= until]
            if not expired:
                continue
            if table == "gpu_samples":
                until = self._raw_safe_until(conn, min(until, max(expired)), None)
                if until < min(expired):
                    if self.host_id is not None:  # (db prune has rolled up every GPU already)
                        self._roll_up_held_back(conn, now, min(expired), res)
                    continue
            dropped = partitions.drop_before(conn, table, until, limit=2)
            res.partitions_dropped += dropped
            res.more |= len(dropped) == 2
            conn.commit()

    def _roll_up_held_back(self, conn: Connection, now: int, until: int, res: StepResult) -> None:
        """Roll up (up to 16 per step) the GPUs of other hosts whose raw rows before ``until`` are
        not rolled up yet and which have reported nothing for ``stale_after``."""
        held = conn.execute(text(
            "SELECT g.id FROM gpus g LEFT JOIN rollup_watermarks w ON w.gpu_id = g.id WHERE g.host_id <> :h "
            "AND EXISTS (SELECT 1 FROM gpu_samples s WHERE s.gpu_id = g.id AND s.ts < :u "
            "AND s.ts >= coalesce(w.rolled_until, s.ts)) "
            "AND (SELECT max(s.ts) FROM gpu_samples s WHERE s.gpu_id = g.id) < :silent ORDER BY g.id LIMIT 16"
        ), {"u": until, "h": self.host_id, "silent": now - MINUTE_MS - self.stale_after_ms}).scalars().all()
        for gpu_id in held:
            n, more = self._rollup_gpu(conn, int(gpu_id), now, None)
            res.minutes_rolled_up += n
            res.more |= more or n > 0
            conn.commit()
