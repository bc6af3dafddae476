"""Encoding of ``gpu_samples`` rows as plain tuples of stored values.

The agent encodes each sample once, at tick time, into the tuple the database stores (fixed-point
integers, epoch milliseconds; each field's encoding is its catalogue entry's). Everything downstream — the batched
write, the spool, the in-memory buffer and the 1-minute rollups — works on those tuples, so the
write path hands the driver ready values instead of running one ``TypeDecorator`` call per value
(48 per row), and a spooled tick takes a few hundred bytes of JSON.

Reads still go through the typed models and get base units back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

from vgpumon import catalogue
from vgpumon.catalogue import Field
from vgpumon.model import GpuSample
from vgpumon.store.schema import ColumnValue, GpuSampleRow, gpu_samples_1m

#: A value as a column stores it: ``int`` (fixed-point, integers, codes, epoch ms), ``bool``,
#: ``str``, or ``None`` for NULL. Which one is the column's, and rows are positional (a
#: column's place is known only at run time, from ``GPU_ROW_COLUMNS``), so this stays ``Any``:
#: the hot paths (rollups, partitions by ``ts``) use values by position without narrowing them.
StoredValue: TypeAlias = Any

#: A ``gpu_samples`` row as stored: values in ``GPU_ROW_COLUMNS`` order.
GpuRow: TypeAlias = tuple[StoredValue, ...]
#: A ``gpu_samples_1m`` row as stored: values in ``ROLLUP_ROW_COLUMNS`` order.
RollupRow: TypeAlias = tuple[StoredValue, ...]

#: Turns a base-unit value of one field (a number for fixed-point and integer encodings, a code
#: name for codes, anything for flags and text: the field's own type) into its stored form.
Encoder: TypeAlias = Callable[[ColumnValue], int | bool | str]

GPU_ROW_COLUMNS: tuple[str, ...] = tuple(c.name for c in GpuSampleRow.__table__.columns)
ROLLUP_ROW_COLUMNS: tuple[str, ...] = tuple(c.name for c in gpu_samples_1m.columns)
GPU_ID = GPU_ROW_COLUMNS.index("gpu_id")
TS = GPU_ROW_COLUMNS.index("ts")
UP = GPU_ROW_COLUMNS.index("up")


def encoder(f: Field) -> Encoder:
    """The function that turns a base-unit value of ``f`` into its stored form.

    Fixed-point and integer encodings raise ``OverflowError`` for a value that does not fit the
    column (and ``ValueError`` for NaN): a value that passed the door always fits (its range is
    checked against the column in tests/test_catalogue.py), so this is the last guard, not the
    validation.
    """
    enc = f.encoding
    if enc.kind in ("fixed", "int"):
        return enc.stored
    if enc.kind == "bool":
        return bool
    if enc.kind == "code":
        codes = enc.codes or {}
        return codes.__getitem__
    return str


#: (position in the row, attribute, encoder) of every catalogue field of ``gpu_samples``.
_VALUE_ENCODERS: tuple[tuple[int, str, Encoder], ...] = tuple(
    (GPU_ROW_COLUMNS.index(f.name), f.name, encoder(f)) for f in catalogue.fields_of("gpu_samples")
)
_ENCODE_ERRORS = (OverflowError, ValueError, TypeError, KeyError)


def encode_gpu_sample(gpu_id: int, s: GpuSample, failed: dict[str, str] | None = None) -> GpuRow:
    """The stored ``gpu_samples`` row of one sample.

    Args:
        gpu_id: ``gpus.id`` of the sample's GPU.
        s: the sample, base units (``None`` stays ``None``: NULL in the store).
        failed: when given, receives field → reason for each value that could not be encoded;
            that value is stored as NULL and the rest of the row as it is — one bad value costs
            only itself.

    Returns:
        Values in ``GPU_ROW_COLUMNS`` order: ``ts`` in epoch ms, fixed-point integers as the
        catalogue's encodings define them, booleans as ``bool``, codes as integers.
    """
    row: list[StoredValue] = [None] * len(GPU_ROW_COLUMNS)
    row[GPU_ID] = gpu_id
    row[TS] = int(round(s.ts * 1000))
    for pos, name, enc in _VALUE_ENCODERS:
        v = getattr(s, name)
        if v is not None:
            try:
                row[pos] = enc(v)
            except _ENCODE_ERRORS as exc:
                if failed is not None:
                    failed[name] = f"rejected: cannot be stored ({exc.__class__.__name__}: {exc})"
    row[UP] = bool(s.up)
    return tuple(row)


def storable(table: str, row: dict[str, ColumnValue]) -> dict[str, str]:
    """Make a dict row of ``table`` (base units, the column types encode on write) safe to store:
    each catalogue value that cannot be encoded becomes ``None``, in place.

    Returns:
        field → reason, for the values set to ``None``.
    """
    failed: dict[str, str] = {}
    for name, enc in _ROW_ENCODERS[table]:
        v = row.get(name)
        if v is None:
            continue
        try:
            enc(v)
        except _ENCODE_ERRORS as exc:
            row[name] = None
            failed[name] = f"rejected: cannot be stored ({exc.__class__.__name__}: {exc})"
    return failed


_ROW_ENCODERS: dict[str, tuple[tuple[str, Encoder], ...]] = {
    table: tuple((f.name, encoder(f)) for f in catalogue.fields_of(table))
    for table in ("host_samples", "gpu_process_samples", "vllm_samples", "vllm_engine_samples", "vllm_instances")
}


def reorder(rows: Sequence[Sequence[StoredValue]], columns: Sequence[str], target: Sequence[str]) -> list[tuple[StoredValue, ...]]:
    """Rows written with ``columns`` (e.g. by an older agent's spool) as rows of ``target``;
    columns missing from ``columns`` become ``None``, unknown ones are dropped."""
    if tuple(columns) == tuple(target):
        return [tuple(r) for r in rows]
    pos = {c: i for i, c in enumerate(columns)}
    idx = [pos.get(c) for c in target]
    return [tuple(None if i is None else r[i] for i in idx) for r in rows]
