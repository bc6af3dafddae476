"""An accelerated soak: a day of 1-Hz ticks (86 400) replayed as fast as the agent goes, with its
``/metrics`` scraped all along, and the agent process watched from outside: resident memory,
threads, open files, the spool's and the store's size over time (docs/reliability.md, "Soak").

    python bench/soak.py                      # 86 400 ticks (a day at 1 Hz), a few minutes
    python bench/soak.py --ticks 5000         # the short run .ci/run makes

The capture is the recorded H200 one, repeated (one GPU: the agent's per-process costs are what a
soak looks for). Exits 1 when resident memory grows by more than ``--max-growth-mib`` (5) after
the warm-up, when a tick is lost, or when the agent fails.

Warm-up is the longest window of per-tick rows a rule reads (the leak fit's 6 h and its step
look-back, 10 min: 22 200 ticks at 1 Hz, ``LONGEST_WINDOW_S``): until the data has spanned it,
every evaluation reads a longer window than the last, and the agent's memory rises with it,
bounded by that window. The run's samples are taken as the ticks go at an even pace, so the
warm-up is that share of the run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vgpumon.config.thresholds import Thresholds  # noqa: E402
from vgpumon.sources.nvml.capture import read_capture  # noqa: E402
from vgpumon.testing import scenarios  # noqa: E402

CAPTURE = ROOT / "tests" / "data" / "h200-workload.jsonl.gz"
#: The longest window of per-tick rows any rule reads, in data seconds: the leak fit and its step look-back.
LONGEST_WINDOW_S = Thresholds().leak_fit_seconds + Thresholds().leak_step_seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_status(pid: int) -> dict[str, float]:
    fields: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "Threads"):
            fields[key] = float(value.split()[0])
    fields["fds"] = float(len(os.listdir(f"/proc/{pid}/fd")))
    return fields


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ticks", type=int, default=86_400, help="ticks to replay (default 86 400: a day at 1 Hz)")
    ap.add_argument("--every", type=float, default=0.25, help="seconds between samples of the agent process (default 0.25)")
    ap.add_argument("--max-growth-mib", type=float, default=5.0, help="resident-memory growth allowed after the warm-up, MiB")
    ap.add_argument("--json", type=Path, help="write the series and the summary here")
    args = ap.parse_args(argv)
    warmup_share = LONGEST_WINDOW_S / args.ticks  # at 1 Hz, a tick is a data second
    if warmup_share > 0.8:
        ap.error(f"--ticks {args.ticks}: the run must be longer than its warm-up, the longest rule window "
                 f"({LONGEST_WINDOW_S:.0f} ticks at 1 Hz) and a fifth: at least {math.ceil(LONGEST_WINDOW_S / 0.8)}")
    header, ticks = read_capture(CAPTURE)
    ticks = list(ticks)
    per_pass = sum(1 for t in ticks if t["tick"] >= 0)
    header, ticks = scenarios.repeat(header, ticks, math.ceil(args.ticks / per_pass))
    header, ticks = scenarios.between(header, list(ticks), float("-inf"), float("inf"))
    body = [t for t in ticks if t["tick"] >= 0][: args.ticks]
    ticks = [t for t in ticks if t["tick"] < 0] + body
    with tempfile.TemporaryDirectory(prefix="vgpumon-soak-") as d:
        tmp = Path(d)
        cap, db, spool = tmp / "soak.jsonl.gz", tmp / "soak.db", tmp / "spool"
        scenarios.write(cap, header, ticks)
        port = free_port()
        cmd = [sys.executable, "-m", "vgpumon", "agent", "--replay", str(cap), "--pace", "fast", "--db", f"sqlite:///{db}",
               "--spool", str(spool), "--hostname", "soak", "--listen", f"127.0.0.1:{port}"]
        started = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
        series: list[dict[str, float]] = []
        scrapes = failed = 0
        while proc.poll() is None:
            try:
                st = proc_status(proc.pid)
            except (OSError, ValueError):
                break  # it just ended
            if "VmRSS" not in st:
                break  # it just ended: an exited process not yet reaped (a zombie) has no resident set
            st.update(t=round(time.monotonic() - started, 2), spool_bytes=size_of(spool),
                      store_bytes=size_of(db) + size_of(db.with_name(db.name + "-wal")))
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:  # noqa: S310  our own agent on loopback
                    r.read()
                scrapes += 1
            except OSError:
                failed += 1  # not listening yet, or ending
            if scrapes:  # from the first answered scrape on: the agent runs
                series.append(st)
            time.sleep(args.every)
        out, err = proc.communicate(timeout=600)
        with sqlite3.connect(db) as conn:
            stored = conn.execute("SELECT count(DISTINCT ts) FROM gpu_samples").fetchone()[0]
            integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
        elapsed = time.monotonic() - started
    warm = series[math.ceil(len(series) * warmup_share):] or series  # after the warm-up (module docstring)
    rss = [s["VmRSS"] / 1024 for s in warm]
    summary: dict[str, Any] = {
        "ticks": len(body), "warmup_ticks": round(LONGEST_WINDOW_S), "stored_ticks": stored, "agent_exit": proc.returncode, "seconds": round(elapsed, 1),
        "samples": len(series), "scrapes_answered": scrapes, "scrapes_failed": failed,
        "rss_mib_after_warmup": {"first": round(rss[0], 1), "min": round(min(rss), 1), "max": round(max(rss), 1),
                                "last": round(rss[-1], 1)} if rss else None,
        "rss_growth_mib": round(rss[-1] - rss[0], 1) if rss else None,
        "threads_max": max((s["Threads"] for s in series), default=0), "fds_max": max((s["fds"] for s in series), default=0),
        "fds_after_warmup": [min(s["fds"] for s in warm), max(s["fds"] for s in warm)] if warm else None,
        "spool_bytes_max": max((s["spool_bytes"] for s in series), default=0),
        "store_bytes_last": series[-1]["store_bytes"] if series else 0, "integrity_check": integrity,
        "agent_said": [line.replace(d, "<tmp>") for line in (out + err).decode(errors="replace").strip().splitlines()[-2:]],
        "agent_errors": [line for line in err.decode(errors="replace").splitlines() if "ERROR" in line or "Traceback" in line][:5],
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "series": series}, indent=1) + "\n")
    ok = (proc.returncode == 0 and stored == len(body) and integrity == "ok" and summary["rss_growth_mib"] is not None
          and summary["rss_growth_mib"] < args.max_growth_mib and not summary["agent_errors"])
    print("soak: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
