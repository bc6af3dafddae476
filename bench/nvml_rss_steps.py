"""Resident memory NVML itself adds to a process, step by step, for the calls the agent makes
(one fresh interpreter; RSS, anonymous and file-backed, from ``/proc/self/status`` after each
step). Separates what the library costs from what vgpumon's own imports and state cost.

Usage: python3 bench/nvml_rss_steps.py
"""

from __future__ import annotations

import threading


def rss() -> tuple[float, float, float]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) / 1024
    return out["VmRSS"], out["RssAnon"], out["RssFile"]


def main() -> None:
    last = rss()
    print(f"{'step':<44} {'RSS MB':>8} {'+MB':>6} {'anon':>7} {'file':>7}")

    def step(name: str) -> None:
        nonlocal last
        now = rss()
        print(f"{name:<44} {now[0]:8.1f} {now[0] - last[0]:+6.1f} {now[1]:7.1f} {now[2]:7.1f}", flush=True)
        last = now

    step("interpreter")
    import pynvml as nv

    step("import pynvml")
    nv.nvmlInit()
    step("nvmlInit")
    hs = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    step(f"handles ({len(hs)} GPUs)")
    for h in hs:
        nv.nvmlDeviceGetName(h), nv.nvmlDeviceGetUUID(h), nv.nvmlDeviceGetPciInfo(h)
        nv.nvmlDeviceGetMaxPcieLinkGeneration(h), nv.nvmlDeviceGetMaxPcieLinkWidth(h)
    step("identity calls")

    def fast(h) -> None:
        nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
        nv.nvmlDeviceGetUtilizationRates(h)
        nv.nvmlDeviceGetTemperature(h, 0)
        nv.nvmlDeviceGetPowerUsage(h)
        nv.nvmlDeviceGetClockInfo(h, 1)
        nv.nvmlDeviceGetCurrentClocksEventReasons(h)
        nv.nvmlDeviceGetPerformanceState(h)
        nv.nvmlDeviceGetCurrPcieLinkGeneration(h)
        nv.nvmlDeviceGetComputeRunningProcesses(h)

    for h in hs:
        fast(h)
    step("fast-set getters")
    for h in hs:
        nv.nvmlDeviceGetFieldValues(h, [82])
    step("field values (82)")
    bufs = []
    for h in hs:
        b = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
        nv.nvmlGpmSampleGet(h, b[0])
        bufs.append(b)
    step("GPM: 2 sample buffers a GPU, one sample")
    for h, b in zip(hs, bufs):
        nv.nvmlGpmSampleGet(h, b[1])
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version, req.numMetrics = nv.NVML_GPM_METRICS_GET_VERSION, 6
        req.sample1, req.sample2 = b[0], b[1]
        for j, m in enumerate((2, 3, 5, 10, 20, 21)):
            req.metrics[j].metricId = m
        nv.nvmlGpmMetricsGet(req)
    step("GPM: metrics")
    for h in hs:
        for t in (0, 1):
            for c in (0, 1):
                try:
                    nv.nvmlDeviceGetTotalEccErrors(h, t, c)
                except nv.NVMLError:
                    pass
        for fn in (nv.nvmlDeviceGetTotalEnergyConsumption, nv.nvmlDeviceGetBAR1MemoryInfo, nv.nvmlDeviceGetPcieReplayCounter,
                   nv.nvmlDeviceGetRemappedRows, nv.nvmlDeviceGetEnforcedPowerLimit, nv.nvmlDeviceGetPersistenceMode,
                   nv.nvmlDeviceGetComputeMode, nv.nvmlDeviceGetMigMode):
            try:
                fn(h)
            except nv.NVMLError:
                pass
    step("slow set")
    for h in hs:
        nv.nvmlDeviceGetPcieThroughput(h, 0)
    step("PCIe throughput call")
    es = nv.nvmlEventSetCreate()
    for h in hs:
        try:
            nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, es)
        except nv.NVMLError:
            pass
    try:
        nv.nvmlEventSetWait_v2(es, 10)
    except nv.NVMLError:
        pass
    step("XID event set + one wait")

    def other() -> None:
        for h in hs:
            fast(h)

    for _ in range(4):
        t = threading.Thread(target=other)
        t.start()
        t.join()
    step("same calls from 4 more threads")
    for _ in range(200):
        for h in hs:
            fast(h)
    step("200 more ticks")


if __name__ == "__main__":
    main()
