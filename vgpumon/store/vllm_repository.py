"""Writes and reads of the vLLM tables (``vllm_schema``), on SQLite and Postgres alike."""

from __future__ import annotations

from typing import Any, Sequence

from sqlalchemy import Engine, and_, select
from sqlalchemy.exc import SQLAlchemyError

from vgpumon.errors import StoreUnavailableError
from vgpumon.model import InstanceIdentity, ServerSample, ServerState
from vgpumon.store import partitions
from vgpumon.store.repository import insert_ignoring_duplicates
from vgpumon.store.schema import Host
from vgpumon.store.vllm_schema import (
    PREFIX_CACHE_UNIT_NAMES,
    PREFIX_CACHE_UNITS,
    VllmEngineSampleRow,
    VllmGpuMapRow,
    VllmInstance,
    VllmSampleRow,
)

_SAMPLES = VllmSampleRow.__table__
_ENGINES = VllmEngineSampleRow.__table__
_INSTANCES = VllmInstance.__table__
_GPU_MAP = VllmGpuMapRow.__table__
#: ``vllm_samples`` columns copied from ``ServerSample`` attributes of the same name.
_VALUE_COLUMNS = tuple(
    c.name for c in _SAMPLES.columns
    if c.name not in {"instance_id", "ts", "state", "telemetry_up", "prefix_cache_unit"}
)


def _identity_filter(host_id: int, ident: InstanceIdentity) -> Any:
    c = _INSTANCES.c
    conds = [c.host_id == host_id, c.port == ident.port, c.first_seen == ident.first_seen]
    conds.append(c.pid.is_(None) if ident.pid is None else c.pid == ident.pid)
    return and_(*conds)


