"""CPU time (this thread's) against wall time of the NVML calls the agent makes off the fast set:
does a call that takes long block (sleep in the driver) or spin (burn a core)?

* ``nvmlDeviceGetPcieThroughput`` (two directions, ~20 ms each: the cross-check poller's call);
* ``nvmlDeviceGetTotalEnergyConsumption`` (slow set);
* ``nvmlEventSetWait_v2`` with a 200 ms timeout and no event (the XID waiter's idle wake-up);
* one slow-set pass of the collector (``NvmlSource.sample`` on a slow tick minus a fast one).

Usage: python3 bench/nvml_call_cpu.py [--repeat 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def measure(fn, repeat: int) -> tuple[float, float]:
    cpu, wall = [], []
    for _ in range(repeat):
        c0, w0 = time.thread_time(), time.perf_counter()
        fn()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    return statistics.median(cpu) * 1e3, statistics.median(wall) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    import pynvml as nv

    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    rows = []

    def pcie() -> None:
        nv.nvmlDeviceGetPcieThroughput(h, 0)
        nv.nvmlDeviceGetPcieThroughput(h, 1)

    rows.append(("nvmlDeviceGetPcieThroughput TX+RX", *measure(pcie, args.repeat)))
    rows.append(("nvmlDeviceGetTotalEnergyConsumption", *measure(lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h), args.repeat)))
    es = nv.nvmlEventSetCreate()
    try:
        nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, es)

        def wait() -> None:
            try:
                nv.nvmlEventSetWait_v2(es, 200)
            except nv.NVMLError:
                pass

        rows.append(("nvmlEventSetWait_v2 200 ms, no event", *measure(wait, args.repeat)))
    finally:
        nv.nvmlEventSetFree(es)
    # the rest of the slow set, call by call (what a slow tick costs besides energy)
    slow_calls = [
        ("nvmlDeviceGetTotalEccErrors x4", lambda: [nv.nvmlDeviceGetTotalEccErrors(h, e, c) for e in (0, 1) for c in (0, 1)]),
        ("nvmlDeviceGetMemoryErrorCounter x4", lambda: [nv.nvmlDeviceGetMemoryErrorCounter(h, e, 0, loc) for e in (0, 1) for loc in (1, 3)]),
        ("nvmlDeviceGetBAR1MemoryInfo", lambda: nv.nvmlDeviceGetBAR1MemoryInfo(h)),
        ("nvmlDeviceGetPcieReplayCounter", lambda: nv.nvmlDeviceGetPcieReplayCounter(h)),
        ("nvmlDeviceGetRemappedRows", lambda: nv.nvmlDeviceGetRemappedRows(h)),
        ("nvmlDeviceGetEnforcedPowerLimit", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h)),
        ("nvmlDeviceGetViolationStatus x2", lambda: [nv.nvmlDeviceGetViolationStatus(h, p) for p in (0, 1)]),
        ("nvmlDeviceGetPersistenceMode", lambda: nv.nvmlDeviceGetPersistenceMode(h)),
        ("nvmlDeviceGetComputeMode", lambda: nv.nvmlDeviceGetComputeMode(h)),
        ("nvmlDeviceGetMigMode", lambda: nv.nvmlDeviceGetMigMode(h)),
    ]
    for name, fn in slow_calls:
        def guarded(fn=fn) -> None:
            try:
                fn()
            except nv.NVMLError:
                pass

        rows.append((name, *measure(guarded, args.repeat)))
    nv.nvmlShutdown()

    from vgpumon.sources.nvml import NvmlSource

    src = NvmlSource(slow_every=2)
    src.start()
    for _ in range(4):
        src.sample()
    slow = measure(src.sample, 1)  # tick 4: slow
    fast = measure(src.sample, 1)  # tick 5: fast
    slow_c, fast_c = [], []
    for _ in range(args.repeat):
        slow_c.append(measure(src.sample, 1))
        fast_c.append(measure(src.sample, 1))
    src.close()
    s_cpu = statistics.median(c for c, _ in slow_c) - statistics.median(c for c, _ in fast_c)
    s_wall = statistics.median(w for _, w in slow_c) - statistics.median(w for _, w in fast_c)
    rows.append(("collector slow set (slow tick - fast tick)", s_cpu, s_wall))
    del slow, fast
    print(f"{'call':<46} {'CPU ms':>8} {'wall ms':>8}")
    for name, c, w in rows:
        print(f"{name:<46} {c:>8.3f} {w:>8.3f}")


if __name__ == "__main__":
    main()
