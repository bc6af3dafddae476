"""The whole agent's footprint — CPU share and resident memory over time — beside its baselines,
side by side in one run.

Started together and watched for the same wall-clock window:

* ``vgpumon agent`` with every default feature on (vLLM discovery, ``/metrics``, rules), plus
  whatever arguments follow ``--``;
* ``--bare``: a bare 1 Hz nvidia-ml-py loop making the fast set's calls for every GPU (the CPU
  floor of sampling at all);
* ``--floor``: the import-and-init floor — an interpreter that imports what the agent's own
  process (``vgpumon.agent.process``) imports with every default feature on, calls ``nvmlInit``
  and sleeps; and
  ``--floor`` also starts a bare interpreter that only calls ``nvmlInit``.

Every ``--every`` seconds each process's resident set (``VmRSS``), CPU time and thread count
are read. CPU time is the sum over the process's threads of ``/proc/<pid>/task/*/schedstat``
(nanoseconds on the CPU, where the kernel has it), not utime + stime from ``/proc/<pid>/stat``,
which counts in clock ticks of 10 ms: over 120 s that is 0.008 % of a core per tick, as much
as the difference being measured between two runs, and per thread worse. CPU share is taken over the window
after ``--warmup``; memory is reported at the marks asked for (``--marks 35,60,120``), as seconds
since the agent started, and as the spread after warm-up.

Usage:
  python3 bench/agent_footprint.py --measure 120 --bare --floor -- --db sqlite:////tmp/fp.db
  python3 bench/agent_footprint.py --measure 3600 --every 30 --marks 300,1800,3600 \\
      -- --replay /tmp/h200-x8.jsonl.gz --pace recorded --db sqlite:////tmp/fp.db --no-vllm
Everything after ``--`` goes to ``vgpumon agent``. ``--json OUT`` writes the series.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")

BARE = """
import time, pynvml as nv
nv.nvmlInit()
hs = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
bufs = [[nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()] for _ in hs]
ids = (2, 3, 5, 10, 20, 21)
start, k = time.monotonic(), 0
while True:
    for i, h in enumerate(hs):
        nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
        nv.nvmlDeviceGetUtilizationRates(h)
        try:
            c = k % 2
            nv.nvmlGpmSampleGet(h, bufs[i][c])
            if k:
                req = nv.c_nvmlGpmMetricsGet_t()
                req.version, req.numMetrics = nv.NVML_GPM_METRICS_GET_VERSION, len(ids)
                req.sample1, req.sample2 = bufs[i][1 - c], bufs[i][c]
                for j, m in enumerate(ids):
                    req.metrics[j].metricId = m
                nv.nvmlGpmMetricsGet(req)
        except nv.NVMLError:
            pass
        nv.nvmlDeviceGetTemperature(h, 0)
        nv.nvmlDeviceGetFieldValues(h, [82])
        nv.nvmlDeviceGetPowerUsage(h)
        nv.nvmlDeviceGetClockInfo(h, 1)
        nv.nvmlDeviceGetClockInfo(h, 2)
        nv.nvmlDeviceGetCurrentClocksEventReasons(h)
        nv.nvmlDeviceGetPerformanceState(h)
        nv.nvmlDeviceGetCurrPcieLinkGeneration(h)
        nv.nvmlDeviceGetCurrPcieLinkWidth(h)
        nv.nvmlDeviceGetComputeRunningProcesses(h)
    k += 1
    time.sleep(max(0.0, start + k - time.monotonic()))
"""

# what the agent's own process (vgpumon.agent.process, after the CLI's exec) imports with every
# default feature on: sampling, store, /metrics and the API, rules and their sinks, vLLM discovery
FLOOR = """
import time, pynvml
import vgpumon.agent.process, vgpumon.agent, vgpumon.store, vgpumon.store.retention, vgpumon.sources.nvml
import vgpumon.sources.host, vgpumon.exporter.server, vgpumon.exporter.api, vgpumon.alerts.runner, vgpumon.rules.engine
import vgpumon.alerts.sinks, vgpumon.sources.vllm
pynvml.nvmlInit()
print("ready", flush=True)
time.sleep(1e6)
"""

FLOOR_BARE = """
import time, pynvml
pynvml.nvmlInit()
print("ready", flush=True)
time.sleep(1e6)
"""


def read(pid: int) -> tuple[float, int, int] | None:
    """(CPU seconds, RSS bytes, threads) of a live process; ``None`` once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
    except (FileNotFoundError, ProcessLookupError):
        return None
    per_thread = threads(pid)
    cpu = sum(per_thread.values()) if per_thread else (int(fields[11]) + int(fields[12])) / TICK
    rss = int(status["VmRSS"].split()[0]) * 1024
    return cpu, rss, int(status["Threads"])