def _of_start(c: Any, instance_id: int, start: float | None, end: float | None) -> Any:
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
            ``Store.init_schema`` (``Base.metadata`` holds them).

    Every method raises ``StoreUnavailableError`` when the database cannot be reached.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._ids: dict[tuple[str, InstanceIdentity], int] = {}
        self._insert_samples = insert_ignoring_duplicates(engine.dialect.name, _SAMPLES)
        self._insert_engines = insert_ignoring_duplicates(engine.dialect.name, _ENGINES)
        self._partitions: set[tuple[str, int]] = set()  # (table, day ms) known to exist (Postgres)

    def _fail(self, exc: Exception) -> StoreUnavailableError:
        detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        return StoreUnavailableError(f"store {self.engine.url.render_as_string(hide_password=True)} unavailable: {detail}")

    @staticmethod
    def sample_row(instance_id: int, s: ServerSample) -> dict[str, Any]:
        """The ``vllm_samples`` row of one sample (base units; the column types encode)."""
        row = {name: getattr(s, name) for name in _VALUE_COLUMNS}
        row.update(
            instance_id=instance_id, ts=s.ts, state=s.state.code,
            telemetry_up=None if s.telemetry is None else s.telemetry != "down",
            prefix_cache_unit=PREFIX_CACHE_UNITS.get(s.prefix_cache_unit or ""),
        )
        return row

    def write(self, hostname: str, samples: Sequence[ServerSample]) -> None:
        """Store a batch of samples in one transaction: the instances (created or updated with
        the newest start facts), their sample rows, per-engine rows and GPU mapping. A sample
        already stored (same instance and time) is skipped."""
        if not samples:
            return
        new_ids: dict[tuple[str, InstanceIdentity], int] = {}
        new_parts: set[tuple[str, int]] = set()  # cached only once the transaction commits
        try:
            with self.engine.begin() as conn:
                host_id = conn.scalar(select(Host.id).where(Host.hostname == hostname))
                if host_id is None:
                    host_id = conn.execute(Host.__table__.insert().values(hostname=hostname)).inserted_primary_key[0]
                latest: dict[InstanceIdentity, ServerSample] = {}
                for s in samples:
                    if s.instance not in latest or s.ts >= latest[s.instance].ts:
                        latest[s.instance] = s
                ids: dict[InstanceIdentity, int] = {}
                for ident, s in latest.items():
                    attrs = dict(
                        last_seen=s.ts, version=s.version, model=",".join(s.model_names)[:1024] or None,
                        first_connect=s.first_connect_ts, ready=s.ready_ts, prewarm_seconds=s.prewarm_seconds,
                        prewarm_gpu_active_ratio=s.prewarm_gpu_active_ratio,
                        prewarm_gpu_activity_source=s.prewarm_gpu_activity_source,
                        ended=s.ts if s.ended else None, final_state=s.state.code if s.ended else None,
                    )
                    iid = self._ids.get((hostname, ident))
                    if iid is None:
                        iid = conn.scalar(select(_INSTANCES.c.id).where(_identity_filter(host_id, ident)))
                    if iid is None:
                        iid = conn.execute(
                            _INSTANCES.insert().values(
                                host_id=host_id, address=ident.host, port=ident.port, url=ident.url,
                                origin=ident.origin, pid=ident.pid, process_start=ident.process_start,
                                first_seen=ident.first_seen, **attrs,
                            )
                        ).inserted_primary_key[0]
                    else:
                        conn.execute(_INSTANCES.update().where(_INSTANCES.c.id == iid).values(**attrs))
                    ids[ident] = int(iid)
                    new_ids[(hostname, ident)] = int(iid)
                if conn.dialect.name == "postgresql":  # time tables are partitioned by day there
                    days = {partitions.day_of(int(round(s.ts * 1000))) for s in samples}
                    for table in ("vllm_samples", "vllm_engine_samples"):
                        missing = {d for d in days if (table, d) not in self._partitions}
                        if missing:
                            partitions.ensure(conn, table, missing)
                            new_parts.update((table, d) for d in missing)
                conn.execute(self._insert_samples, [self.sample_row(ids[s.instance], s) for s in samples])
                engine_rows = [
                    dict(
                        instance_id=ids[s.instance], ts=s.ts, model_name=e.model_name or "", engine=e.engine or "",
                        running=e.running, waiting=e.waiting, kv_cache_usage_ratio=e.kv_cache_usage_ratio,
                    )
                    for s in samples for e in s.engines
                ]
                if engine_rows:
                    conn.execute(self._insert_engines, engine_rows)
                seen: dict[tuple[int, str], tuple[float, float]] = {}
                for s in samples:
                    for u in s.gpu_uuids:
                        k = (ids[s.instance], u)
                        lo, hi = seen.get(k, (s.ts, s.ts))
                        seen[k] = (min(lo, s.ts), max(hi, s.ts))
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
            raise self._fail(exc) from None
        self._ids.update(new_ids)  # only ids of committed rows
        self._partitions.update(new_parts)

    # -- reads ---------------------------------------------------------------------------------

    def instances(self, hostname: str) -> list[dict[str, Any]]:
        """The host's server starts, oldest first (base units; ``final_state`` as a
        ``ServerState`` or ``None``)."""
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    select(_INSTANCES).join(Host, Host.id == _INSTANCES.c.host_id)
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

    def samples(self, instance_id: int, start: float | None = None, end: float | None = None) -> list[dict[str, Any]]:
        """Sample rows of one start, oldest first (``state`` as ``ServerState``); only those with
        ``start <= ts <= end`` when given (a start can poll for weeks)."""
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
            out.append(d)
        return out

    def engine_samples(self, instance_id: int, start: float | None = None, end: float | None = None) -> list[dict[str, Any]]:
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
        return [dict(r) for r in rows]

    def gpu_map(self, instance_id: int) -> list[dict[str, Any]]:
        """GPUs one start used, by UUID."""
        c = _GPU_MAP.c
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(select(_GPU_MAP).where(c.instance_id == instance_id).order_by(c.gpu_uuid)).mappings().all()
        except SQLAlchemyError as exc:
            raise self._fail(exc) from None
        return [dict(r) for r in rows]
