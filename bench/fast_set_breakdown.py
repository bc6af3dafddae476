"""Where a fast-set sample's time goes, on one GPU host, in one process and alternating rounds:

* ``vgpumon``: ``NvmlSource.sample()`` with the slow set off (what the agent does each tick);
* ``vgpumon calls only``: the same NVML calls through the same bound ctypes functions and GPM
  buffers, nothing done with the answers (vgpumon's call mechanism, without its processing);
* ``bare``: nvidia-ml-py making the same calls (the floor the issue compares with).

Each is timed two ways: with a pause between ticks (``--gap`` ms, as the agent sleeps between
ticks: caches cool, the thread may wake on another core) and back to back.

Usage: python3 bench/fast_set_breakdown.py [--ticks 1000] [--rounds 3] [--gap 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def timed(fn, ticks: int, gap_s: float) -> float:
    out = []
    for _ in range(ticks):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
        if gap_s:
            time.sleep(gap_s)
    return statistics.median(out) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ticks", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gap", type=float, default=2.0, help="ms between ticks in the paused runs")
    ap.add_argument("--fake-gpus", type=int, default=0, help="no GPU here: N stand-in GPUs (never a figure for the docs)")
    ap.add_argument("--c-fake", action="store_true", help="with --fake-gpus: the fast-set calls answered from C")
    args = ap.parse_args()
    if args.fake_gpus:
        import fake_fastset
        import fake_nvml

        (fake_fastset if args.c_fake else fake_nvml).install(args.fake_gpus)
    import pynvml as nv
    from nvml_cost import bare_tick

    from vgpumon.sources.nvml import GPM_METRICS, NvmlSource

    src = NvmlSource(slow_every=10**9, use_gpm=True)
    gpus = src.start()
    src.sample()
    src.sample()
    backend = src.backend
    handles = [backend._handle(g.index) for g in gpus]
    bound = [backend.bound_calls(g.index) for g in gpus]

    def calls_only() -> None:
        for g, b in zip(gpus, bound):
            b["nvmlDeviceGetMemoryInfo"](version=nv.nvmlMemory_v2)
            b["nvmlDeviceGetUtilizationRates"]()
            backend.gpm(g.index, GPM_METRICS)
            b["nvmlDeviceGetTemperature"](0)
            b["nvmlDeviceGetFieldValues"]((82,))
            b["nvmlDeviceGetPowerUsage"]()
            b["nvmlDeviceGetClockInfo"](1)
            b["nvmlDeviceGetClockInfo"](2)
            b["nvmlDeviceGetCurrentClocksEventReasons"]()
            b["nvmlDeviceGetPerformanceState"]()
            b["nvmlDeviceGetCurrPcieLinkGeneration"]()
            b["nvmlDeviceGetCurrPcieLinkWidth"]()
            b["nvmlDeviceGetComputeRunningProcesses"]()

    bare = bare_tick(nv, handles)  # the same calls through nvidia-ml-py (bench/nvml_cost.py)

    runs = {"vgpumon": src.sample, "vgpumon calls only": calls_only, "bare pynvml": bare}
    n = max(len(gpus), 1)
    print(f"{len(gpus)} GPU(s); per GPU, median ms; {args.ticks} ticks a run, {args.rounds} rounds")
    print(f"{'round':<6} " + " ".join(f"{name + (' paused' if g else ' b2b'):>26}" for g in (1, 0) for name in runs))
    for r in range(args.rounds):
        cells = []
        for gap in (args.gap / 1e3, 0.0):
            for fn in runs.values():
                cells.append(timed(fn, args.ticks, gap) / n)
        print(f"{r + 1:<6} " + " ".join(f"{c:>26.3f}" for c in cells), flush=True)
    src.close()


if __name__ == "__main__":
    main()
