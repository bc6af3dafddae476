"""Store benchmarks: ingest rate, bytes per stored value, 72 h window query; SQLite and Postgres,
each beside the raw driver doing the same work in the same run. Results: docs/benchmarks.md.

Data: the real H200 capture (tests/data) replayed once through the NVML collector; its 76 ticks
are cycled over 8 GPU ids at 1 s spacing, so every value has a real magnitude.

Usage:
    python bench/store_bench.py [--postgres URL] [--hours 72] [--out results.json]

``--postgres`` (or ``$VGPUMON_BENCH_POSTGRES_URL``) names a scratch database: its schema
``public`` is dropped and recreated. Without it only SQLite runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from sqlalchemy import text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vgpumon.agent import Agent  # noqa: E402
from vgpumon.diagnose import WINDOW_COLUMNS  # noqa: E402
from vgpumon.model import GpuIdentity  # noqa: E402
from vgpumon.sources.nvml import NvmlSource  # noqa: E402
from vgpumon.sources.nvml.capture import ReplayBackend  # noqa: E402
from vgpumon.store import Store, open_store  # noqa: E402
from vgpumon.store.codec import GPU_ROW_COLUMNS, encode_gpu_sample  # noqa: E402
from vgpumon.store.engine import make_engine  # noqa: E402
from vgpumon.store.retention import Retention  # noqa: E402
from vgpumon.store.schema import ROLLUP_SPEC, SAMPLE_VALUE_COLUMNS  # noqa: E402

CAPTURE = ROOT / "tests" / "data" / "h200-workload.jsonl.gz"
GPUS = 8
BATCH_TICKS = 60  # the agent flushes every 5 s by default; FACTS §6 floors use 1-minute batches
T0 = 1_796_000_000.0  # a fixed start (2026-11-29 UTC) so runs are comparable


def h200_samples() -> list[Any]:
    """The capture's samples (base units), one per tick, through the real collector."""
    collected: list[Any] = []
    agent = Agent(NvmlSource(ReplayBackend(CAPTURE)), None, hostname="bench", paced=False,
                  on_tick=lambda snap: collected.append(snap.samples[0]))
    asyncio.run(agent.run())
    return collected


def make_rows(samples: list[Any], gpu_ids: list[int], ticks: int) -> list[tuple[Any, ...]]:
    """``ticks`` × len(gpu_ids) encoded rows at 1 s spacing from T0, cycling the real samples."""
    base = [encode_gpu_sample(0, s) for s in samples]
    out = []
    for t in range(ticks):
        proto = base[t % len(base)]
        ts = int((T0 + t) * 1000)
        for g in gpu_ids:
            out.append((g, ts) + proto[2:])
    assert GPU_ROW_COLUMNS[:2] == ("gpu_id", "ts")
    return out


def batches(rows: list[tuple[Any, ...]], n_gpus: int) -> list[list[tuple[Any, ...]]]:
    size = BATCH_TICKS * n_gpus
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def empty_store(url: str) -> Store:
    """A store at ``url`` with the newest schema and nothing in it: a scratch Postgres database
    loses its schema ``public`` first (a SQLite file must not exist yet)."""
    if url.startswith("postgresql"):
        e = make_engine(url)
        with e.begin() as conn:
            conn.execute(text("DROP SCHEMA public CASCADE"))
            conn.execute(text("CREATE SCHEMA public"))
        e.dispose()
    return open_store(url)


def fresh_store(url: str) -> tuple[Store, list[int]]:
    store = empty_store(url)
    ids = store.register_gpus("bench-host", [GpuIdentity(index=i, uuid=f"GPU-bench-{i}") for i in range(GPUS)])
    return store, sorted(ids.values())


def rate(fn: Callable[[], None], rows: int, repeat: int = 3, setup: Callable[[], None] | None = None) -> float:
    """Median rows/s over ``repeat`` runs of ``fn`` (``setup`` before each, untimed)."""
    rates = []
    for _ in range(repeat):
        if setup:
            setup()
        t = time.perf_counter()
        fn()
        rates.append(rows / (time.perf_counter() - t))
    return statistics.median(rates)


# -- ingest ---------------------------------------------------------------------------------------


