"""Peak memory (RSS) of ``vgpumon agent --replay`` over a long, wide capture.

The capture is derived from the recorded H200 one (``tests/data/h200-workload.jsonl.gz``) by the
documented transformations of ``vgpumon.testing.scenarios``: ``repeat`` to the wanted length, then
``replicate_devices`` to the wanted number of GPUs, written (streamed) to a gzip capture file.
The agent then replays it as fast as it can into a fresh SQLite store, as a user would, and the
peak RSS of that process is read from ``getrusage(RUSAGE_CHILDREN)``.

Usage:
  python3 bench/replay_memory.py --gpus 8 --hours 4 --workdir /tmp/replay-bench
"""

from __future__ import annotations

import argparse
import math
import resource
import subprocess
import sys
import time
from pathlib import Path

CAPTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "h200-workload.jsonl.gz"


def derive(path: Path, gpus: int, hours: float) -> int:
    """Write the derived capture; returns its ticks."""
    from vgpumon.testing import scenarios

    header, ticks = scenarios.load(str(CAPTURE))
    per_pass = sum(1 for t in ticks if t["tick"] >= 0)
    passes = math.ceil(hours * 3600 / per_pass)
    header, ticks = scenarios.repeat(header, ticks, passes)
    header, ticks = scenarios.replicate_devices(header, ticks, gpus)
    scenarios.write(path, header, ticks)
    return passes * per_pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--hours", type=float, default=4.0)
    ap.add_argument("--workdir", type=Path, required=True)
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    capture = args.workdir / f"h200-x{args.gpus}-{args.hours:g}h.jsonl.gz"
    if not capture.exists():
        t0 = time.monotonic()
        n = derive(capture, args.gpus, args.hours)
        print(f"derived {n} ticks of {args.gpus} GPUs in {time.monotonic() - t0:.0f} s: {capture.stat().st_size / 1e6:.1f} MB")
    db = args.workdir / "replay.db"
    for p in args.workdir.glob("replay.db*"):
        p.unlink()
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "vgpumon", "agent", "--replay", str(capture), "--db", f"sqlite:///{db}",
         "--spool", str(args.workdir / "spool"), "--hostname", "bench"],
        capture_output=True, text=True,
    )
    wall = time.monotonic() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "(no output)")
    print(f"exit {out.returncode}; replay wall {wall:.0f} s; peak RSS {peak_kib / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
