"""Writes and reads of the vLLM tables (``vllm_schema``), on SQLite and Postgres alike."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import ColumnElement, Engine, and_, func, select, type_coerce
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.sql.base import ReadOnlyColumnCollection

from vgpumon.base.errors import StoreUnavailableError
from vgpumon.model import ServerSample, ServerState
from vgpumon.model.vllm import LATENCY_HISTOGRAMS
from vgpumon.store import partitions
from vgpumon.store.engine import unavailable
from vgpumon.store.schema import Col, Host
from vgpumon.store.tables import ColumnValue, insert_ignoring_duplicates, inserted_id, store_unavailable
from vgpumon.store.vllm_schema import (
    PREFIX_CACHE_UNIT_NAMES,
    PREFIX_CACHE_UNITS,
    TELEMETRY_CODES,
    TELEMETRY_NAMES,
    InstanceIdentity,
    InstanceKey,
    InstanceRecord,
    SampleValues,
    StoredEngineSample,
    StoredGpuMapping,
    StoredSample,
    VllmEngineSampleRow,
    VllmGpuMapRow,
    VllmInstance,
    VllmRow,
    VllmSampleRow,
)

_SAMPLES = VllmSampleRow.__table__
_ENGINES = VllmEngineSampleRow.__table__
_INSTANCES = VllmInstance.__table__
_GPU_MAP = VllmGpuMapRow.__table__
#: ``vllm_samples`` columns copied from ``ServerSample`` attributes of the same name.
_VALUE_COLUMNS = tuple(
    c.name for c in _SAMPLES.columns
    if c.name not in {
        "instance_id", "ts", "state", "telemetry_up", "prefix_cache_unit", "reason", "metrics_error", "telemetry",
        "latency_unreliable", "latency_unreliable_reason",
    }
)


def _text(value: str | None, limit: int = 255) -> str | None:
    """A reason as its column holds it (``String(255)``): cut, never refused by the store."""
    return None if value is None else value[:limit]


def _identity_filter(host_id: int, ident: InstanceIdentity) -> ColumnElement[bool]:
    c = _INSTANCES.c
    conds = [c.host_id == host_id, c.port == ident["port"], c.first_seen == ident["first_seen"]]
    conds.append(c.pid.is_(None) if ident["pid"] is None else c.pid == ident["pid"])
    return and_(*conds)


def instance_key(row: VllmRow) -> InstanceKey:
    """The identity of the server start an encoded sample belongs to."""
    i = row["instance"]
    return (row["host_id"], i["port"], i["pid"], i["first_seen"])


def fold_rows(rows: Sequence[VllmRow], *, keep_last_minute: bool) -> tuple[list[VllmRow], int]:
    """Thin encoded samples when the backlog is over its bound, as GPU ticks fold into rollups.

    Per server start and minute the last sample is kept, and so is every sample whose state or
    reason differs from its predecessor's, and the final one (``ended``): what an on-call reader
    needs (when it went dead, hung, ready) survives; rates and quantiles of a kept sample still
    cover its own poll interval only.

    Args:
        rows: encoded samples, any order.
        keep_last_minute: keep every sample of the newest minute (more samples of it may follow).

    Returns:
        The kept samples in time order, and how many were folded away.
    """
    ordered = sorted(rows, key=lambda r: r["sample"]["ts"])
    if not ordered:
        return [], 0
    newest = int(ordered[-1]["sample"]["ts"] // 60)
    last_of_minute = {(instance_key(r), int(r["sample"]["ts"] // 60)): i for i, r in enumerate(ordered)}
    previous: dict[InstanceKey, tuple[ColumnValue, ColumnValue]] = {}
    kept = []
    for i, r in enumerate(ordered):
        key, minute = instance_key(r), int(r["sample"]["ts"] // 60)
        state = (r["sample"]["state"], r["sample"].get("reason"))
        if (
            (keep_last_minute and minute == newest)
            or last_of_minute[(key, minute)] == i
            or previous.get(key) != state
            or r["start"].get("ended") is not None
        ):
            kept.append(r)
        previous[key] = state
    return kept, len(ordered) - len(kept)
def _of_start(
    c: ReadOnlyColumnCollection[str, Col], instance_id: int, start: float | None, end: float | None
) -> ColumnElement[bool]:
    """Rows of one start, within ``start <= ts <= end`` where given."""
    where = [c.instance_id == instance_id]
    if start is not None:
        where.append(c.ts >= start)
    if end is not None:
        where.append(c.ts <= end)
    return and_(*where)


class VllmRepository:
    """The vLLM tables of a store.

    Args:
        engine: the store's engine (``Store.engine``); tables are created by
            ``Store.init_schema`` (``schema.metadata`` holds them).

    Every method raises ``StoreUnavailableError`` when the database cannot be reached; a write
    the store refuses for what a row holds raises the driver's own error (see
    ``repository.store_unavailable``).
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._ids: dict[InstanceKey, int] = {}
        self._insert_samples = insert_ignoring_duplicates(engine.dialect.name, _SAMPLES)
        self._insert_engines = insert_ignoring_duplicates(engine.dialect.name, _ENGINES)
        self._partitions: set[tuple[str, int]] = set()  # (table, day ms) known to exist (Postgres)

    def _fail(self, exc: Exception) -> StoreUnavailableError:
        return unavailable(self.engine, exc)

    @staticmethod
    def sample_row(instance_id: int | None, s: ServerSample) -> SampleValues:
        """The ``vllm_samples`` row of one sample (base units; the column types encode)."""
        row = {name: getattr(s, name) for name in _VALUE_COLUMNS}
        flagged = {h: why for h, why in s.latency_unreliable.items() if h in LATENCY_HISTOGRAMS}
        row.update(
            ts=s.ts, state=s.state.code,
            telemetry_up=None if s.telemetry is None else s.telemetry != "down",
            telemetry=TELEMETRY_CODES.get(s.telemetry or ""),
            prefix_cache_unit=PREFIX_CACHE_UNITS.get(s.prefix_cache_unit or ""),
            reason=_text(s.reason),
            metrics_error=_text(s.metrics_error),
            latency_unreliable=sum(LATENCY_HISTOGRAMS[h] for h in flagged),
            latency_unreliable_reason=_text("; ".join(f"{h}: {why}" for h, why in sorted(flagged.items()))),
        )
        if instance_id is not None:
            row["instance_id"] = instance_id
        return row

    @classmethod
    def encode_sample(cls, host_id: int, s: ServerSample) -> VllmRow:
        """One sample as the plain, JSON-able dict the backlog holds and ``write_rows`` stores:
        ``host_id``, ``instance`` (identity), ``start`` (facts of the start as of this sample),
        ``sample`` (the ``vllm_samples`` row without its instance id, base units), ``engines``
        (``vllm_engine_samples`` rows) and ``gpus`` (UUIDs)."""
        ident = s.instance
        return {
            "host_id": host_id,
            "instance": {
                "address": ident.host, "port": ident.port, "url": ident.url, "origin": ident.origin,
                "pid": ident.pid, "process_start": ident.process_start, "first_seen": ident.first_seen,
            },
            "start": {
                "version": s.version, "model": ",".join(s.model_names)[:1024] or None,
                "first_connect": s.first_connect_ts, "ready": s.ready_ts, "prewarm_seconds": s.prewarm_seconds,
                "prewarm_gpu_active_ratio": s.prewarm_gpu_active_ratio,
                "prewarm_gpu_activity_source": s.prewarm_gpu_activity_source,
                "ended": s.ts if s.ended else None, "final_state": s.state.code if s.ended else None,
            },
            "sample": cls.sample_row(None, s),
            "engines": [
                {
                    "model_name": e.model_name or "", "engine": e.engine or "", "running": e.running,
                    "waiting": e.waiting, "kv_cache_usage_ratio": e.kv_cache_usage_ratio,
                }
                for e in s.engines
            ],
            "gpus": list(s.gpu_uuids),
        }

    def write(self, hostname: str, samples: Sequence[ServerSample]) -> None:
        """Store a batch of samples of one host (created when missing); see ``write_rows``."""
        if not samples:
            return
        try:
            with self.engine.begin() as conn:
                host_id = conn.scalar(select(Host.id).where(Host.hostname == hostname))
                if host_id is None:
                    host_id = inserted_id(conn.execute(Host.__table__.insert().values(hostname=hostname)).inserted_primary_key)
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        self.write_rows([self.encode_sample(int(host_id), s) for s in samples])

    def write_rows(self, rows: Sequence[VllmRow]) -> None:
        """Store encoded samples (``encode_sample``) in one transaction: the instances (created
        or updated with the newest start facts), their sample rows, per-engine rows and GPU
        mapping. A sample already stored (same instance and time) is skipped."""
        if not rows:
            return
        new_ids: dict[InstanceKey, int] = {}
        new_parts: set[tuple[str, int]] = set()  # cached only once the transaction commits
        try:
            with self.engine.begin() as conn:
                latest: dict[InstanceKey, VllmRow] = {}
                for r in rows:
                    key = instance_key(r)
                    if key not in latest or r["sample"]["ts"] >= latest[key]["sample"]["ts"]:
                        latest[key] = r
                ids: dict[InstanceKey, int] = {}
                for key, r in latest.items():
                    attrs = dict(r["start"], last_seen=r["sample"]["ts"])
                    iid = self._ids.get(key)
                    if iid is None:
                        iid = conn.scalar(select(_INSTANCES.c.id).where(_identity_filter(r["host_id"], r["instance"])))
                    if iid is None:
                        iid = inserted_id(conn.execute(
                            _INSTANCES.insert().values(host_id=r["host_id"], **r["instance"], **attrs)
                        ).inserted_primary_key)
                    else:
                        conn.execute(_INSTANCES.update().where(_INSTANCES.c.id == iid).values(**attrs))
                    ids[key] = new_ids[key] = int(iid)
                if conn.dialect.name == "postgresql":  # time tables are partitioned by day there
                    days = {partitions.day_of(int(round(r["sample"]["ts"] * 1000))) for r in rows}
                    for table in ("vllm_samples", "vllm_engine_samples"):
                        missing = {d for d in days if (table, d) not in self._partitions}
                        if missing:
                            partitions.ensure(conn, table, missing)
                            new_parts.update((table, d) for d in missing)
                conn.execute(self._insert_samples, [dict(r["sample"], instance_id=ids[instance_key(r)]) for r in rows])
                engine_rows = [
                    dict(e, instance_id=ids[instance_key(r)], ts=r["sample"]["ts"]) for r in rows for e in r["engines"]
                ]
                if engine_rows:
                    conn.execute(self._insert_engines, engine_rows)
                seen: dict[tuple[int, str], tuple[float, float]] = {}
                for r in rows:
                    ts = r["sample"]["ts"]
                    for u in r["gpus"]:
                        k = (ids[instance_key(r)], u)
                        lo, hi = seen.get(k, (ts, ts))
                        seen[k] = (min(lo, ts), max(hi, ts))
                for (iid, u), (lo, hi) in seen.items():
                    c = _GPU_MAP.c
                    old = conn.execute(
                        select(c.first_seen).where(and_(c.instance_id == iid, c.gpu_uuid == u))
                    ).first()
                    if old is None:
                        conn.execute(_GPU_MAP.insert().values(instance_id=iid, gpu_uuid=u, first_seen=lo, last_seen=hi))
                    else:
                        conn.execute(
                            _GPU_MAP.update().where(and_(c.instance_id == iid, c.gpu_uuid == u)).values(last_seen=hi)
                        )
        except SQLAlchemyError as exc:
            if store_unavailable(exc):
                raise self._fail(exc) from None
            raise
        self._ids.update(new_ids)  # only ids of committed rows
        self._partitions.update(new_parts)

    # -- reads ---------------------------------------------------------------------------------

    def instances(self, hostname: str) -> list[InstanceRecord]:
        """The host's server starts, oldest first (base units; ``final_state`` as a
        ``ServerState`` or ``None``)."""
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    select(_INSTANCES).join(Host.__table__, Host.id == _INSTANCES.c.host_id)
                    .where(Host.hostname == hostname).order_by(_INSTANCES.c.first_seen, _INSTANCES.c.id)
                ).mappings().all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        out = []
        for r in rows:
            d = dict(r)
            d["final_state"] = None if d["final_state"] is None else ServerState.from_code(d["final_state"])
            out.append(d)
        return out

    def samples(self, instance_id: int, start: float | None = None, end: float | None = None) -> list[StoredSample]:
        """Sample rows of one start, oldest first, only those with ``start <= ts <= end`` when
        given (a start can poll for weeks): ``state`` as ``ServerState``, ``telemetry`` as its
        name (``None`` for rows stored before revision 0008), ``latency_unreliable`` as the set of
        histogram names whose quantiles were flagged (read latencies for alerting through
        ``vgpumon.model.vllm.latency_for_alerts``)."""
        c = _SAMPLES.c
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(select(_SAMPLES).where(_of_start(c, instance_id, start, end)).order_by(c.ts)).mappings().all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        out = []
        for r in rows:
            d = dict(r)
            d["state"] = ServerState.from_code(d["state"])
            d["prefix_cache_unit"] = PREFIX_CACHE_UNIT_NAMES.get(d["prefix_cache_unit"])
            d["telemetry"] = TELEMETRY_NAMES.get(d["telemetry"])
            mask = d["latency_unreliable"] or 0
            d["latency_unreliable"] = frozenset(h for h, bit in LATENCY_HISTOGRAMS.items() if mask & bit)
            out.append(d)
        return out

    def kv_offload_means(self, instance_id: int, start: float, end: float) -> tuple[float | None, float | None, int]:
        """Mean KV-offload load and store rates (bytes/s) of one start's polls in ``[start, end]``
        that carry one, and how many polls carry either: one aggregate query, however long the
        window (``vgpumon capacity`` reviews weeks)."""
        c = _SAMPLES.c
        load, store = c.kv_offload_load_bytes_per_second, c.kv_offload_store_bytes_per_second
        query = select(type_coerce(func.avg(load), load.type), type_coerce(func.avg(store), store.type),
                       func.count(func.coalesce(load, store))).where(_of_start(c, instance_id, start, end))
        try:
            with self.engine.connect() as conn:
                row = conn.execute(query).one()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return row[0], row[1], int(row[2] or 0)

    def engine_samples(
        self, instance_id: int, start: float | None = None, end: float | None = None
    ) -> list[StoredEngineSample]:
        """Per-engine rows of one start, by time then model and engine; only ``start <= ts <=
        end`` when given."""
        c = _ENGINES.c
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    select(_ENGINES).where(_of_start(c, instance_id, start, end)).order_by(c.ts, c.model_name, c.engine)
                ).mappings().all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return [
            StoredEngineSample(
                instance_id=r["instance_id"], ts=r["ts"], model_name=r["model_name"], engine=r["engine"],
                running=r["running"], waiting=r["waiting"], kv_cache_usage_ratio=r["kv_cache_usage_ratio"],
            )
            for r in rows
        ]

    def gpu_map(self, instance_id: int) -> list[StoredGpuMapping]:
        """GPUs one start used, by UUID."""
        c = _GPU_MAP.c
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(select(_GPU_MAP).where(c.instance_id == instance_id).order_by(c.gpu_uuid)).mappings().all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return [
            StoredGpuMapping(instance_id=r["instance_id"], gpu_uuid=r["gpu_uuid"], first_seen=r["first_seen"], last_seen=r["last_seen"])
            for r in rows
        ]
