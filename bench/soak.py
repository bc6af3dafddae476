"""The accelerated soak (opt-in): the agent replays the recorded H200 capture repeated to a day of
ticks (86 400 at the recorded 1 s interval) as fast as it can, into a SQLite store, with
``/metrics`` scraped twice a second, while its resident memory, threads, open files, spool and
store size are read every second.

    python bench/soak.py --ticks 86400 --json bench/results/soak-24h.json

Its figures: growth of the resident set after warm-up (the median of the last tenth of the
samples against the median of the five samples after the agent has ticked ``--warmup-ticks``
times), threads and open files at the start and the end, store bytes per tick. CI runs a short
version (``--ticks 40000``). The last line printed is a one-line JSON summary; the
exit status is 1 when the growth is 5 MB or more. Results: docs/reliability.md, "Soak".
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vgpumon.testing import scenarios  # noqa: E402
from vgpumon.testing.vllm import free_port  # noqa: E402

CAPTURE = ROOT / "tests" / "data" / "h200-workload.jsonl.gz"
GROWTH_LIMIT_MB = 5.0


def _capture(ticks: int, where: Path) -> Path:
    """The recorded capture repeated until it holds at least ``ticks`` ticks, gzipped."""
    header, body = scenarios.load(str(CAPTURE))
    body = list(body)
    per_pass = sum(1 for t in body if t["tick"] >= 0)
    header, looped = scenarios.repeat(header, body, -(-ticks // per_pass))
    path = where / "soak.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(header) + "\n")
        for t in looped:
            f.write(json.dumps(t, separators=(",", ":")) + "\n")
    return path


def _size(*paths: Path) -> int:
    total = 0
    for p in paths:
        if p.is_dir():
            total += sum(q.stat().st_size for q in p.rglob("*") if q.is_file())
        elif p.exists():
            total += p.stat().st_size
    return total


def _ticks(port: int) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:  # noqa: S310 - our own agent on loopback
            for line in answer.read().decode().splitlines():
                if line.startswith("vgpumon_agent_ticks_total"):
                    return float(line.rsplit(" ", 1)[1])
    except OSError:
        return None
    return None


def run(ticks: int, warmup_ticks: int = 20_000, scrape_every: float = 0.5) -> dict:
    work = Path(tempfile.mkdtemp(prefix="vgpumon-soak-"))
    capture = _capture(ticks, work)
    db, spool = work / "soak.db", work / "state" / "vgpumon" / "spool"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUMON_")}
    env["XDG_STATE_HOME"] = str(work / "state")
    agent = subprocess.Popen([sys.executable, "-m", "vgpumon", "agent", "--listen", f"127.0.0.1:{port}", "--replay", str(capture),  # noqa: S603 - this interpreter, fixed arguments
                              "--db", str(db), "--hostname", "soak"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc = psutil.Process(agent.pid)
    samples: list[dict] = []
    t0 = time.monotonic()
    next_sample = t0
    while agent.poll() is None:
        now = time.monotonic()
        if now >= next_sample:
            try:
                with proc.oneshot():
                    samples.append({"t_s": round(now - t0, 2), "rss_mb": round(proc.memory_info().rss / 2**20, 2),
                                    "threads": proc.num_threads(), "open_files": proc.num_fds(),
                                    "store_bytes": _size(db, Path(f"{db}-wal")), "spool_bytes": _size(spool),
                                    "ticks": _ticks(port)})
            except psutil.Error:
                break
            next_sample += 1.0
        _ticks(port)  # a scraper's load, as Prometheus would
        time.sleep(scrape_every)  # the scrape cadence under test, not a wait for a condition
    out, err = agent.communicate(timeout=60)
    n = len(samples)
    rss = [s["rss_mb"] for s in samples]
    # warm-up: until the agent has ticked ``warmup_ticks`` times (the rules' windows full, the
    # store's page cache grown); then the first five samples against the last tenth
    after = [i for i, s in enumerate(samples) if (s["ticks"] or 0) >= warmup_ticks]
    start = after[0] if after else n // 5
    warm = rss[start:start + 5] or rss
    tail = rss[-max(n // 10, 1):] or rss
    growth = round(statistics.median(tail) - statistics.median(warm), 2) if rss else None
    stored = _size(db, Path(f"{db}-wal"))
    return {
        "ticks": ticks, "warmup_ticks": warmup_ticks, "exit": agent.returncode, "seconds": round(time.monotonic() - t0, 1), "samples": n,
        "rss_start_mb": rss[0] if rss else None, "rss_after_warmup_mb": statistics.median(warm) if rss else None,
        "rss_end_mb": statistics.median(tail) if rss else None, "rss_max_mb": max(rss) if rss else None,
        "rss_growth_after_warmup_mb": growth,
        "threads_start": samples[0]["threads"] if samples else None, "threads_end": samples[-1]["threads"] if samples else None,
        "open_files_start": samples[0]["open_files"] if samples else None,
        "open_files_end": samples[-1]["open_files"] if samples else None,
        "spool_bytes_max": max((s["spool_bytes"] for s in samples), default=None),
        "store_bytes": stored, "store_bytes_per_tick": round(stored / ticks, 1),
        # the work directory is a temporary one: named <work>, as every run's differs
        "agent_last_line": ((out + err).strip().splitlines() or [""])[-1].replace(str(work), "<work>"),
        "agent_stderr_tail": err[-500:].replace(str(work), "<work>"),
        "series": samples,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ticks", type=int, default=86_400)
    ap.add_argument("--warmup-ticks", type=int, default=20_000, help="ticks before the growth is measured")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    result = run(args.ticks, args.warmup_ticks)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    summary = {k: v for k, v in result.items() if k not in ("series", "agent_stderr_tail")}
    print(json.dumps(summary, separators=(",", ":")))
    growth = result["rss_growth_after_warmup_mb"]
    sys.exit(0 if result["exit"] == 0 and growth is not None and growth < GROWTH_LIMIT_MB else 1)


if __name__ == "__main__":
    main()
