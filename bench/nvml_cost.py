"""Cost of one fast-set sample of one GPU, side by side in one run.

Compares, on the same GPU(s) and in the same process where possible:

* vgpumon's collector (``NvmlSource.sample`` with the slow set disabled), GPM path;
* the same collector on the pre-Hopper path (``use_gpm=False``): its fast set must stay free of
  the 21 ms ``nvmlDeviceGetPcieThroughput`` call, which runs on a poller thread;
* bare pynvml doing the same calls (the floor);
* ``nvidia-smi --query-gpu`` for the same fields (whole process);
* nvitop ``Device.as_snapshot()``;
* gpustat ``new_query()`` — in its own process, last (it patches pynvml at import).

vgpumon and the floor are timed tick by tick in turn (``time_interleaved``), each after the
same 2-ms pause; the other tools one after the other.

Usage: python3 bench/nvml_cost.py [--ticks 2000] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SMI_FIELDS = (
    "memory.used,memory.reserved,memory.total,utilization.gpu,utilization.memory,temperature.gpu,power.draw,"
    "clocks.sm,clocks.mem,clocks_event_reasons.active,pstate,fan.speed,pcie.link.gen.current,pcie.link.width.current"
)


def summary(samples_s: list[float], per: int = 1) -> dict[str, float]:
    xs = sorted(x / per for x in samples_s)
    return {
        "median_ms": statistics.median(xs) * 1e3,
        "p90_ms": xs[int(len(xs) * 0.9)] * 1e3,
        "max_ms": xs[-1] * 1e3,
        "n": len(xs),
    }


def time_collector(ticks: int, use_gpm: bool, profile: bool = False) -> dict[str, float]:
    from vgpumon.sources.nvml import NvmlSource

    src = NvmlSource(slow_every=10**9, use_gpm=use_gpm)
    gpus = src.start()
    src.sample()  # tick 0 carries the slow set; also primes GPM and starts the XID waiter
    src.sample()
    out = []
    for _ in range(ticks):
        t0 = time.perf_counter()
        src.sample()
        out.append(time.perf_counter() - t0)
        time.sleep(0.002)
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(500):
            src.sample()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    src.close()
    return summary(out, max(len(gpus), 1))


def bare_tick(nv, handles):
    """The floor: a function making, with nvidia-ml-py, the calls vgpumon's fast set makes on a
    Hopper GPU for every GPU of ``handles``, in the same order, with nothing done to the answers
    (GPM buffers reused as vgpumon does; the fan call left out because the H200 answers it "not
    supported" and vgpumon stops asking)."""
    metric_ids = (2, 3, 5, 10, 20, 21)
    bufs, cur = {}, {}
    for i, h in enumerate(handles):
        bufs[i] = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
        nv.nvmlGpmSampleGet(h, bufs[i][0])
        cur[i] = 1

    def tick() -> None:
        for i, h in enumerate(handles):
            nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
            nv.nvmlDeviceGetUtilizationRates(h)
            c = cur[i]
            nv.nvmlGpmSampleGet(h, bufs[i][c])
            req = nv.c_nvmlGpmMetricsGet_t()
            req.version = nv.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = len(metric_ids)
            req.sample1, req.sample2 = bufs[i][1 - c], bufs[i][c]
            for k, m in enumerate(metric_ids):
                req.metrics[k].metricId = m
            nv.nvmlGpmMetricsGet(req)
            cur[i] = 1 - c
            nv.nvmlDeviceGetTemperature(h, 0)
            nv.nvmlDeviceGetFieldValues(h, [82])  # HBM temperature
            nv.nvmlDeviceGetPowerUsage(h)
            nv.nvmlDeviceGetClockInfo(h, 1)
            nv.nvmlDeviceGetClockInfo(h, 2)
            nv.nvmlDeviceGetCurrentClocksEventReasons(h)
            nv.nvmlDeviceGetPerformanceState(h)
            nv.nvmlDeviceGetCurrPcieLinkGeneration(h)
            nv.nvmlDeviceGetCurrPcieLinkWidth(h)
            nv.nvmlDeviceGetComputeRunningProcesses(h)

    return tick


def time_bare_pynvml(ticks: int) -> dict[str, float]:
    """The floor (``bare_tick``), timed like the collector."""
    import pynvml as nv

    nv.nvmlInit()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    tick = bare_tick(nv, handles)
    out = []
    for _ in range(ticks):
        t0 = time.perf_counter()
        tick()
        out.append(time.perf_counter() - t0)
        time.sleep(0.002)
    nv.nvmlShutdown()
    return summary(out, len(handles))


def time_interleaved(ticks: int, gap_s: float = 0.002) -> tuple[dict[str, float], dict[str, float]]:
    """vgpumon's collector (GPM path, slow set off) and the floor (``bare_tick``), tick by tick
    in turn, each after the same pause, which one goes first alternating: both see the same
    machine at the same moments (run one after the other, a drift of the host between the two
    runs moved the ratio by ±10 % on the H200). Returns (vgpumon, floor) summaries per GPU."""
    import pynvml as nv

    from vgpumon.sources.nvml import NvmlSource

    src = NvmlSource(slow_every=10**9, use_gpm=True)
    gpus = src.start()
    src.sample()  # tick 0 carries the slow set; also primes GPM and starts the XID waiter
    src.sample()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    bare = bare_tick(nv, handles)
    runs = ((src.sample, []), (bare, []))
    for k in range(ticks):
        for fn, out in runs if k % 2 == 0 else runs[::-1]:
            time.sleep(gap_s)
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    src.close()
    n = max(len(gpus), 1)
    return summary(runs[0][1], n), summary(runs[1][1], n)


def time_nvidia_smi(runs: int) -> dict[str, float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"], check=True, capture_output=True)
        out.append(time.perf_counter() - t0)
    return summary(out, 1)  # one process answers for every GPU; per-GPU cost is at most this


def time_nvitop(runs: int) -> dict[str, float] | str:
    try:
        from nvitop import Device
    except ImportError as exc:
        return f"not installed: {exc}"
    devices = Device.all()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for d in devices:
            d.as_snapshot()
        out.append(time.perf_counter() - t0)
    return summary(out, len(devices))


GPUSTAT = """
import json, statistics, time, gpustat
out = []
for _ in range({runs}):
    t0 = time.perf_counter(); q = gpustat.new_query(); out.append((time.perf_counter() - t0) / len(q.gpus))
out.sort()
print(json.dumps({{"median_ms": statistics.median(out) * 1e3, "p90_ms": out[int(len(out) * .9)] * 1e3, "max_ms": out[-1] * 1e3, "n": len(out)}}))
"""


def time_gpustat(runs: int) -> dict[str, float] | str:
    p = subprocess.run([sys.executable, "-c", GPUSTAT.format(runs=runs)], capture_output=True, text=True)
    return json.loads(p.stdout) if p.returncode == 0 else f"failed: {p.stderr.strip().splitlines()[-1:]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ticks", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=50, help="runs of the whole-process tools")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--profile", action="store_true", help="print a cProfile of 500 collector ticks (GPM path)")
    ap.add_argument("--alternate", type=int, default=0, metavar="K",
                    help="only vgpumon (GPM) and the bare floor, alternated K times (order and drift effects)")
    ap.add_argument("--fake-gpus", type=int, default=0, metavar="N",
                    help="no GPU here: put bench/fake_nvml.py under nvidia-ml-py with N GPUs and compare the "
                         "Python side only (vgpumon vs bare); never a figure for the docs")
    ap.add_argument("--c-fake", action="store_true",
                    help="with --fake-gpus: answer the fast-set calls from C (bench/fake_fastset.c), so a "
                         "sample costs its Python and ctypes side only")
    args = ap.parse_args()
    if args.fake_gpus:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import fake_fastset
        import fake_nvml

        (fake_fastset if args.c_fake else fake_nvml).install(args.fake_gpus)
        ours, bare = time_interleaved(args.ticks)
        report({"vgpumon fast set (GPM)": ours, "bare pynvml, same calls": bare}, args.json)
        return
    if args.alternate:
        for k in range(args.alternate):
            ours, bare = time_collector(args.ticks, True, args.profile and k == 0), time_bare_pynvml(args.ticks)
            print(f"round {k + 1}: vgpumon {ours['median_ms']:.3f} ms, bare {bare['median_ms']:.3f} ms, "
                  f"ratio {ours['median_ms'] / bare['median_ms']:.2f}", flush=True)
        return
    if args.profile:
        time_collector(500, True, True)
    ours, bare = time_interleaved(args.ticks)
    results = {
        "vgpumon fast set (GPM)": ours,
        "vgpumon fast set (no GPM)": time_collector(args.ticks, False),
        "bare pynvml, same calls": bare,
        "nvidia-smi --query-gpu": time_nvidia_smi(args.runs),
        "nvitop Device.as_snapshot()": time_nvitop(args.runs * 4),
        "gpustat new_query()": time_gpustat(args.runs * 4),
    }
    report(results, args.json)


def report(results: dict, json_out: Path | None) -> None:
    ours = results["vgpumon fast set (GPM)"]["median_ms"]
    print(f"{'per GPU, one sample':<32} {'median ms':>10} {'p90 ms':>8} {'max ms':>8} {'× vgpumon':>10}")
    for name, r in results.items():
        if isinstance(r, str):
            print(f"{name:<32} {r}")
            continue
        print(f"{name:<32} {r['median_ms']:>10.3f} {r['p90_ms']:>8.3f} {r['max_ms']:>8.3f} {r['median_ms'] / ours:>10.1f}")
    floor = results["bare pynvml, same calls"]["median_ms"]
    print(f"vgpumon / bare, interleaved tick by tick: {ours / floor:.2f}")
    if json_out:
        json_out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