def ingest_sqlite(samples: list[Any], tmp: Path, ticks: int) -> dict[str, Any]:
    url = f"sqlite:///{tmp / 'ingest.db'}"
    store, ids = fresh_store(url)
    rows = make_rows(samples, ids, ticks)
    bs = batches(rows, len(ids))

    def clear() -> None:
        with store.engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM gpu_samples")

    def agent_path() -> None:
        for b in bs:
            store.write_gpu_rows(b)

    raw = sqlite3.connect(tmp / "ingest.db", isolation_level=None)
    raw.execute("PRAGMA journal_mode=WAL")
    raw.execute("PRAGMA synchronous=NORMAL")
    sql = f"INSERT INTO gpu_samples ({', '.join(GPU_ROW_COLUMNS)}) VALUES ({', '.join('?' * len(GPU_ROW_COLUMNS))})"

    def raw_path() -> None:
        for b in bs:
            raw.execute("BEGIN")
            raw.executemany(sql, b)
            raw.execute("COMMIT")

    r_agent = rate(agent_path, len(rows), setup=clear)
    r_raw = rate(raw_path, len(rows), setup=clear)
    raw.close()
    store.close()
    return {"rows": len(rows), "agent_rows_per_s": r_agent, "raw_rows_per_s": r_raw, "ratio": r_agent / r_raw}


def ingest_postgres(samples: list[Any], url: str, ticks: int) -> dict[str, Any]:
    import psycopg

    store, ids = fresh_store(url)
    rows = make_rows(samples, ids, ticks)
    bs = batches(rows, len(ids))
    store.write_gpu_rows(rows[:1])  # creates the day partitions: both paths then find them

    def clear() -> None:
        with store.engine.begin() as conn:
            conn.exec_driver_sql("TRUNCATE gpu_samples")

    def agent_path() -> None:
        for b in bs:
            store.write_gpu_rows(b)

    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    raw = psycopg.connect(dsn)
    cols = ", ".join(GPU_ROW_COLUMNS)

    def raw_path() -> None:
        for b in bs:
            with raw.cursor() as cur, cur.copy(f"COPY gpu_samples ({cols}) FROM STDIN") as cp:
                for r in b:
                    cp.write_row(r)
            raw.commit()

    r_agent = rate(agent_path, len(rows), setup=clear)
    r_raw = rate(raw_path, len(rows), setup=clear)
    raw.close()
    store.close()
    return {"rows": len(rows), "agent_rows_per_s": r_agent, "raw_rows_per_s": r_raw, "ratio": r_agent / r_raw}


def encode_cost(samples: list[Any]) -> float:
    """Seconds to encode one sample (done once per GPU per tick, at tick time)."""
    n = 20_000
    t = time.perf_counter()
    for i in range(n):
        encode_gpu_sample(1, samples[i % len(samples)])
    return (time.perf_counter() - t) / n


# -- size and window query --------------------------------------------------------------------------


def _null_share(rows: list[tuple[Any, ...]]) -> float:
    value_pos = [GPU_ROW_COLUMNS.index(c) for c in SAMPLE_VALUE_COLUMNS]
    sample = rows[: 76 * GPUS]
    nulls = sum(1 for r in sample for p in value_pos if r[p] is None)
    return nulls / (len(sample) * len(value_pos))


