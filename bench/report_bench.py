"""How long the two commands people type under pressure take on a full store: ``diagnose`` (rules
included) of one host with 8 GPUs × 72 h of 1 s history, and ``capacity`` over 16 such hosts.
SQLite and Postgres. Results: docs/benchmarks.md ("diagnose and capacity").

Data: the real H200 capture (tests/data) replayed once through the NVML collector; its 76 ticks
are cycled over 8 GPUs at 1 s spacing for 72 h (2 073 600 raw rows), rolled up into 1-minute rows
by the store's own rollup code, with the 8-GPU incident's PCIe tree (four GPUs per Gen5 switch).
The first host is written through ``Store.write_gpu_rows`` in 1-hour batches; hosts 2–16 are
copies of it made inside the database (``INSERT … SELECT`` per GPU, raw rows and rollups), so that
16 hosts take minutes, not an hour. Every host has its own GPUs, UUIDs and topology.

Usage:
    python bench/report_bench.py --sqlite DIR [--postgres URL] [--hosts 16] [--hours 72] [--runs 5]

``--postgres`` names a scratch database: its schema ``public`` is dropped and recreated.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from store_bench import CAPTURE, empty_store, h200_samples  # noqa: E402  (bench/ is the script's directory)

from vgpumon.capacity import review  # noqa: E402
from vgpumon.diagnose import build_report  # noqa: E402
from vgpumon.model import GpuIdentity  # noqa: E402
from vgpumon.sources.nvml import NvmlSource  # noqa: E402
from vgpumon.sources.nvml.capture import ReplayBackend  # noqa: E402
from vgpumon.store import Store  # noqa: E402
from vgpumon.store.codec import GPU_ROW_COLUMNS, ROLLUP_ROW_COLUMNS, encode_gpu_sample  # noqa: E402
from vgpumon.store.rollup import rollup_rows  # noqa: E402
from vgpumon.testing.capacity import switch_tree  # noqa: E402

GPUS = 8
T0 = 1_796_000_000.0  # a fixed start (2026-11-29 UTC), a whole minute, so that runs compare


def h200() -> tuple[GpuIdentity, list[Any]]:
    """The capture's GPU identity and its samples (base units), one per tick, through the real collector."""
    source = NvmlSource(ReplayBackend(CAPTURE))
    (identity,) = source.start()
    source.close()
    return identity, h200_samples()


def identities(base: GpuIdentity, host: int) -> list[GpuIdentity]:
    from dataclasses import replace

    return [replace(base, index=i, uuid=f"GPU-bench-{host:02d}-{i}", serial=f"{host:02d}{i:04d}",
                    pci_bus_id=f"00000000:{0x80 + i:02X}:00.0") for i in range(GPUS)]


def register(store: Store, name: str, gpus: list[GpuIdentity]) -> list[int]:
    ids = store.register_gpus(name, gpus)
    host_id = store.host_id(name)
    assert host_id is not None
    store.replace_topology(host_id, switch_tree(gpus, per_switch=4, uplink=(5, 16), card_link=(5, 16)), ids, T0)
    return [ids[g.uuid] for g in gpus]


def first_host(store: Store, samples: list[Any], ids: list[int], hours: float) -> dict[str, float]:
    """Raw rows hour by hour through the agent's write path, each hour rolled up as the agent does."""
    base = [encode_gpu_sample(0, s) for s in samples]
    assert GPU_ROW_COLUMNS[:2] == ("gpu_id", "ts")
    write_s = rollup_s = 0.0
    held: list[Any] = []  # the rows of a minute that an hour's batch cuts (T0 is not a whole minute)
    for hour in range(int(hours)):
        rows = []
        for t in range(hour * 3600, (hour + 1) * 3600):
            proto = base[t % len(base)]
            ts = int((T0 + t) * 1000)
            rows.extend((g, ts) + proto[2:] for g in ids)
        t1 = time.perf_counter()
        store.write_gpu_rows(rows)
        t2 = time.perf_counter()
        # whole minutes only, as the agent rolls them up: a minute split over two batches would be
        # written twice, its second part replacing the first
        cut = rows[-1][1] - rows[-1][1] % 60_000
        whole = held + [r for r in rows if r[1] < cut]
        held = [r for r in rows if r[1] >= cut]
        store.write_rollup_rows(rollup_rows(whole))
        t3 = time.perf_counter()
        write_s, rollup_s = write_s + t2 - t1, rollup_s + t3 - t2
    store.write_rollup_rows(rollup_rows(held))
    with store.engine.begin() as conn:  # the rollups are current: freshness shows it
        for g in ids:
            conn.execute(text("INSERT INTO rollup_watermarks (gpu_id, rolled_until) VALUES (:g, :u)"),
                         {"g": g, "u": int((T0 + hours * 3600) * 1000)})
    return {"write_s": write_s, "rollup_s": rollup_s}


