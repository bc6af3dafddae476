"""What one agent's upkeep (rollups and retention) costs a shared store as the fleet grows.

N hosts of 8 GPUs write 1-Hz rows (the recorded H200 capture's stored values, repeated) in 10-s
batches, fast-forwarded in data time, and each runs its retention step every 60 s of data, as the
agent does. Two hosts are measured side by side in the same store and the same run: ``own``, the
agent's upkeep as it is (its own host's rows only), and ``whole store``, as it was before (every
GPU of the store walked by every agent's step). Counted per host-second of data, client side so
that the figures do not depend on the machine's load: statements sent, rows they returned, and
the upkeep's wall time (which does).

    python bench/fleet_store.py --url postgresql+psycopg://postgres@127.0.0.1/bench --hosts 16,64 \\
        --json bench/results/fleet_store.json

The URL's database is emptied (its ``public`` schema dropped) before each fleet size.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import event, text  # noqa: E402

from vgpumon.model import GpuIdentity  # noqa: E402
from vgpumon.store import open_store  # noqa: E402
from vgpumon.store.codec import GPU_ROW_COLUMNS  # noqa: E402
from vgpumon.store.engine import make_engine  # noqa: E402
from vgpumon.store.retention import Retention  # noqa: E402

CAPTURE = ROOT / "tests" / "data" / "h200-workload.jsonl.gz"
GPUS_PER_HOST = 8
START_MS = 1_780_000_000_000  # 2026-05-28, a fixed data time


def template_rows() -> list[tuple[Any, ...]]:
    """The stored rows of the H200 capture (a replay into a scratch SQLite store)."""
    import asyncio

    from vgpumon.agent import Agent
    from vgpumon.sources.nvml import NvmlSource
    from vgpumon.sources.nvml.capture import ReplayBackend

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/seed.db"
        store = open_store(url)
        asyncio.run(Agent(NvmlSource(ReplayBackend(CAPTURE)), store, hostname="seed", paced=False).run())
        store.close()
        engine = make_engine(url)
        cols = ", ".join(f'"{c}"' for c in GPU_ROW_COLUMNS)
        with engine.connect() as conn:
            rows = [tuple(r) for r in conn.execute(text(f"SELECT {cols} FROM gpu_samples ORDER BY ts"))]  # noqa: S608  identifiers from the schema
        engine.dispose()
    return rows


def reset(url: str) -> None:
    engine = make_engine(url)
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(text("DROP SCHEMA public CASCADE"))
            conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


class Counted:
    """Statements and returned rows of the calls made inside ``with counted:``."""

    def __init__(self, engine: Any) -> None:
        self.statements = 0
        self.rows = 0
        self.seconds = 0.0
        self._on = False
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)

    def _before(self, *args: Any) -> None:
        if self._on:
            self.statements += 1

    def _after(self, conn: Any, cursor: Any, *args: Any) -> None:
        if self._on and cursor.description is not None:
            self.rows += max(cursor.rowcount, 0)

    def __enter__(self) -> "Counted":
        self._on = True
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.perf_counter() - self._t0
        self._on = False


_STAT = ("xact_commit", "tup_inserted", "tup_fetched", "tup_returned", "tup_updated", "tup_deleted")


class ServerSide:
    """What the database server did over ``with``: its backends' CPU for this database (from
    /proc, the server on this machine: root or the ``postgres`` user), WAL bytes, and
    ``pg_stat_database``'s transactions and tuples."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.cpu_s = self.wal_bytes = 0.0
        self.stats: dict[str, float] = dict.fromkeys(_STAT, 0.0)

    def _sample(self) -> tuple[dict[int, float], str, dict[str, float]]:
        with self.store.engine.connect() as conn:
            conn.execute(text("SELECT pg_stat_clear_snapshot()"))
            pids = [r[0] for r in conn.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()"))]
            lsn = conn.scalar(text("SELECT pg_current_wal_lsn()::text"))
            row = conn.execute(text(f"SELECT {', '.join(_STAT)} FROM pg_stat_database WHERE datname = current_database()")).one()  # noqa: S608  column names are ours
        return {p: _cpu_seconds(p) for p in pids}, lsn, dict(zip(_STAT, map(float, row)))

    def __enter__(self) -> "ServerSide":
        self._before = self._sample()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.6)  # pg_stat_database is updated by the backends at most every 500 ms (PGSTAT_MIN_INTERVAL)
        cpu, lsn, stats = self._sample()
        before_cpu, before_lsn, before_stats = self._before
        # a backend that left during the run is not counted; the pool keeps its connections
        self.cpu_s += sum(v - before_cpu.get(p, 0.0) for p, v in cpu.items())
        with self.store.engine.connect() as conn:
            self.wal_bytes += float(conn.scalar(text("SELECT pg_wal_lsn_diff(:a, :b)"), {"a": lsn, "b": before_lsn}))
        for k in _STAT:
            self.stats[k] += stats[k] - before_stats[k]


