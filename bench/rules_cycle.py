"""CPU of the agent's rules cycles over a stored host, as the agent's rules runner makes them:
reading every window from the store (``RuleRunner(in_memory=False)``, the agent before issue 27)
and from the windows the agent keeps in memory (``vgpumon.alerts.windows``, the agent now),
side by side in one run over the same store.

Walks the last ``--minutes`` of the store's newest data in steps of the runner's interval (15 s
of data time), each step one ``RuleRunner`` cycle (each rule at its own cadence, as in the
agent), and reports the CPU time (``time.process_time``) per cycle. In memory mode the stored
rows are fed to the windows tick by tick, as the agent's store thread feeds each batch it wrote
(their CPU is reported apart: it is spent on the store thread, not the rules') and the windows restore from the
store at the first cycles of the ``--warm`` minutes, as a restarted agent's do; the store's
"newest tick" is the walk's time, so nothing after it is read. The findings of the two modes are
compared at every cycle. Every complete minute of the store is rolled up first (in the data's time,
so nothing is pruned), as the agent's retention leaves it. The store is made by replaying a derived capture
(``bench/replay_memory.py``'s ``derive``) with ``vgpumon agent --replay … --hostname h``.

Usage:
  python3 bench/rules_cycle.py --db sqlite:////tmp/rc/x8.db [--minutes 10] [--warm 5] [--json]
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))


def _walk(db: str, hostname: str, minutes: float, warm: float, in_memory: bool) -> dict:
    from vgpumon.alerts.runner import RuleRunner
    from vgpumon.alerts.windows import RuleWindows
    from vgpumon.store import Store
    from vgpumon.store.codec import GPU_ROW_COLUMNS

    store = Store(db)
    gpus = store.gpus_of(hostname)
    ids = [g.id for g in gpus]
    newest = store.newest_ts(ids)
    if newest is None:
        sys.exit(f"no rows for host {hostname!r} in {db}")
    runner = RuleRunner(wall=None, in_memory=in_memory)
    runner._store, runner._hostname = store, hostname  # the agent's start(), without its sinks
    begin = newest - (minutes + warm) * 60
    rows = sorted(store.stored_rows(ids, begin, newest, GPU_ROW_COLUMNS[2:]), key=lambda r: (r[1], r[0]))
    times = sorted({r[1] / 1000.0 for r in rows})
    target = begin
    now = [times[0]]
    # the "newest tick" the runner sees: the newest stored one at the walk's time, in both modes
    store.newest_ts = lambda ids: now[0]  # type: ignore[method-assign]
    runner._last_at = now[0] - runner.interval
    if in_memory:
        runner.windows = RuleWindows(store, hostname)
    fed, feed_cpu, ticks = 0, 0.0, 0
    cycles, findings = [], []
    while target <= newest:
        now[0] = times[max(bisect.bisect_right(times, target) - 1, 0)]
        if in_memory:
            assert runner.windows is not None
            limit = int(round(now[0] * 1000))
            while fed < len(rows) and rows[fed][1] <= limit:
                k = fed
                while k < len(rows) and rows[k][1] == rows[fed][1]:
                    k += 1
                t0 = time.process_time()
                runner.windows.feed(rows[fed:k])
                feed_cpu += time.process_time() - t0
                fed, ticks = k, ticks + 1
        misses = runner.windows.misses if runner.windows is not None else 0
        t0 = time.process_time()
        runner._evaluate()
        spent = (time.process_time() - t0) * 1e3
        if target > newest - minutes * 60:
            cycles.append(spent)
            if runner.windows is not None and runner.windows.misses != misses:
                print(f"memory: a measured cycle read the store ({runner.windows.misses - misses} reads)", file=sys.stderr)
        findings.append(sorted((f.rule, tuple(sorted(f.labels.items())), f.state, f.value, f.reason)
                               for found in runner._newest.values() for f in found))
        target += runner.interval
    store.close()
    out = {"gpus": len(gpus), "cycles": len(cycles), "mean_ms": statistics.mean(cycles),
           "median_ms": statistics.median(cycles), "max_ms": max(cycles),
           "cpu_share_pct": statistics.mean(cycles) / 1e3 / runner.interval * 100, "findings": findings}
    if in_memory:
        assert runner.windows is not None
        out["feed_us_per_tick"] = feed_cpu / max(ticks, 1) * 1e6
        out["feed_share_pct"] = feed_cpu / max(ticks, 1) / 1.0 * 100  # at one tick a second
        out["held"] = runner.windows.size()
        out["restores"] = runner.windows.restores
    return out


def _roll_up(db: str, hostname: str) -> None:
    """Roll up every complete minute of the store, as the agent's retention steps do while it
    runs (a fast replay ends before they catch up; memory rolls each minute up as it completes),
    in the data's time: nothing is pruned."""
    from vgpumon.store import Store
    from vgpumon.store.retention import Retention

    store = Store(db)
    try:
        ids = [g.id for g in store.gpus_of(hostname)]
        newest = store.newest_ts(ids) or 0.0
        Retention(store, clock=lambda: newest, host_id=store.host_id(hostname), active_gpus=set(ids)).run()
    finally:
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True)
    ap.add_argument("--hostname", default="h")
    ap.add_argument("--minutes", type=float, default=10.0, help="cycles measured: this much data time, at the end of the store")
    ap.add_argument("--warm", type=float, default=5.0, help="minutes of cycles before, not measured (the runner's state fills)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    _roll_up(args.db, args.hostname)
    store = _walk(args.db, args.hostname, args.minutes, args.warm, in_memory=False)
    memory = _walk(args.db, args.hostname, args.minutes, args.warm, in_memory=True)
    differ = sum(1 for a, b in zip(store.pop("findings"), memory.pop("findings")) if a != b)
    out = {"store": store, "memory": memory, "cycles_with_different_findings": differ,
           "ratio": memory["mean_ms"] / store["mean_ms"]}
    if args.json:
        print(json.dumps(out))
        return
    for name, r in (("from the store", store), ("from memory", memory)):
        print(f"{name}: {r['gpus']} GPU(s), {r['cycles']} cycles: mean {r['mean_ms']:.2f} ms, median {r['median_ms']:.2f}, "
              f"max {r['max_ms']:.2f} ms of CPU a cycle; {r['cpu_share_pct']:.4f} % of a core")
    print(f"memory ÷ store: {out['ratio']:.3f}×; feeding the windows {memory['feed_us_per_tick']:.1f} µs a tick "
          f"({memory['feed_share_pct']:.4f} % of a core at 1 Hz); held {memory['held']}; restores {memory['restores']}; "
          f"cycles whose findings differ: {differ}")


if __name__ == "__main__":
    main()
