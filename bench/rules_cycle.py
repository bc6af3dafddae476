"""CPU of the agent's rules cycles over a stored host, as the agent's rules runner makes them.

Walks the last ``--minutes`` of the store's newest data in steps of the runner's interval (15 s
of data time), each step one ``RuleRunner`` cycle (each rule at its own cadence, values carried
from cycle to cycle as in the agent), and reports the CPU time (``time.process_time``) per cycle.
The store is made by replaying a derived capture (``bench/replay_memory.py``'s ``derive``) with
``vgpumon agent --replay … --hostname h``.

Usage:
  python3 bench/rules_cycle.py --db sqlite:////tmp/rc/x8.db [--minutes 10] [--warm 5]

To compare two revisions side by side, run it from a ``git worktree`` of each in one session, on
the same store (docs/benchmarks.md, "Rules cycle").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True)
    ap.add_argument("--hostname", default="h")
    ap.add_argument("--minutes", type=float, default=10.0, help="cycles measured: this much data time, at the end of the store")
    ap.add_argument("--warm", type=float, default=5.0, help="minutes of cycles before, not measured (the runner's state fills)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from vgpumon.alerts.runner import RuleRunner
    from vgpumon.store import Store

    store = Store(args.db)
    gpus = store.gpus_of(args.hostname)
    newest = store.newest_ts([g.id for g in gpus])
    if newest is None:
        sys.exit(f"no rows for host {args.hostname!r} in {args.db}")
    runner = RuleRunner(wall=None)
    runner._store, runner._hostname = store, args.hostname  # the agent's start(), without its sinks
    now = [newest - (args.minutes + args.warm) * 60]
    store.newest_ts = lambda ids: now[0]  # type: ignore[method-assign]  # the "newest tick" the runner sees
    runner._last_at = now[0] - runner.interval
    cycles = []
    while now[0] <= newest:
        t0 = time.process_time()
        runner._evaluate()
        if now[0] > newest - args.minutes * 60:
            cycles.append((time.process_time() - t0) * 1e3)
        now[0] += runner.interval
    store.close()
    out = {"gpus": len(gpus), "cycles": len(cycles), "mean_ms": statistics.mean(cycles),
           "median_ms": statistics.median(cycles), "max_ms": max(cycles),
           "cpu_share_pct": statistics.mean(cycles) / 1e3 / runner.interval * 100}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{out['gpus']} GPU(s), {out['cycles']} cycles every {runner.interval:g} s: mean {out['mean_ms']:.2f} ms, "
              f"median {out['median_ms']:.2f}, max {out['max_ms']:.2f} ms of CPU; {out['cpu_share_pct']:.4f} % of a core")


if __name__ == "__main__":
    main()
