"""vLLM rows through the store (SQLite and Postgres): a watched start with its prewarm, GPU
mapping and per-engine rows, and its end."""

from __future__ import annotations

import asyncio

import pytest
from vllm_support import shared_dir, source

from vgpumon.model import GpuSample, Snapshot
from vgpumon.sources.vllm import ServerSample, ServerState, VllmProcess
from vgpumon.store import open_store
from vgpumon.store.vllm_repository import VllmRepository
from vgpumon.testing.vllm import FakeClock, FakeProcessTable, FakeVllmServer, free_port


def _start_serve_die() -> list[ServerSample]:
    busy = (shared_dir("fixtures", "vllm-real") / "vllm-0.32.0-cpu__busy.txt").read_text()

    async def go() -> list[ServerSample]:
        clock = FakeClock()
        t0 = clock.now
        port = free_port()
        server = FakeVllmServer(port=port, metrics=busy, version="0.32.0", models=["tiny"])
        table = FakeProcessTable([VllmProcess(pid=700, create_time=t0 - 2.0, host="127.0.0.1", port=port, pids=(700, 701))])
        src = source(clock, processes=table)
        out: list[ServerSample] = []
        try:
            for i in range(8):
                src.observe(Snapshot(ts=clock.now, hostname="h", gpus=(), samples=(
                    GpuSample(ts=clock.now, uuid="GPU-7", index=0, sm_active_ratio=0.5, activity_source="gpm",
                              processes=((701, 1 << 30),)),)))
                if i == 3:
                    await server.start(port)
                if i == 7:
                    table.processes.clear()
                out += await src.poll()
                clock.advance(1.0)
        finally:
            await src.close()
            await server.stop()
        return out

    return asyncio.run(go())


def test_a_start_is_stored_with_prewarm_mapping_samples_and_end(db_url):
    samples = _start_serve_die()
    store = open_store(db_url)
    try:
        repo = VllmRepository(store.engine)
        repo.write("gpu-host-17", samples[:4])
        repo.write("gpu-host-17", samples[3:])  # overlapping batch (a retry): stored once
        (inst,) = repo.instances("gpu-host-17")
        assert (inst["pid"], inst["port"], inst["origin"], inst["version"], inst["model"]) == (
            700, samples[0].instance.port, "discovered", "0.32.0", "tiny")
        assert inst["process_start"] == pytest.approx(samples[0].instance.process_start)
        assert inst["prewarm_seconds"] == pytest.approx(2.0 + 3.0)  # process start 2 s before the first poll
        assert inst["prewarm_gpu_active_ratio"] == pytest.approx(0.5)
        assert inst["final_state"] is ServerState.DEAD and inst["ended"] == pytest.approx(samples[-1].ts)
        rows = repo.samples(inst["id"])
        assert [r["state"] for r in rows] == [ServerState.STARTING] * 3 + [ServerState.READY, ServerState.BUSY, ServerState.BUSY, ServerState.HUNG, ServerState.DEAD]
        assert rows[4]["running"] == 97 and rows[4]["kv_cache_usage_ratio"] == pytest.approx(0.0198, abs=1e-4)
        assert rows[4]["kv_fragmentation_ratio"] == pytest.approx(0.297, abs=1e-3)
        assert rows[4]["kv_cache_size_tokens"] == 1048576 and rows[4]["prefix_cache_unit"] == "tokens"
        assert rows[0]["running"] is None and rows[0]["telemetry_up"] is False  # unknown, not 0
        (gpu,) = repo.gpu_map(inst["id"])
        assert gpu["gpu_uuid"] == "GPU-7" and gpu["first_seen"] == pytest.approx(samples[0].ts)
        engines = repo.engine_samples(inst["id"])
        assert {(e["model_name"], e["engine"], e["running"]) for e in engines} == {("tiny", "0", 97)}
    finally:
        store.close()


def _broken_timer(body: str, n: int) -> str:
    """The scrape with its TTFT histogram as a build with broken timing shows it (vllm issue
    8115): all ``n`` observations in the first bucket, a mean of 73 µs."""
    out = []
    for ln in body.splitlines():
        if ln.startswith(("vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_count")):
            ln = ln.rsplit(" ", 1)[0] + f" {float(n)}"
        elif ln.startswith("vllm:time_to_first_token_seconds_sum"):
            ln = ln.rsplit(" ", 1)[0] + f" {n * 7.285e-05}"
        out.append(ln)
    return "\n".join(out) + "\n"


def test_what_a_sample_can_be_trusted_for_is_stored(db_url):
    """Each poll stores why: quantiles a broken timer gives (flagged, with the reason, and no
    latency for alerting), /metrics lines dropped (partial), a body over the limit ("too large"),
    and an engine lost while /health still answers 200."""
    from dataclasses import replace

    from vgpumon.model.vllm import latency_for_alerts

    idle = (shared_dir("fixtures", "vllm-real") / "vllm-0.32.0-cpu__idle.txt").read_text()

    async def go() -> list[ServerSample]:
        clock = FakeClock()
        port = free_port()
        server = FakeVllmServer(port=port, metrics=idle, version="0.32.0", models=["tiny"])
        proc = VllmProcess(pid=700, create_time=clock.now - 60, host="127.0.0.1", port=port, pids=(700, 701), engine_pids=(701,))
        table = FakeProcessTable([proc])
        src = source(clock, processes=table, max_response_bytes=1 << 20)
        steps = [
            lambda: None,
            lambda: setattr(server, "metrics", _broken_timer(idle, 8060)),
            lambda: setattr(server, "metrics", _broken_timer(idle, 2 * 8060)),
            lambda: setattr(server, "metrics", idle.replace("vllm:num_preemptions_total{", "vllm:num_preemptions_total{\xff", 1).encode("latin-1")),
            lambda: setattr(server, "metrics", b"# " + b"y" * (2 << 20)),
            lambda: (setattr(server, "metrics", idle), table.processes.__setitem__(0, replace(proc, pids=(700,), engine_pids=()))),
        ]
        out: list[ServerSample] = []
        await server.start()
        try:
            for step in steps:
                step()
                out += await src.poll()
                clock.advance(2.0)
        finally:
            await src.close()
            await server.stop()
        return out

    samples = asyncio.run(go())
    store = open_store(db_url)
    try:
        repo = VllmRepository(store.engine)
        repo.write("h", samples)
        (inst,) = repo.instances("h")
        rows = repo.samples(inst["id"])
    finally:
        store.close()
    ok, _, flagged, partial, large, lost = rows
    assert (ok["telemetry"], ok["metric_lines_dropped"], ok["latency_unreliable"], ok["reason"]) == ("full", 0, frozenset(), "first /health 200")
    assert flagged["ttft_p50_seconds"] == pytest.approx(0.0005)  # interpolated in (0, 1 ms]: kept as read
    assert flagged["latency_unreliable"] == {"ttft"}
    assert flagged["latency_unreliable_reason"].startswith("ttft: p50 0.0005 s above what the mean 7.28e-05 s allows")
    assert latency_for_alerts(flagged, "ttft", 50) is None and latency_for_alerts(ok, "ttft", 50) is None
    assert (partial["telemetry"], partial["metric_lines_dropped"], partial["state"]) == ("partial", 1, ServerState.IDLE)
    assert (large["telemetry"], large["metrics_error"], large["reason"]) == ("down", "too large", "/metrics: too large")
    assert large["telemetry_up"] is False and large["running"] is None
    assert (lost["state"], lost["reason"]) == (ServerState.DEAD, "engine lost (pid 701 gone)")