def _cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of one process (0 once it is gone)."""
    import os

    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_floor(url: str, hosts: int, seconds: int, templates: list[tuple[Any, ...]]) -> dict[str, float]:
    """The same fleet's inserts alone (no rollups, no retention): the floor of the server's work."""
    reset(url)
    store = open_store(url)
    ids = [sorted(store.register_gpus(f"host-{h:04d}", [GpuIdentity(index=i, uuid=f"GPU-{h:04d}-{i}") for i in range(GPUS_PER_HOST)]).values())
           for h in range(hosts)]
    empty = _database_bytes(store)
    with ServerSide(store) as server:
        for t0 in range(0, seconds, 10):
            for gpu_ids in ids:
                batch = []
                for t in range(t0, t0 + 10):
                    values = templates[t % len(templates)][2:]
                    batch += [(g, START_MS + t * 1000, *values) for g in gpu_ids]
                store.write_gpu_rows(batch)
    size = _database_bytes(store) - empty
    store.close()
    return _per_host(server, hosts, seconds, size)


def _database_bytes(store: Any) -> float:
    with store.engine.connect() as conn:
        conn.execute(text("CHECKPOINT"))
        return float(conn.scalar(text("SELECT pg_database_size(current_database())")))


def _per_host(server: ServerSide, hosts: int, seconds: int, size: float) -> dict[str, float]:
    host_seconds = hosts * seconds
    out = {
        "server_cpu_percent_of_a_core_per_host": 100 * server.cpu_s / host_seconds,
        "wal_bytes_per_host_second": server.wal_bytes / host_seconds,
        "transactions_per_host_second": server.stats["xact_commit"] / host_seconds,
        "tuples_inserted_per_host_second": server.stats["tup_inserted"] / host_seconds,
        "tuples_fetched_per_host_second": server.stats["tup_fetched"] / host_seconds,
        "tuples_returned_per_host_second": server.stats["tup_returned"] / host_seconds,
        "database_bytes_per_host_day": size / hosts * 86400 / seconds,
    }
    return out


def fleet(url: str, hosts: int, seconds: int, templates: list[tuple[Any, ...]], legacy: bool = True) -> dict[str, Any]:
    """One fleet's run; with ``legacy``, host-0001's upkeep walks the whole store, as before."""
    reset(url)
    store = open_store(url)
    ids: dict[str, list[int]] = {}
    for h in range(hosts):
        name = f"host-{h:04d}"
        got = store.register_gpus(name, [GpuIdentity(index=i, uuid=f"GPU-{h:04d}-{i}") for i in range(GPUS_PER_HOST)])
        ids[name] = sorted(got.values())
    clock_ms = [START_MS]

    def job(name: str, own: bool) -> Retention:
        host_id = store.host_id(name)
        return Retention(store, clock=lambda: clock_ms[0] / 1000, host_id=host_id if own else None, active_gpus=set(ids[name]))

    jobs = {name: job(name, own=not (legacy and name == "host-0001")) for name in ids}  # host-0001: as before
    measured = {"own": Counted(store.engine), "whole store": Counted(store.engine)}
    empty = _database_bytes(store)  # the schema and the hosts' registrations
    server = ServerSide(store).__enter__()
    for t0 in range(0, seconds, 10):
        for gpu_ids in ids.values():
            batch = []
            for t in range(t0, t0 + 10):
                values = templates[t % len(templates)][2:]
                batch += [(g, START_MS + t * 1000, *values) for g in gpu_ids]
            store.write_gpu_rows(batch)
        clock_ms[0] = START_MS + (t0 + 10) * 1000
        if (t0 + 10) % 60 == 0:
            for name, retention in jobs.items():
                key = "own" if name == "host-0000" else "whole store" if legacy and name == "host-0001" else None
                if key is None:
                    retention.step()
                    continue
                with measured[key]:
                    retention.step()
    server.__exit__(None, None, None)
    size = _database_bytes(store) - empty
    from vgpumon.capacity import review

    t = time.perf_counter()
    review(store, list(ids), window_seconds=seconds)
    review_s = time.perf_counter() - t
    store.close()
    host_seconds = seconds  # each measured host's own seconds of data
    out: dict[str, Any] = {
        mode: {"statements_per_host_second": c.statements / host_seconds, "rows_per_host_second": c.rows / host_seconds,
               "upkeep_ms_per_host_second": 1000 * c.seconds / host_seconds}
        for mode, c in measured.items()
    }
    # the server's side of the whole fleet, per host (with ``legacy``, host-0001's walk included)
    out["server"] = _per_host(server, hosts, seconds, size)
    out["capacity_review_s"] = review_s
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="store URL; its database is emptied first")
    ap.add_argument("--hosts", default="16,64", help="fleet sizes, comma-separated (default 16,64)")
    ap.add_argument("--seconds", type=int, default=600, help="seconds of data per host (default 600)")
    ap.add_argument("--json", type=Path, help="write the results here too")
    ap.add_argument("--server-side", action="store_true",
                    help="also the database server's CPU (its backends, from /proc: the server on this machine), WAL, "
                         "transactions, tuples and size per host, each beside the same fleet's inserts alone")
    args = ap.parse_args(argv)
    templates = template_rows()
    results = {}
    print(f"{'hosts':>5}  {'upkeep':<12} {'statements/host-s':>18} {'rows/host-s':>12} {'ms/host-s':>10}")
    for n in (int(x) for x in args.hosts.split(",")):
        results[n] = fleet(args.url, n, args.seconds, templates)
        for mode in ("own", "whole store"):
            r = results[n][mode]
            print(f"{n:>5}  {mode:<12} {r['statements_per_host_second']:>18.3f} {r['rows_per_host_second']:>12.2f} "
                  f"{r['upkeep_ms_per_host_second']:>10.3f}")
        if args.server_side:
            # every host as the agent is now (none walks the whole store), beside its inserts alone
            now = fleet(args.url, n, args.seconds, templates, legacy=False)
            results[n]["server"], results[n]["capacity_review_s"] = now["server"], now["capacity_review_s"]
            results[n]["server_floor"] = server_floor(args.url, n, args.seconds, templates)
            for key, fleet_v in results[n]["server"].items():
                floor = results[n]["server_floor"][key]
                ratio = f"{fleet_v / floor:6.2f}x" if floor else "     -"
                print(f"{n:>5}  server {key:<42} {fleet_v:>14.4f}  inserts alone {floor:>14.4f}  {ratio}")
        print(f"{n:>5}  capacity review over {n} hosts x {args.seconds} s: {results[n]['capacity_review_s']:.2f} s")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "gpus_per_host": GPUS_PER_HOST,
                                         "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
