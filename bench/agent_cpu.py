"""CPU time of the whole agent process (all threads, store writes included) per second of wall
time, after a warm-up.

Usage:
  python3 bench/agent_cpu.py --measure 120 -- --db sqlite:///tmp/cpu.db            # live GPUs
  python3 bench/agent_cpu.py --measure 120 -- --replay CAPTURE --pace recorded --db sqlite:///tmp/cpu.db
Everything after ``--`` goes to ``vgpumon agent``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--measure", type=float, default=120.0)
    ap.add_argument("agent_args", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    extra = [a for a in args.agent_args if a != "--"]
    total = args.warmup + args.measure + 5
    proc = subprocess.Popen([sys.executable, "-m", "vgpumon", "agent", "--duration", f"{total:.0f}s", *extra])
    time.sleep(args.warmup)
    c0, t0 = cpu_seconds(proc.pid), time.monotonic()
    time.sleep(args.measure)
    c1, t1 = cpu_seconds(proc.pid), time.monotonic()
    proc.terminate()
    proc.wait(timeout=30)
    share = (c1 - c0) / (t1 - t0)
    print(f"agent CPU: {c1 - c0:.3f} s over {t1 - t0:.1f} s wall = {share * 100:.3f} % of one core ({' '.join(extra)})")


if __name__ == "__main__":
    main()
