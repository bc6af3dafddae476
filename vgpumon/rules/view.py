"""What a rule sees of one host at one evaluation time: lazy, cached reads of the store.

Every window ends at ``at`` (the evaluation time: the agent's newest stored tick, or the end of
``diagnose``'s window), so the agent and ``diagnose`` read the same data for the same time. A
read is made once per evaluation however many rules need it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Mapping, Protocol, TypedDict, TypeVar, cast

from vgpumon import catalogue
from vgpumon.model import fingerprint
from vgpumon.store import Store, StoredGpu
from vgpumon.store.rollup import percentile
from vgpumon.store.tables import GpuEventRow, ProcessMemoryRow  # the store's row types, read by the rules

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from vgpumon.model import ServerState
    from vgpumon.model.topology import PcieTopology
    from vgpumon.store.vllm_repository import VllmRepository
    from vgpumon.store.vllm_schema import StoredEngineSample, StoredGpuMapping

_T = TypeVar("_T")

#: A stored GPU value: every ``gpu_samples`` column is a number (fixed-point columns decode to
#: floats; integers, codes and flags are ints) or NULL; so are the aggregates and rollups of them.
Value = float | None
#: One row of a GPU's stored values by column name: ``ts`` and the columns asked for (raw rows,
#: rollups, per-tick sums with their ``gpus``, window aggregates such as ``<column>_max``).
Row = dict[str, Value]
#: A column's newest non-NULL value and its time, or ``None`` (``Store.last_values_many``).
LastValue = tuple[float, float] | None
#: vLLM poll rows as ``VllmRepository`` reads them (every column of its wide table, read by the
#: catalogue's names; ``state`` as a ``ServerState``): their shape is the store's, untyped there.
VllmRecord = dict[str, Any]


class StoreReads(Protocol):
    """The reads a ``HostView`` makes: ``Store``'s own, or the agent's windows in memory
    (``vgpumon.alerts.windows.RuleWindows``), which answer them from what the agent keeps."""

    LAST_RAW_SECONDS: float
    LAST_ROLLUP_SECONDS: float

    @property
    def engine(self) -> Engine: ...
    def gpus_of(self, hostname: str) -> list[StoredGpu]: ...
    def window_aggregates_many(self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str],
                               aggregates: Sequence[str] = ...) -> dict[int, dict[str, Any]]: ...
    def latest(self, gpu_ids: Sequence[int], columns: Sequence[str], until: float | None = None) -> dict[int, dict[str, Any]]: ...
    def last_values_many(self, gpu_ids: Sequence[int], end: float, columns: Sequence[str]) -> dict[int, dict[str, tuple[float, Any] | None]]: ...
    def newest_values(self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str]) -> dict[int, dict[str, tuple[float, Any]]]: ...
    def down_since(self, newest: Mapping[int, tuple[float, bool]], at: float) -> dict[int, float]: ...
    def window_percentiles(self, gpu_id: int, start: float, end: float, columns: Sequence[str],
                           quantiles: Sequence[float] = ...) -> dict[str, dict[float, float | None]]: ...
    def series(self, gpu_id: int, start: float, end: float, columns: Sequence[str], present: bool = False) -> list[dict[str, Any]]: ...
    def summed_series(self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str]) -> list[dict[str, Any]]: ...
    def rollup_series_many(self, gpu_ids: Sequence[int], start: float, end: float, columns: Sequence[str]) -> dict[int, list[dict[str, Any]]]: ...
    def host_xid_events(self, hostname: str, start: float, end: float) -> list[tuple[float, int, int]]: ...
    def gpu_events(self, hostname: str, start: float, end: float, gpus: Sequence[StoredGpu] | None = None) -> list[GpuEventRow]: ...
    def process_memory_series(self, gpu_ids: Sequence[int], start: float, end: float) -> list[ProcessMemoryRow]: ...
    def rejections(self, hostname: str, start: float, end: float) -> dict[str, dict[str, tuple[int, str]]]: ...
    def topology(self, hostname: str) -> PcieTopology: ...
    def newest_host_sample(self, hostname: str) -> float | None: ...


class VllmInstanceRow(TypedDict):
    """One start of a vLLM server (``VllmRepository.instances``: the ``vllm_instances`` row, times
    in epoch seconds, ``final_state`` as a ``ServerState``)."""

    id: int
    host_id: int
    address: str
    port: int
    url: str
    origin: str
    pid: int | None
    process_start: float | None
    first_seen: float
    last_seen: float
    version: str | None
    model: str | None
    first_connect: float | None
    ready: float | None
    prewarm_seconds: float | None
    prewarm_gpu_active_ratio: float | None
    prewarm_gpu_activity_source: str | None
    ended: float | None
    final_state: ServerState | None


def row_ts(row: Row) -> float:
    """A row's time: part of every stored row's key, never NULL (the other columns may be)."""
    return cast(float, row["ts"])


#: Columns whose newest value is read for every GPU at once, the first time any is asked for: the
#: catalogue's ``last``/``cumulative`` columns (what ``diagnose`` shows, and what the latched rules
#: read one by one).
LAST_READ = tuple(f.name for f in catalogue.fields_of("gpu_samples") if {"last", "cumulative"} & set(f.diagnose))

#: Columns of each GPU's newest row read together, the first time any rule asks for its newest
#: row: readable or not (the lost, unreadable, missing and silence rules and ``down_since``) and
#: memory (the memory-full rule). One primary-key seek per GPU serves them all, where each rule's
#: own read cost a seek per GPU per rule every 15 s.
LATEST_READ = ("up", "memory_used_bytes", "memory_total_bytes")


class HostView:
    """The stored data of one host as of ``at``.

    Args:
        store: an open store (or the agent's windows in memory, ``StoreReads``).
        hostname: the host as stored.
        at: evaluation time (epoch seconds); windows are ``[at − length, at]``.
        wall: "now" for the silence rule: the wall clock in a live agent, ``at`` otherwise (a
            replay or a post-mortem is not silent because it is old).
        active: fingerprints of the alerts now pending or firing: a rule clears at a lower
            threshold than it fires at while its alert is active (hysteresis).
        prefetch: reads shared by views of several evaluation times (``Prefetch``).
        gpus: the host's GPUs as ``Store.gpus_of`` returns them, where the caller has just read
            them (the agent's rules runner); read from the store when needed otherwise.
        carry: newest values carried from the previous evaluation time (``CarriedValues``: the
            agent's rules runner, whose evaluation times only move forward).
    """

    def __init__(self, store: StoreReads, hostname: str, at: float, *, wall: float | None = None, active: frozenset[str] = frozenset(),
                 prefetch: "Prefetch | None" = None, gpus: list[StoredGpu] | None = None,
                 carry: "CarriedValues | None" = None) -> None:
        self.store = store
        self.hostname = hostname
        self.at = at
        self.wall = at if wall is None else wall
        self.active = active
        self.prefetch = prefetch
        self.carry = carry
        # each key's value is what its ``load`` returned (``_memo``): of the type the key's reader declares
        self._cache: dict[Hashable, object] = {} if gpus is None else {"gpus": gpus}
        self._latest: dict[int, Row] | None = None
        self._latest_columns: tuple[str, ...] = ()
        self._last: dict[str, dict[int, LastValue]] = {}

    def _memo(self, key: Hashable, load: Callable[[], _T]) -> _T:
        if key not in self._cache:
            self._cache[key] = load()
        return cast(_T, self._cache[key])  # stored by the reader of this key, from the same load

    def is_active(self, rule: str, labels: dict[str, str]) -> bool:
        """The rule's alert on this subject is pending or firing now."""
        return fingerprint(rule, labels) in self.active

    # -- GPUs ------------------------------------------------------------------------------------

    @property
    def gpus(self) -> list[StoredGpu]:
        """GPUs registered for the host (every GPU its agent ever found), by index."""
        return self._memo("gpus", lambda: self.store.gpus_of(self.hostname))

    def window(self, seconds: float, columns: Sequence[str], aggregates: Sequence[str] = ("min", "mean", "max", "count")) -> dict[int, Row]:
        """Per GPU, aggregates of raw columns over ``[at − seconds, at]`` (one query for all)."""
        key = ("window", seconds, tuple(columns), tuple(aggregates))
        ids = [g.id for g in self.gpus]
        return self._memo(key, lambda: self.store.window_aggregates_many(ids, self.at - seconds, self.at, columns, aggregates))

    def latest(self, columns: Sequence[str]) -> dict[int, Row]:
        """Per GPU, its newest row at or before ``at`` (``ts`` and the columns; GPUs without a row
        are absent). ``LATEST_READ`` and ``columns`` are read in one seek per GPU, once per view."""
        rows = self._latest
        have = self._latest_columns
        if rows is None or any(c not in have for c in columns):
            have = tuple(dict.fromkeys([*have, *LATEST_READ, *columns]))
            rows = self.store.latest([g.id for g in self.gpus], have, until=self.at)
            self._latest, self._latest_columns = rows, have
        return {gid: {"ts": row["ts"], **{c: row[c] for c in columns}} for gid, row in rows.items()}

    def last_values(self, gpu_id: int, columns: Sequence[str]) -> dict[str, LastValue]:
        """Newest non-NULL value of each column at or before ``at`` (counters and latched flags
        the slow set reads every few ticks). Read for every GPU of the host at once, the first
        time a column is asked for (``Store.last_values_many``)."""
        cache = self._last
        missing = [c for c in columns if c not in cache]
        if missing:
            # the slow-set counters and flags the rules and the report read, in one query
            missing = list(dict.fromkeys([*missing, *(c for c in LAST_READ if c not in cache)]))
            ids = [g.id for g in self.gpus]
            if self.carry is not None:
                found = self.carry.read(self.store, ids, self.at, missing)
            else:
                found = self.store.last_values_many(ids, self.at, missing)
            for c in missing:
                cache[c] = {gid: values[c] for gid, values in found.items()}
        return {c: cache[c].get(gpu_id) for c in columns}

    def down_since(self) -> dict[int, float]:
        """Per GPU unreadable at ``at``, since when it has been (``Store.down_since``)."""
        return self._memo("down_since", lambda: self.store.down_since(
            {gid: (row_ts(row), bool(row["up"])) for gid, row in self.latest(("up",)).items()}, self.at))

    def percentiles(self, gpu_id: int, seconds: float, columns: Sequence[str], quantiles: Sequence[float]) -> dict[str, dict[float, float | None]]:
        """Percentiles of raw values of one GPU over ``[at − seconds, at]`` (linear
        interpolation between closest ranks, NULLs ignored: ``Store.window_percentiles``)."""
        if self.prefetch is not None:
            rows = self.series(gpu_id, seconds, columns)
            out: dict[str, dict[float, float | None]] = {}
            for c in columns:
                values = sorted(v for v in (r[c] for r in rows) if v is not None)
                out[c] = {q: percentile(values, q) if values else None for q in quantiles}
            return out
        key = ("pct", gpu_id, seconds, tuple(columns), tuple(quantiles))
        return self._memo(key, lambda: self.store.window_percentiles(gpu_id, self.at - seconds, self.at, columns, quantiles))

    def series(self, gpu_id: int, seconds: float, columns: Sequence[str], present: bool = False) -> list[Row]:
        """Raw rows (``ts`` and the columns) of one GPU over ``[at − seconds, at]``, oldest first;
        ``present``: only those where every column has a value."""
        if self.prefetch is not None:
            rows = self.prefetch.raw([g.id for g in self.gpus], gpu_id, self.at - seconds, self.at, columns)
            return [r for r in rows if all(r[c] is not None for c in columns)] if present else rows
        key = ("series", gpu_id, seconds, tuple(columns), present)
        return self._memo(key, lambda: self.store.series(gpu_id, self.at - seconds, self.at, columns, present))

    def summed(self, gpu_ids: Sequence[int], seconds: float, columns: Sequence[str]) -> list[Row]:
        """Per tick, the columns summed over ``gpu_ids`` (``Store.summed_series``: ``ts``, ``gpus``
        with a row, each column's sum or ``None`` when every GPU's value is NULL)."""
        if self.prefetch is not None:
            per_gpu = [self.series(gid, seconds, columns) for gid in gpu_ids]
            per_gpu = [rows for rows in per_gpu if rows]
            times = [[r["ts"] for r in rows] for rows in per_gpu]
            if per_gpu and all(t == times[0] for t in times):
                # the usual case (every GPU of a tick carries the tick's time): add column-wise
                out = []
                for k, t in enumerate(times[0]):
                    row: Row = {"ts": t, "gpus": len(per_gpu)}
                    for c in columns:
                        vals = [v for v in (rows[k][c] for rows in per_gpu) if v is not None]
                        row[c] = sum(vals) if vals else None
                    out.append(row)
                return out
            ticks: dict[float, Row] = {}
            for rows in per_gpu:
                for r in rows:
                    tick = ticks.setdefault(row_ts(r), {"ts": r["ts"], "gpus": 0, **{c: None for c in columns}})
                    tick["gpus"] = (tick["gpus"] or 0) + 1
                    for c in columns:
                        value, have = r[c], tick[c]
                        if value is not None:
                            tick[c] = value if have is None else have + value
            return [ticks[t] for t in sorted(ticks)]
        key = ("summed", tuple(gpu_ids), seconds, tuple(columns))
        return self._memo(key, lambda: self.store.summed_series(gpu_ids, self.at - seconds, self.at, columns))

    def rollups(self, gpu_id: int, seconds: float, columns: Sequence[str]) -> list[Row]:
        """1-minute rollups of one GPU over ``[at − seconds, at]``, oldest first (for all GPUs in one
        query; through ``prefetch`` when the view has one)."""
        if self.prefetch is not None:
            return self.prefetch.rollups([g.id for g in self.gpus], gpu_id, self.at - seconds, self.at, columns)
        key = ("rollups", seconds, tuple(columns))
        ids = [g.id for g in self.gpus]
        rows = self._memo(key, lambda: self.store.rollup_series_many(ids, self.at - seconds, self.at, columns))
        return rows.get(gpu_id, [])

    def xids(self, seconds: float) -> list[tuple[float, int, int]]:
        return self._memo(("xids", seconds), lambda: self.store.host_xid_events(self.hostname, self.at - seconds, self.at))

    def events(self, seconds: float) -> list[GpuEventRow]:
        return self._memo(("events", seconds), lambda: self.store.gpu_events(self.hostname, self.at - seconds, self.at, self.gpus))

    def process_memory(self, seconds: float) -> list[ProcessMemoryRow]:
        ids = [g.id for g in self.gpus]
        if self.prefetch is not None:
            return self.prefetch.process_memory(ids, self.at - seconds, self.at)
        return self._memo(("procmem", seconds), lambda: self.store.process_memory_series(ids, self.at - seconds, self.at))

    def rejections(self, seconds: float) -> dict[str, dict[str, tuple[int, str]]]:
        return self._memo(("rejected", seconds), lambda: self.store.rejections(self.hostname, self.at - seconds, self.at))

    @property
    def topology(self) -> PcieTopology:
        return self._memo("topology", lambda: self.store.topology(self.hostname))

    @property
    def newest_host_sample(self) -> float | None:
        return self._memo("host_newest", lambda: self.store.newest_host_sample(self.hostname))

    # -- vLLM ------------------------------------------------------------------------------------

    @property
    def _vllm(self) -> VllmRepository:
        from vgpumon.store.vllm_repository import VllmRepository

        return self._memo("vllm_repo", lambda: VllmRepository(self.store.engine))

    @property
    def vllm_instances(self) -> list[VllmInstanceRow]:
        """Server starts of the host that began at or before ``at``, oldest first."""
        # the shape VllmRepository.instances reads (the table's columns)
        return self._memo("vllm", lambda: [cast("VllmInstanceRow", i) for i in self._vllm.instances(self.hostname) if i["first_seen"] <= self.at])

    def vllm_samples(self, instance_id: int, seconds: float | None) -> list[VllmRecord]:
        """Polls of one start in ``[at − seconds, at]`` (``None``: since the start)."""
        start = None if seconds is None else self.at - seconds
        return self._memo(("vllm_s", instance_id, seconds), lambda: self._vllm.samples(instance_id, start, self.at))

    def vllm_engine_samples(self, instance_id: int, seconds: float) -> "list[StoredEngineSample]":
        return self._memo(("vllm_e", instance_id, seconds), lambda: self._vllm.engine_samples(instance_id, self.at - seconds, self.at))

    def vllm_gpu_map(self, instance_id: int) -> "list[StoredGpuMapping]":
        return self._memo(("vllm_g", instance_id), lambda: self._vllm.gpu_map(instance_id))


#: A ``Prefetch`` read: the span read, then per GPU its rows and their times (for bisecting).
_Slices = tuple[float, float, dict[int, tuple[list[Row], list[float]]]]


class Prefetch:
    """Long reads shared by the views of several evaluation times: ``diagnose`` evaluates a rule
    with a ``for`` at up to six times (``Engine.evaluate_window``), and the leak rules read 6 h of
    rollups and process memory at each. The first read covers every evaluation time at once, the
    others slice it; raw rows likewise (the PCIe, thermal and replay rules). docs/benchmarks.md
    has the figures.

    Args:
        store: the store.
        first_at, last_at: the earliest and the latest evaluation time.
    """

    def __init__(self, store: Store, first_at: float, last_at: float) -> None:
        self.store = store
        self.first_at, self.last_at = first_at, last_at
        self._rollups: dict[tuple[str, ...], _Slices] = {}
        self._raw: dict[tuple[str, ...], _Slices] = {}
        self._procmem: tuple[float, float, list[ProcessMemoryRow]] | None = None

    def _span(self, start: float, end: float) -> tuple[float, float]:
        # views come in time order: the first request of a kind is its earliest; reading on to the
        # last evaluation time covers every later one (reading back to the first evaluation time
        # of any rule would read an hour of raw rows for a 10-minute window)
        return start, max(end, self.last_at)

    def _slice(self, cache: dict[tuple[str, ...], _Slices], key: tuple[str, ...], fetch: Callable[[float, float], dict[int, list[Row]]],
               gpu_id: int, start: float, end: float) -> list[Row]:
        have = cache.get(key)
        if have is None or start < have[0] or end > have[1]:
            lo, hi = self._span(start, end)
            fetched = fetch(lo, hi)
            have = cache[key] = (lo, hi, {g: (rs, [row_ts(r) for r in rs]) for g, rs in fetched.items()})
        rows, times = have[2].get(gpu_id, ([], []))
        return rows[bisect.bisect_left(times, start):bisect.bisect_right(times, end)]

    def rollups(self, gpu_ids: Sequence[int], gpu_id: int, start: float, end: float, columns: Sequence[str]) -> list[Row]:
        """1-minute rollups of one GPU over ``[start, end]`` (read for all GPUs and times at once)."""
        return self._slice(self._rollups, tuple(columns), lambda lo, hi: self.store.rollup_series_many(gpu_ids, lo, hi, columns),
                           gpu_id, start, end)

    def raw(self, gpu_ids: Sequence[int], gpu_id: int, start: float, end: float, columns: Sequence[str]) -> list[Row]:
        """Raw rows of one GPU over ``[start, end]`` (read for all GPUs and times at once)."""
        return self._slice(self._raw, tuple(columns), lambda lo, hi: self.store.series_many(gpu_ids, lo, hi, columns),
                           gpu_id, start, end)

    def process_memory(self, gpu_ids: Sequence[int], start: float, end: float) -> list[ProcessMemoryRow]:
        if self._procmem is None or start < self._procmem[0] or end > self._procmem[1]:  # noqa: SIM102
            lo, hi = self._span(start, end)
            self._procmem = (lo, hi, self.store.process_memory_series(gpu_ids, lo, hi))
        return [r for r in self._procmem[2] if start <= r["ts"] <= end]


class CarriedValues:
    """Newest values of the slow-set counters and flags, carried from one evaluation time to the
    next: the agent's rules runner reads, every 15 s, only the raw rows stored since its previous
    evaluation (and ``OVERLAP_SECONDS`` before it, for rows stored late), not the last
    ``Store.LAST_RAW_SECONDS`` of every GPU each time (960 rows of 8 GPUs for 120 rows that are
    new). The whole read (``Store.last_values_many``: raw rows, then the rollups) is made again
    at the first evaluation, whenever GPUs or columns change, when time goes backwards, and every
    ``FULL_EVERY_SECONDS``; the runner drops what it carries when it catches up after an outage
    (``forget``), whose oldest ticks may be stored only as rollups, which these reads do not see.

    A value answers as the whole read would: one older than that read looks back
    (``Store.LAST_RAW_SECONDS + Store.LAST_ROLLUP_SECONDS``) is no longer the current count and is
    dropped, as a GPU's values are once it stops reporting.

    Not thread-safe: one runner, one thread.
    """

    #: Seconds before the previous evaluation time read again: rows of a batch stored after the
    #: rules read (the store thread writes every few seconds).
    OVERLAP_SECONDS = 15.0
    #: Seconds between two whole reads (a row stored later than the overlap is found then).
    FULL_EVERY_SECONDS = 600.0
    #: How far behind the whole read's raw window a carried value is kept when that read misses
    #: it: the rollups of its minute are written within minutes (``Retention.step``).
    ROLLUP_LAG_SECONDS = 1800.0

    def __init__(self) -> None:
        self.forget()

    def forget(self) -> None:
        """Carry nothing: the next read is a whole one."""
        self._ids: list[int] = []
        self._columns: tuple[str, ...] = ()
        self._at: float | None = None
        self._full_at = 0.0
        self._values: dict[int, dict[str, LastValue]] = {}

    def read(self, store: StoreReads, gpu_ids: Sequence[int], at: float, columns: Sequence[str]) -> dict[int, dict[str, LastValue]]:
        """As ``Store.last_values_many(gpu_ids, at, columns)``, from the values carried from the
        previous call and the raw rows since.

        Raises:
            StoreUnavailableError: as the store's reads (nothing carried changes then).
        """
        ids = list(gpu_ids)
        prev = self._at
        if (prev is None or at < prev or ids != self._ids or any(c not in self._columns for c in columns)
                or at - self._full_at >= self.FULL_EVERY_SECONDS):
            cols = tuple(dict.fromkeys([*self._columns, *columns])) if ids == self._ids else tuple(columns)
            values = store.last_values_many(ids, at, cols)
            if ids == self._ids and prev is not None and 0 <= at - prev <= store.LAST_RAW_SECONDS:
                # a value older than the whole read's raw window, in a minute the rollups have not
                # reached yet, is one the store holds: keep it rather than forget it until they do
                recent = at - store.LAST_RAW_SECONDS - self.ROLLUP_LAG_SECONDS
                for gid, have in self._values.items():
                    for c, value in have.items():
                        if value is not None and value[0] >= recent and values[gid].get(c, value) is None:
                            values[gid][c] = value
            self._values = values
            self._ids, self._columns, self._at, self._full_at = ids, cols, at, at
        elif at > prev:
            fresh = store.newest_values(ids, prev - self.OVERLAP_SECONDS, at, self._columns)
            horizon = at - store.LAST_RAW_SECONDS - store.LAST_ROLLUP_SECONDS
            for gid, have in self._values.items():
                found = fresh.get(gid, {})
                for c in self._columns:
                    old, value = have.get(c), found.get(c)
                    if value is not None and (old is None or value[0] >= old[0]):
                        have[c] = value
                    elif old is not None and old[0] < horizon:
                        have[c] = None  # no longer the current count (a GPU that stopped reporting)
            self._at = at
        return {gid: {c: values.get(c) for c in columns} for gid, values in self._values.items()}