def size_and_query(samples: list[Any], url: str, hours: float) -> dict[str, Any]:
    """Store ``hours`` of 8 GPUs through the agent's write path, measure bytes per value, time
    the 72 h window queries, then roll everything up and measure the rollup table."""
    store, ids = fresh_store(url)
    ticks = int(hours * 3600)
    rows = make_rows(samples, ids, ticks)
    t = time.perf_counter()
    for b in batches(rows, len(ids)):
        store.write_gpu_rows(b)
    load_s = time.perf_counter() - t
    if store.dialect == "sqlite":
        with store.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    else:
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE gpu_samples")
    stats = {t["table"]: t for t in store.table_stats()}
    raw_bytes = stats["gpu_samples"]["bytes"]
    n_values = len(rows) * len(SAMPLE_VALUE_COLUMNS)
    null_share = _null_share(rows)
    out: dict[str, Any] = {
        "rows": len(rows),
        "load_s": load_s,
        "raw_bytes": raw_bytes,
        "raw_bytes_per_value": raw_bytes / n_values,
        "raw_bytes_per_non_null_value": raw_bytes / (n_values * (1 - null_share)),
        "null_share": null_share,
        "value_columns": len(SAMPLE_VALUE_COLUMNS),
    }
    end = T0 + ticks - 1
    start = end - 72 * 3600

    def window() -> None:  # diagnose's window: mean and max of 11 columns, all 8 GPUs in one query
        store.window_aggregates_many(ids, start, end, WINDOW_COLUMNS)

    def window_per_gpu() -> None:  # the same, one query per GPU (what diagnose does today)
        for g in ids:
            store.window_aggregates(g, start, end, WINDOW_COLUMNS)

    def latest() -> None:
        store.latest(ids, ("power_watts", "memory_used_bytes"))

    def p95() -> None:
        for g in ids:
            store.window_percentiles(g, start, end, ("pcie_rx_bytes_per_second",), (0.95,))

    for name, fn in (
        ("window_aggregates_8gpu_72h_s", window),
        ("window_aggregates_per_gpu_8gpu_72h_s", window_per_gpu),
        ("latest_8gpu_s", latest),
        ("percentile_1col_8gpu_72h_s", p95),
    ):
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        out[name] = statistics.median(times)
        out[name + "_first"] = times[0]

    # roll everything up (as the agent would over the days), then measure the rollup table
    t = time.perf_counter()
    res = Retention(store, raw_retention_s=1e9, rollup_retention_s=1e9, max_minutes=720, clock=lambda: end + 3600).run()
    out["rollup_s"] = time.perf_counter() - t
    out["rollup_minutes"] = res.minutes_rolled_up
    if store.dialect == "sqlite":
        with store.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    stats = {t["table"]: t for t in store.table_stats()}
    roll_values = stats["gpu_samples_1m"]["rows"] * sum(len(a) for a in ROLLUP_SPEC.values())
    out["rollup_rows"] = stats["gpu_samples_1m"]["rows"]
    out["rollup_bytes"] = stats["gpu_samples_1m"]["bytes"]
    out["rollup_bytes_per_value"] = stats["gpu_samples_1m"]["bytes"] / roll_values
    out["rollup_bytes_per_raw_value"] = stats["gpu_samples_1m"]["bytes"] / n_values
    store.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--postgres", default=os.environ.get("VGPUMON_BENCH_POSTGRES_URL"))
    ap.add_argument("--hours", type=float, default=72.0, help="history stored for the size and window-query runs")
    ap.add_argument("--ingest-ticks", type=int, default=3600, help="ticks of 8 GPUs per ingest run")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    samples = h200_samples()
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "loadavg_1m_5m_15m_at_start": os.getloadavg(),
        },
        "encode_seconds_per_row": encode_cost(samples),
    }
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        print("sqlite ingest ...", file=sys.stderr)
        results["sqlite_ingest"] = ingest_sqlite(samples, tmp, args.ingest_ticks)
        print("sqlite size/query ...", file=sys.stderr)
        results["sqlite_history"] = size_and_query(samples, f"sqlite:///{tmp / 'history.db'}", args.hours)
    if args.postgres:
        import psycopg

        with psycopg.connect(args.postgres.replace("postgresql+psycopg://", "postgresql://")) as c:
            results["machine"]["postgres"] = c.execute("SHOW server_version").fetchone()[0]
        print("postgres ingest ...", file=sys.stderr)
        results["postgres_ingest"] = ingest_postgres(samples, args.postgres, args.ingest_ticks)
        print("postgres size/query ...", file=sys.stderr)
        results["postgres_history"] = size_and_query(samples, args.postgres, args.hours)
    # the machine may be shared: the load average says whether other work competed for the cores
    results["machine"]["loadavg_1m_5m_15m_at_end"] = os.getloadavg()
    text_out = json.dumps(results, indent=2)
    print(text_out)
    if args.out:
        args.out.write_text(text_out + "\n")


if __name__ == "__main__":
    main()