def _thread_cpu(path: str) -> float:
    """CPU seconds of one thread: ``schedstat`` (ns) where the kernel has it, else utime + stime."""
    try:
        with open(f"{path}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (FileNotFoundError, ValueError, IndexError):
        with open(f"{path}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK


def threads(pid: int) -> dict[str, float]:
    """CPU seconds per thread name (``/proc/<pid>/task/*``: the agent names its OS threads)."""
    out: dict[str, float] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            cpu = _thread_cpu(f"/proc/{pid}/task/{tid}")
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[name] = out.get(name, 0.0) + cpu
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds before the CPU window opens")
    ap.add_argument("--measure", type=float, default=120.0, help="seconds of the CPU window")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between readings")
    ap.add_argument("--marks", default="35,60,120", help="seconds after start whose RSS is reported")
    ap.add_argument("--bare", action="store_true", help="also run the bare 1 Hz nvidia-ml-py loop")
    ap.add_argument("--floor", action="store_true", help="also run the import-and-init floors")
    ap.add_argument("--scrape-every", type=float, default=15.0, metavar="SECONDS",
                    help="GET the agent's /metrics this often, as Prometheus would (0: never)")
    ap.add_argument("--scrape-url", default="http://127.0.0.1:19400/metrics")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--fake-gpus", type=int, default=0, metavar="N",
                    help="no GPU here: run the agent over bench/fake_nvml.py with N GPUs (for profiling; "
                         "never a figure for the docs)")
    ap.add_argument("agent_args", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    extra = [a for a in args.agent_args if a != "--"]
    total = args.warmup + args.measure + 5
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    launcher = ["-m", "vgpumon"]
    if args.fake_gpus:
        launcher = [str(Path(__file__).resolve().parent / "fake_agent.py"), "--fake-gpus", str(args.fake_gpus)]
    procs: dict[str, subprocess.Popen[bytes]] = {
        "agent": subprocess.Popen([sys.executable, *launcher, "agent", "--duration", f"{total:.0f}s", *extra], env=env)
    }
    if args.bare:
        procs["bare pynvml 1 Hz"] = subprocess.Popen([sys.executable, "-c", BARE], env=env)
    if args.floor:
        procs["floor: imports + nvmlInit"] = subprocess.Popen([sys.executable, "-c", FLOOR], env=env)
        procs["floor: interpreter + nvmlInit"] = subprocess.Popen([sys.executable, "-c", FLOOR_BARE], env=env)
    t0 = time.monotonic()
    scrapes = {"ok": 0, "failed": 0}
    done = threading.Event()

    def scrape() -> None:  # Prometheus' part: the agent's /metrics every --scrape-every seconds
        while not done.wait(args.scrape_every):
            try:
                with urllib.request.urlopen(args.scrape_url, timeout=10) as r:  # noqa: S310  the agent on loopback
                    r.read()
                scrapes["ok"] += 1
            except OSError:
                scrapes["failed"] += 1

    if args.scrape_every > 0:
        threading.Thread(target=scrape, daemon=True).start()
    series: dict[str, list[tuple[float, float, int, int]]] = {name: [] for name in procs}
    agent_threads: list[tuple[float, dict[str, float]]] = []
    try:
        while time.monotonic() - t0 < total - 3:
            now = time.monotonic() - t0
            if now >= args.warmup and procs["agent"].poll() is None:
                agent_threads.append((now, threads(procs["agent"].pid)))
            for name, p in procs.items():
                r = read(p.pid)
                if r is not None and p.poll() is None:
                    series[name].append((round(now, 2), *r))
            time.sleep(args.every - (time.monotonic() - t0 - now) % args.every)
    finally:
        done.set()
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()

    marks = [float(m) for m in args.marks.split(",") if m]
    print(f"{'process':<32} {'CPU % of a core':>16} {'threads':>8} " + " ".join(f"{f'RSS@{m:g}s MB':>13}" for m in marks)
          + f" {'RSS after warm-up: min..max MB':>31}")
    report = {}
    for name, rows in series.items():
        window = [r for r in rows if r[0] >= args.warmup]
        if len(window) < 2:
            print(f"{name:<32} (ended early: {procs[name].returncode})")
            continue
        cpu = (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0])
        at = {m: next((r[2] for r in rows if r[0] >= m), None) for m in marks}
        after = [r[2] for r in window]
        report[name] = {
            "cpu_share": cpu, "cpu_window_s": window[-1][0] - window[0][0], "threads": rows[-1][3],
            "rss_at": {str(m): v for m, v in at.items()}, "rss_min": min(after), "rss_max": max(after), "series": rows,
        }
        cells = " ".join(f"{(v / 1e6 if v else float('nan')):>13.1f}" for v in at.values())
        print(f"{name:<32} {cpu * 100:>16.3f} {rows[-1][3]:>8} {cells} {min(after) / 1e6:>15.1f}..{max(after) / 1e6:<15.1f}")
    if len(agent_threads) >= 2:
        (ta, a), (tb, b) = agent_threads[0], agent_threads[-1]
        per = {n: (b[n] - a.get(n, 0.0)) / (tb - ta) for n in b}
        report.setdefault("agent", {})["threads_cpu_share"] = per
        print("agent threads, % of a core: " + ", ".join(f"{n} {v * 100:.3f}" for n, v in sorted(per.items(), key=lambda x: -x[1])))
    print(f"window: {args.measure:g} s after {args.warmup:g} s warm-up; agent: vgpumon agent {' '.join(extra)}")
    print(f"/metrics scraped every {args.scrape_every:g} s: {scrapes['ok']} answered, {scrapes['failed']} failed")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "report": report, "scrapes": scrapes}, indent=1))


if __name__ == "__main__":
    main()
