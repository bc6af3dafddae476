"""Encoding of ``gpu_samples`` rows as plain tuples of stored values.

The agent encodes each sample once, at tick time, into the tuple the database stores (fixed-point
integers, epoch milliseconds; see ``schema.FixedPoint``). Everything downstream — the batched
write, the spool, the in-memory buffer and the 1-minute rollups — works on those tuples, so the
write path hands the driver ready values instead of running one ``TypeDecorator`` call per value
(48 per row), and a spooled tick takes a few hundred bytes of JSON.

Reads still go through the typed models and get base units back.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from sqlalchemy import Table

from vgpumon.model import GpuSample
from vgpumon.store.schema import (
    ACTIVITY_SOURCES,
    SAMPLE_VALUE_COLUMNS,
    EpochMillis,
    FixedPoint,
    GpuSampleRow,
    gpu_samples_1m,
)

#: A ``gpu_samples`` row as stored: values in ``GPU_ROW_COLUMNS`` order.
GpuRow = tuple[Any, ...]
#: A ``gpu_samples_1m`` row as stored: values in ``ROLLUP_ROW_COLUMNS`` order.
RollupRow = tuple[Any, ...]

GPU_ROW_COLUMNS: tuple[str, ...] = tuple(c.name for c in GpuSampleRow.__table__.columns)
ROLLUP_ROW_COLUMNS: tuple[str, ...] = tuple(c.name for c in gpu_samples_1m.columns)
GPU_ID = GPU_ROW_COLUMNS.index("gpu_id")
TS = GPU_ROW_COLUMNS.index("ts")
UP = GPU_ROW_COLUMNS.index("up")


def _encoder(table: Table, name: str) -> Callable[[Any], Any]:
    t = table.c[name].type
    if isinstance(t, FixedPoint):
        scale, coarse = t.scale, t.coarse
        if coarse:
            return lambda v: None if v is None else int(round(v / scale))
        return lambda v: None if v is None else int(round(v * scale))
    if isinstance(t, EpochMillis):
        return lambda v: None if v is None else int(round(v * 1000))
    return lambda v: v


_VALUE_ENCODERS: tuple[tuple[str, Callable[[Any], Any]], ...] = tuple(
    (name, _encoder(GpuSampleRow.__table__, name)) for name in SAMPLE_VALUE_COLUMNS
)
_ORDER = {name: i for i, name in enumerate(GPU_ROW_COLUMNS)}


def encode_gpu_sample(gpu_id: int, s: GpuSample) -> GpuRow:
    """The stored ``gpu_samples`` row of one sample.

    Args:
        gpu_id: ``gpus.id`` of the sample's GPU.
        s: the sample, base units (``None`` stays ``None``: NULL in the store).

    Returns:
        Values in ``GPU_ROW_COLUMNS`` order: ``ts`` in epoch ms, fixed-point integers as the column
        types define them, booleans as ``bool``.
    """
    row: list[Any] = [None] * len(GPU_ROW_COLUMNS)
    row[GPU_ID] = gpu_id
    row[TS] = int(round(s.ts * 1000))
    row[UP] = bool(s.up)
    row[_ORDER["activity_source"]] = ACTIVITY_SOURCES.get(s.activity_source) if s.activity_source else None
    for name, enc in _VALUE_ENCODERS:
        row[_ORDER[name]] = enc(getattr(s, name))
    return tuple(row)


def reorder(rows: Sequence[Sequence[Any]], columns: Sequence[str], target: Sequence[str]) -> list[tuple[Any, ...]]:
    """Rows written with ``columns`` (e.g. by an older agent's spool) as rows of ``target``;
    columns missing from ``columns`` become ``None``, unknown ones are dropped."""
    if tuple(columns) == tuple(target):
        return [tuple(r) for r in rows]
    pos = {c: i for i, c in enumerate(columns)}
    idx = [pos.get(c) for c in target]
    return [tuple(None if i is None else r[i] for i in idx) for r in rows]
