"""Time to render ``/metrics`` for 8 GPUs and 8 vLLM servers, beside prometheus-client's own text
rendering (``generate_latest``) of the same registry, in one run.

The GPUs are the 8-GPU incident derived from the recorded H200 captures, at a tick of the copy
phase (every field known, a lost GPU, XIDs counted); the vLLM servers are 8 real HTTP servers
serving a real vLLM 0.32 server's recorded scrapes (busy, then the counters moved on), polled
twice by the vLLM source so that rates and latency percentiles exist.

Usage:
  python3 bench/exporter_render.py [--runs 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from vgpumon.exporter.collector import MetricsExporter
from vgpumon.model import Snapshot
from vgpumon.sources.nvml import NvmlSource
from vgpumon.sources.nvml.backend import EndOfCapture
from vgpumon.sources.vllm import VllmSource
from vgpumon.sources.vllm.discovery import NoProcesses
from vgpumon.testing import incident, scenarios
from vgpumon.testing.vllm import FakeClock, FakeVllmServer

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("VGPUMON_SHARED") or ROOT.parent / "shared")


def gpu_snapshots(upto: int) -> list[Snapshot]:
    src = NvmlSource(scenarios.backend(*incident.build(ROOT / "tests" / "data")))
    gpus = src.start()
    out = []
    try:
        for _ in range(upto):
            r = src.sample()
            out.append(Snapshot(ts=r.ts, hostname="gpu-host-17", gpus=gpus, samples=r.samples, xid_events=r.xid_events,
                                sources=(dataclasses.replace(r.status, collect_seconds=0.0),)))
    except EndOfCapture:
        pass
    return out


async def vllm_source(n: int) -> tuple[VllmSource, list[FakeVllmServer]]:
    d = SHARED / "fixtures" / "vllm-real"
    busy, later = (d / "vllm-0.32.0-cpu__busy.txt").read_text(), (d / "vllm-0.32.0-cpu__engine-killed.txt").read_text()
    servers = [await FakeVllmServer(metrics=busy, version="0.32.0", models=[f"model-{i}"], load=1.0).start() for i in range(n)]
    clock = FakeClock()
    src = VllmSource(static_urls=[s.url for s in servers], processes=NoProcesses(), clock=clock)
    await src.poll()
    clock.advance(2.0)
    for s in servers:
        s.metrics = later
    await src.poll()
    return src, servers


def timed(fn, runs: int) -> list[float]:
    fn()  # warm the label caches, as every scrape after the first finds them
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2000)
    args = ap.parse_args()
    snaps = gpu_snapshots(upto=18)  # in the copy phase: every GPU readable and busy

    async def build() -> tuple[MetricsExporter, list[FakeVllmServer], VllmSource]:
        src, servers = await vllm_source(8)
        ex = MetricsExporter(hostname="gpu-host-17", monotonic=FakeClock(0.0))
        for s in snaps:
            ex.observe(src.attach(s))  # the snapshot carries the vLLM servers, as the agent's do
        return ex, servers, src

    loop = asyncio.new_event_loop()
    ex, servers, src = loop.run_until_complete(build())
    registry = CollectorRegistry()
    registry.register(ex)
    assert ex.render() == generate_latest(registry)
    text = ex.render()
    samples = sum(1 for line in text.splitlines() if not line.startswith(b"#"))
    ours = timed(ex.render, args.runs)
    theirs = timed(lambda: generate_latest(registry), args.runs)
    families = timed(ex.families, args.runs)
    loop.run_until_complete(src.close())
    for s in servers:
        loop.run_until_complete(s.stop())
    loop.close()

    def ms(xs: list[float]) -> str:
        xs = sorted(xs)
        return f"median {statistics.median(xs) * 1e3:.2f} ms, p90 {xs[int(0.9 * len(xs))] * 1e3:.2f} ms"

    print(f"/metrics: 8 GPUs, 8 vLLM servers: {samples} samples, {len(text)} bytes; {args.runs} runs each, Python {sys.version.split()[0]}")
    print(f"  vgpumon render (collect + text)              {ms(ours)}")
    print(f"  prometheus-client generate_latest(registry)  {ms(theirs)}")
    print(f"    of which collecting the families           {ms(families)}")


if __name__ == "__main__":
    main()