def copy_host(store: Store, src: list[int], dst: list[int]) -> None:
    """Raw rows and rollups of one host's GPUs copied to another's, inside the database."""
    raw_cols = ", ".join(c for c in GPU_ROW_COLUMNS if c != "gpu_id")
    roll_cols = ", ".join(c for c in ROLLUP_ROW_COLUMNS if c != "gpu_id")
    with store.engine.begin() as conn:
        for s, d in zip(src, dst):
            conn.execute(text(f"INSERT INTO gpu_samples (gpu_id, {raw_cols}) SELECT :d, {raw_cols} FROM gpu_samples WHERE gpu_id = :s"), {"s": s, "d": d})
            conn.execute(text(f"INSERT INTO gpu_samples_1m (gpu_id, {roll_cols}) SELECT :d, {roll_cols} FROM gpu_samples_1m WHERE gpu_id = :s"), {"s": s, "d": d})
            conn.execute(text("INSERT INTO rollup_watermarks (gpu_id, rolled_until) SELECT :d, rolled_until FROM rollup_watermarks WHERE gpu_id = :s"), {"s": s, "d": d})


def timed(fn: Any, runs: int) -> dict[str, Any]:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return {"first_s": times[0], "median_s": statistics.median(times), "all_s": times}


def cli(args: list[str], runs: int) -> dict[str, Any]:
    """Wall time of the command as people run it (a new process: imports included)."""
    empty = Path(tempfile.mkdtemp(prefix="report-bench-")) / "empty.toml"  # the defaults: no config file of this machine
    empty.write_text("")

    def once() -> None:
        out = subprocess.run([sys.executable, "-m", "vgpumon", *args], capture_output=True, text=True, env={**os.environ, "VGPUMON_CONFIG": str(empty)})
        assert out.returncode in (0, 1, 2), out.stdout[-2000:] + out.stderr[-2000:]

    return timed(once, runs)


def bench(url: str, hosts: int, hours: float, runs: int, reuse: bool = False) -> dict[str, Any]:
    names = [f"bench-{h:02d}" for h in range(hosts)]
    if reuse:
        probe = Store(url, read_only=True)
        try:
            reuse = set(names) <= set(probe.hostnames())
        finally:
            probe.close()
    load: dict[str, Any] = {"reused": True} if reuse else _load(url, hosts, hours)
    store = Store(url, read_only=True)
    with store.engine.connect() as conn:
        counts = {tbl: conn.scalar(text(f"SELECT count(*) FROM {tbl}")) for tbl in ("gpu_samples", "gpu_samples_1m")}
    store.close()
    return _measure(url, names, hours, runs, load, counts)


def _load(url: str, hosts: int, hours: float) -> dict[str, Any]:
    ident, samples = h200()
    store = empty_store(url)
    t = time.perf_counter()
    ids0 = register(store, "bench-00", identities(ident, 0))
    load = first_host(store, samples, ids0, hours)
    for h in range(1, hosts):
        copy_host(store, ids0, register(store, f"bench-{h:02d}", identities(ident, h)))
    if store.dialect == "postgresql":
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))
    else:
        with store.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.exec_driver_sql("ANALYZE")
    load["total_s"] = time.perf_counter() - t
    store.close()
    return load


def _measure(url: str, names: list[str], hours: float, runs: int, load: dict[str, Any], counts: dict[str, Any]) -> dict[str, Any]:
    reader = Store(url, read_only=True)
    report = build_report(reader, "bench-00", now=T0 + hours * 3600)
    out = {
        "url": url.split(":", 1)[0].split("+")[0],  # the engine only: no path or database name in results
        "rows": counts,
        "load": load,
        "diagnose_status": report["status"],
        "diagnose_build_report": timed(lambda: build_report(reader, "bench-00", now=T0 + hours * 3600), runs),
        "diagnose_build_report_whole_window": timed(
            lambda: build_report(reader, "bench-00", now=T0 + hours * 3600, window_seconds=hours * 3600), runs),
        "capacity_review": timed(lambda: review(reader, names, window_seconds=hours * 3600), runs),
    }
    reader.close()
    out["diagnose_cli"] = cli(["diagnose", "bench-00", "--db", url], 3)
    out["diagnose_cli_whole_window"] = cli(["diagnose", "bench-00", "--db", url, "--window", f"{int(hours)}h"], 3)
    out["capacity_cli"] = cli(["capacity", "--db", url, "--window", f"{int(hours)}h"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sqlite", type=Path, help="directory for the SQLite store (about 3.5 GB for 16 hosts × 72 h)")
    ap.add_argument("--postgres", default=os.environ.get("VGPUMON_BENCH_POSTGRES_URL"), help="scratch Postgres database URL")
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--hours", type=float, default=72.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--reuse", action="store_true", help="measure a store an earlier run loaded (same --hosts), without loading it again")
    args = ap.parse_args()
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()},
                               "hosts": args.hosts, "hours": args.hours}
    if args.sqlite:
        args.sqlite.mkdir(parents=True, exist_ok=True)
        db = args.sqlite / "report-bench.db"
        if not args.reuse:
            for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
                p.unlink(missing_ok=True)
        results["sqlite"] = bench(f"sqlite:///{db}", args.hosts, args.hours, args.runs, reuse=args.reuse and db.exists())
        print(json.dumps(results["sqlite"], indent=1), flush=True)
    if args.postgres:
        results["postgres"] = bench(args.postgres, args.hosts, args.hours, args.runs, reuse=args.reuse)
        print(json.dumps(results["postgres"], indent=1), flush=True)
    results["machine"]["load_after"] = os.getloadavg()
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
