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
                for gpu_id in conn.scalars(text("SELECT id FROM gpus ORDER BY id")).all():
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

    def _raw_safe_until(self, conn: Connection, cutoff: int) -> int:
        """Newest time before which every GPU's raw rows are rolled up, capped at ``cutoff``."""
        safe = cutoff
        for gpu_id, wm in conn.execute(
            text("SELECT g.id, w.rolled_until FROM gpus g LEFT JOIN rollup_watermarks w ON w.gpu_id = g.id")
        ).all():
            if wm is None:
                oldest = conn.scalar(text("SELECT min(ts) FROM gpu_samples WHERE gpu_id = :g"), {"g": gpu_id})
                if oldest is not None:
                    safe = min(safe, int(oldest))
            elif conn.scalar(text("SELECT 1 FROM gpu_samples WHERE gpu_id = :g AND ts >= :w LIMIT 1"), {"g": gpu_id, "w": wm}):
                safe = min(safe, int(wm))  # rows past the watermark wait for their rollup
        return safe

    def _prune(self, conn: Connection, now: int, res: StepResult) -> None:
        raw_cutoff = now - self.raw_retention_ms
        targets = [("gpu_samples", self._raw_safe_until(conn, raw_cutoff))]
        targets += [(t, raw_cutoff) for t in TIME_TABLES if t not in {"gpu_samples", "gpu_samples_1m"}]
        targets.append(("gpu_samples_1m", now - self.rollup_retention_ms))
        # Host events explain steps and gaps in long trends: they live as long as the rollups.
        res.rows_deleted += max(
            conn.execute(text("DELETE FROM host_events WHERE ts < :u"), {"u": now - self.rollup_retention_ms}).rowcount, 0
        )
        # So do resolved alert episodes (diagnose's and capacity's history); open ones stay whatever their age.
        res.rows_deleted += max(
            conn.execute(
                text("DELETE FROM alerts WHERE resolved_at IS NOT NULL AND resolved_at < :u"), {"u": now - self.rollup_retention_ms}
            ).rowcount, 0,
        )
        conn.commit()
        for table, until in targets:
            if conn.dialect.name == "postgresql":
                dropped = partitions.drop_before(conn, table, until, limit=2)
                res.partitions_dropped += dropped
                res.more |= len(dropped) == 2
                continue
            key = TIME_TABLES[table]
            (fk,) = metadata.tables[table].c[key].foreign_keys
            owners = fk.column.table.name
            for owner in conn.scalars(text(f"SELECT id FROM {owners} ORDER BY id")).all():  # noqa: S608  identifiers come from the schema, never from input; values are bound parameters
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
