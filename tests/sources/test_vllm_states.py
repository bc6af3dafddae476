"""What the vLLM source reports for a server that starts, serves, hangs, sleeps, dies or sends
garbage: real HTTP servers on 127.0.0.1 serving recorded captures, an injected clock, no sleeps."""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import replace
from typing import Any, Awaitable, Callable

import pytest
from vllm_support import lifecycle_body, shared_dir, source

from vgpumon.model import GpuSample, Snapshot
from vgpumon.sources.vllm import ServerSample, ServerState, VllmProcess
from vgpumon.testing.vllm import FakeClock, FakeProcessTable, FakeVllmServer

S = ServerState


def _capture(name: str) -> str:
    return (shared_dir("fixtures", "vllm-real") / name).read_text()


def _lifecycle_rows() -> dict[float, dict[str, Any]]:
    d = shared_dir("fixtures", "vllm-real")
    return {r["t"]: r for r in map(json.loads, (d / "vllm-0.32.0-cpu__lifecycle.jsonl").read_text().splitlines())}


class Rig:
    """One fake server, tracked as a discovered process on a fake clock."""

    def __init__(self, *, interval: float = 0.5, pid: int = 4242, **kw: Any) -> None:
        self.clock = FakeClock()
        self.t0 = self.clock.now
        self.interval = interval
        # the port stays bound (not listening: a connect is refused) until the server starts, so
        # that no other test's server takes it meanwhile (the suite runs in parallel)
        self._hold = socket.socket()
        self._hold.bind(("127.0.0.1", 0))
        self.port = self._hold.getsockname()[1]
        self.server = FakeVllmServer(port=self.port, version="0.32.0", models=["tiny"])
        self.proc = VllmProcess(pid=pid, create_time=self.t0, host="127.0.0.1", port=self.port, pids=(pid, pid + 1))
        self.table = FakeProcessTable([self.proc])
        self.src = source(self.clock, processes=self.table, interval=interval, **kw)

    async def poll(self) -> list[ServerSample]:
        out = await self.src.poll()
        self.clock.advance(self.interval)
        return out

    async def one(self) -> ServerSample:
        (smp,) = await self.poll()
        return smp

    async def start_server(self) -> None:
        self._hold.close()
        await self.server.start(self.port)

    async def close(self) -> None:
        self._hold.close()
        await self.src.close()
        await self.server.stop()


def run(test: Callable[[Rig], Awaitable[None]], **kw: Any) -> None:
    async def go() -> None:
        rig = Rig(**kw)
        try:
            await test(rig)
        finally:
            await rig.close()

    asyncio.run(go())


def test_refused_for_5s_then_ready_gives_prewarm_within_one_poll():
    """Acceptance: the port refuses for the first 5 s of the process's life (injected clock,
    polls every 0.7 s), then answers: starting … starting → ready, prewarm 5 s within one poll."""

    async def t(rig: Rig) -> None:
        rig.server.metrics = _capture("vllm-0.32.0-cpu__idle.txt")
        seen = []
        while rig.clock.now - rig.t0 < 8:
            if rig.clock.now - rig.t0 >= 5.0 and not rig.server.running:
                await rig.start_server()
            seen.append(await rig.one())
        states = [s.state for s in seen]
        first_ready = states.index(S.READY)
        assert set(states[:first_ready]) == {S.STARTING}
        assert all(s.reason == "connection refused" for s in seen[:first_ready])
        assert seen[first_ready].ts - rig.t0 >= 5.0
        assert states[first_ready + 1:] == [S.IDLE] * (len(states) - first_ready - 1)
        ready = seen[-1]
        assert ready.prewarm_seconds is not None
        assert 5.0 <= ready.prewarm_seconds <= 5.0 + rig.interval
        assert ready.first_connect_ts == ready.ready_ts == seen[first_ready].ts
        assert all(s.prewarm_seconds is None for s in seen[:first_ready])

    run(t, interval=0.7)


def test_health_200_alone_is_not_ready_until_the_model_is_listed_or_its_metrics_serve():
    """An API process that answers /health 200 while it lists no model and serves no vllm:
    metric (a router in front of an engine still loading) stays starting, saying why; it is
    ready at the poll that lists its model, and its prewarm ends there, not at the first 200.
    The second server serves the recorded 0.32 idle metrics and lists no model yet: its vllm:
    metrics alone make it ready at its first 200."""

    async def t(rig: Rig) -> None:
        rig.server.models, rig.server.metrics = [], "# nothing yet\n"
        await rig.start_server()
        early = [await rig.one() for _ in range(4)]
        assert {s.state for s in early} == {S.STARTING}, [(s.state, s.reason) for s in early]
        assert all(s.health_status == 200 for s in early)
        assert early[-1].reason == "/health 200, but no model listed by /v1/models and no vllm: metrics yet"
        listed_at = rig.clock.now
        rig.server.models = ["tiny"]
        ready = await rig.one()
        assert ready.state == S.READY and ready.ready_ts == listed_at and ready.model_names == ("tiny",)
        assert ready.prewarm_seconds == pytest.approx(listed_at - rig.t0)
        assert ready.first_connect_ts is not None and ready.first_connect_ts < ready.ready_ts

    run(t)

    async def metrics_only(rig: Rig) -> None:
        rig.server.models, rig.server.metrics = [], _capture("vllm-0.32.0-cpu__idle.txt")
        await rig.start_server()
        first = await rig.one()
        assert first.state == S.READY and first.health_status == 200

    run(metrics_only)


def test_process_gone_before_ready_is_failed_to_start():
    async def t(rig: Rig) -> None:
        assert (await rig.one()).state is S.STARTING
        assert (await rig.one()).state is S.STARTING
        rig.table.processes.clear()
        (gone,) = await rig.poll()
        assert (gone.state, gone.reason, gone.ended) == (S.FAILED_TO_START, "process gone", True)
        assert gone.prewarm_seconds is None
        assert await rig.poll() == []  # no longer tracked

    run(t)


@pytest.mark.parametrize("how", ["health 503", "refused", "process gone"])
def test_death_after_ready(how):
    """Dead after ready, whichever way it shows: /health 503 (vLLM ≥ 0.11 with a dead engine),
    the port refusing (the server exited after its engine died), or the process gone."""

    async def t(rig: Rig) -> None:
        rig.server.metrics = _capture("vllm-0.32.0-cpu__idle.txt")
        await rig.start_server()
        assert (await rig.one()).state is S.READY
        assert (await rig.one()).state is S.IDLE
        if how == "health 503":
            rig.server.health_status = 503
            rig.server.metrics = _capture("vllm-0.32.0-cpu__engine-killed.txt")  # still 200
        elif how == "refused":
            await rig.server.stop()
        else:
            rig.table.processes.clear()
        dead = (await rig.poll())[0]
        assert dead.state is S.DEAD
        assert dead.reason == {"health 503": "/health 503", "refused": "connection refused", "process gone": "process gone"}[how]
        assert dead.ended is (how == "process gone")
        assert dead.prewarm_seconds is None  # ready at the first poll: the start was not watched

    run(t)


def test_restart_on_same_port_is_a_new_start():
    async def t(rig: Rig) -> None:
        rig.server.metrics = _capture("vllm-0.32.0-cpu__idle.txt")
        await rig.start_server()
        first = await rig.one()
        assert first.state is S.READY
        new = VllmProcess(pid=5555, create_time=rig.clock.now, host="127.0.0.1", port=rig.port, pids=(5555,))
        rig.table.processes[:] = [new]
        old_end, new_first = await rig.poll()
        assert (old_end.instance.pid, old_end.state, old_end.ended) == (4242, S.DEAD, True)
        assert (new_first.instance.pid, new_first.instance.process_start) == (5555, new.create_time)
        assert new_first.state is S.READY and new_first.prewarm_seconds is None  # start not watched

    run(t)


def test_work_queued_and_token_counters_flat_is_hung():
    """The busy capture (97 running) served unchanged: busy while the counters could still move,
    hung after 3 flat scrapes, with /health 200 throughout."""

    async def t(rig: Rig) -> None:
        rig.server.metrics = _capture("vllm-0.32.0-cpu__busy.txt")
        await rig.start_server()
        states = [(await rig.one()).state for _ in range(5)]
        assert states == [S.READY, S.BUSY, S.BUSY, S.HUNG, S.HUNG]
        last = rig.src.servers[("127.0.0.1", rig.port)]
        assert last.reason == "work queued, token counters flat for 4 scrapes"
        assert last.running == 97

    run(t, hang_after=3)


def test_tokens_advancing_is_busy_with_throughput():
    """Two consecutive polls of the real server while it served 400 completions."""
    rows = _lifecycle_rows()

    async def t(rig: Rig) -> None:
        await rig.start_server()
        rig.server.metrics = lifecycle_body(rows[59.05])
        await rig.one()
        rig.server.metrics = lifecycle_body(rows[59.57])
        smp = await rig.one()
        assert smp.state is S.BUSY and smp.running == 22
        assert smp.generation_tokens_per_second == pytest.approx((1394 - 27) / rig.interval)
        # a server restart resets the counter: the increase is the new value, never negative
        rig.server.metrics = lifecycle_body(rows[56.26])
        assert (await rig.one()).generation_tokens_per_second == 0.0

    run(t)


def test_idle_engine_is_idle_and_its_frozen_gauges_are_marked_stale():
    async def t(rig: Rig) -> None:
        rig.server.metrics = _capture("vllm-0.32.0-cpu__idle.txt")
        await rig.start_server()
        seen = [await rig.one() for _ in range(6)]
        assert [s.state for s in seen] == [S.READY] + [S.IDLE] * 5
        assert [s.gauges_stale for s in seen] == [False, False, False, True, True, True]
        assert seen[-1].generation_tokens_per_second == 0.0

    run(t, hang_after=3)


def test_sleeping_from_engine_sleep_state():
    """The idle capture with its sleep-state series flipped to weights_offloaded (the 0.12+
    metric, as ``POST /sleep`` level 1 sets it)."""
    idle = _capture("vllm-0.32.0-cpu__idle.txt")
    asleep = idle.replace('sleep_state="awake"} 1.0', 'sleep_state="awake"} 0.0').replace(
        'sleep_state="weights_offloaded"} 0.0', 'sleep_state="weights_offloaded"} 1.0'
    )
    assert asleep != idle

    async def t(rig: Rig) -> None:
        rig.server.metrics = idle
        await rig.start_server()
        await rig.one()
        assert (await rig.one()).state is S.IDLE
        rig.server.metrics = asleep
        smp = await rig.one()
        assert (smp.state, smp.sleep_state) == (S.SLEEPING, "weights_offloaded")
        rig.server.metrics = idle
        assert (await rig.one()).state is S.IDLE

    run(t)


def test_sleeping_from_is_sleeping_without_the_metric():
    """A server without ``engine_sleep_state`` that runs in dev mode (``/is_sleeping``)."""

    async def t(rig: Rig) -> None:
        rig.server.metrics = lifecycle_body(_lifecycle_rows()[56.26])  # no engine_sleep_state
        rig.server.is_sleeping = False
        await rig.start_server()
        await rig.one()
        assert (await rig.one()).state is S.IDLE
        rig.server.is_sleeping = True
        smp = await rig.one()
        assert (smp.state, smp.sleep_state) == (S.SLEEPING, "asleep")

    run(t)


def test_without_vllm_metrics_the_server_is_ready_with_limited_telemetry():
    d = shared_dir("fixtures", "vllm")

    async def t(rig: Rig) -> None:
        rig.server.metrics = (d / "vllm-issue-7188.txt").read_text()
        await rig.start_server()
        seen = [await rig.one() for _ in range(4)]
        assert {(s.state, s.telemetry) for s in seen} == {(S.READY, "limited")}
        assert all(s.running is None and s.kv_cache_usage_ratio is None for s in seen)

    run(t)


def test_stats_endpoint_fills_what_metrics_lack():
    """A deployment's JSON /stats (vLLM has none): running, waiting and KV usage in percent."""
    d = shared_dir("fixtures", "vllm")

    async def t(rig: Rig) -> None:
        rig.server.metrics = (d / "vllm-issue-7188.txt").read_text()
        rig.server.stats = {"num_requests_running": 3, "num_requests_waiting": 1, "gpu_cache_usage_perc": 42.0}
        await rig.start_server()
        await rig.one()
        smp = await rig.one()
        assert (smp.running, smp.waiting, smp.kv_cache_usage_ratio) == (3, 1, pytest.approx(0.42))
        assert smp.state is S.BUSY

    run(t)


@pytest.mark.parametrize(
    "break_it,reason",
    [
        (lambda s: setattr(s, "metrics", bytes(range(256)) * 64), "/metrics: unparseable"),
        (lambda s: setattr(s, "metrics", b"x" * (20 << 20)), "/metrics: too large"),
        (lambda s: (setattr(s, "metrics", b"# " + b"y" * (20 << 20)), setattr(s, "metrics_chunked", True)), "/metrics: too large"),
        (lambda s: setattr(s, "metrics_status", 500), "/metrics: HTTP 500"),
        (lambda s: s.hang.add("/metrics"), "/metrics: timeout"),
    ],
    ids=["garbage", "20MB-content-length", "20MB-chunked", "http-500", "timeout"],
)
def test_metrics_failing_while_health_is_fine_is_telemetry_down(break_it, reason):
    async def t(rig: Rig) -> None:
        rig.server.metrics = _capture("vllm-0.32.0-cpu__idle.txt")
        await rig.start_server()
        assert (await rig.one()).state is S.READY
        break_it(rig.server)
        smp = await rig.one()
        assert smp.state is S.TELEMETRY_DOWN
        assert smp.reason.startswith(reason)
        assert smp.running is None and smp.telemetry == "down"
        rig.server.metrics, rig.server.metrics_status, rig.server.metrics_chunked = _capture("vllm-0.32.0-cpu__idle.txt"), 200, False
        rig.server.hang.clear()
        assert (await rig.one()).state is S.IDLE  # back once /metrics answers again

    run(t, max_response_bytes=8 << 20, request_timeout=1.0)  # /health must answer within it on a loaded machine


def test_health_timing_out_after_ready_is_hung():
    async def t(rig: Rig) -> None:
        rig.server.metrics = _capture("vllm-0.32.0-cpu__idle.txt")
        await rig.start_server()
        await rig.one()
        rig.server.hang.add("/health")
        smp = await rig.one()
        assert (smp.state, smp.reason) == (S.HUNG, "/health timed out")

    run(t, request_timeout=0.3)


def test_gpu_mapping_and_prewarm_gpu_activity_from_nvml_snapshots():
    """The engine process (a child of the API server) shows in GPU 1's NVML process list: the
    server maps to GPU 1 only, and the prewarm activity is GPU 1's mean SM activity over the
    prewarm window (samples outside the window or of other GPUs do not count)."""

    async def t(rig: Rig) -> None:
        rig.server.metrics = _capture("vllm-0.32.0-cpu__idle.txt")
        engine_pid = rig.proc.pids[1]

        def snap(ts: float, sm: dict[str, float]) -> Snapshot:
            samples = tuple(
                GpuSample(ts=ts, uuid=u, index=i, sm_active_ratio=sm[u], activity_source="gpm",
                          processes=((engine_pid, 1 << 30),) if u == "GPU-1" else ((99, 1 << 20),))
                for i, u in enumerate(("GPU-0", "GPU-1"))
            )
            return Snapshot(ts=ts, hostname="h", gpus=(), samples=samples)

        rig.src.observe(snap(rig.t0 - 10, {"GPU-0": 0.9, "GPU-1": 0.9}))  # before the process started
        for act in (0.2, 0.4, 0.6):
            rig.src.observe(snap(rig.clock.now, {"GPU-0": 0.99, "GPU-1": act}))
            smp = await rig.one()
            assert smp.state is S.STARTING and smp.gpu_uuids == ("GPU-1",)
        await rig.start_server()
        ready = await rig.one()
        assert ready.state is S.READY and ready.gpu_uuids == ("GPU-1",)
        assert ready.prewarm_gpu_active_ratio == pytest.approx(0.4)
        assert ready.prewarm_gpu_activity_source == "gpm"

    run(t)


@pytest.mark.parametrize("capture,before", [("vllm-0.32.0-cpu__idle.txt", S.IDLE), ("vllm-0.32.0-cpu__busy.txt", S.BUSY)])
def test_engine_killed_while_the_api_process_lives_is_dead_within_two_polls(capture, before):
    """The engine core (and its worker) is killed; the API process lives on and, as in 0.2.x and
    V1 0.8.x, /health keeps answering 200 with the last gauges. Idle, nothing else would ever
    tell (it stayed idle for good); with work queued it read as hung. Either way: dead, "engine
    lost", within two polls, from the server's process tree."""

    async def t(rig: Rig) -> None:
        rig.server.metrics = _capture(capture)
        await rig.start_server()
        api, core, worker = rig.proc.pid, rig.proc.pid + 1, rig.proc.pid + 2
        whole = replace(rig.proc, pids=(api, core, worker), engine_pids=(core, worker))
        rig.table.processes[:] = [whole]
        assert [(await rig.one()).state for _ in range(2)] == [S.READY, before]
        rig.table.processes[:] = [replace(whole, pids=(api,), engine_pids=())]
        after = [await rig.one() for _ in range(2)]
        dead = next(s for s in after if s.state is S.DEAD)
        assert dead.reason == f"engine lost (pid {core}, {worker} gone)"
        assert after[-1].state is S.DEAD and not after[-1].ended  # the API process is still there

    run(t)


def test_engine_processes_come_and_go_before_ready_without_a_death():
    """Before the first /health 200 the tree changes as the server starts (a compile helper, the
    engine appearing): that is not a loss."""

    async def t(rig: Rig) -> None:
        rig.server.metrics = _capture("vllm-0.32.0-cpu__idle.txt")
        api = rig.proc.pid
        rig.table.processes[:] = [replace(rig.proc, pids=(api, api + 5), engine_pids=(api + 5,))]
        assert (await rig.one()).state is S.STARTING  # refused: not listening yet
        rig.table.processes[:] = [replace(rig.proc, pids=(api, api + 1), engine_pids=(api + 1,))]
        await rig.start_server()
        assert [(await rig.one()).state for _ in range(3)] == [S.READY, S.IDLE, S.IDLE]

    run(t)


def _broken_lines(body: str) -> bytes:
    """The real idle scrape with two of its lines broken as they break in the wild: one with a
    byte that is not UTF-8, one the parser refuses (its label set is not closed)."""
    out = []
    for ln in body.splitlines():
        if ln.startswith("vllm:num_preemptions_total{"):
            out.append(ln.encode().replace(b"engine", b"eng\xffine"))
        elif ln.startswith("vllm:prompt_tokens_total{"):
            out.append(ln.replace("}", "", 1).encode())
        else:
            out.append(ln.encode())
    return b"\n".join(out) + b"\n"


def test_unreadable_lines_are_counted_and_make_telemetry_partial_not_down():
    """Both broken lines are dropped and counted; every other line is read: the server is idle
    with its KV figures, its telemetry partial (it used to be down: one bad line cost the whole
    scrape)."""

    async def t(rig: Rig) -> None:
        rig.server.metrics = _broken_lines(_capture("vllm-0.32.0-cpu__idle.txt"))
        await rig.start_server()
        first, second = await rig.one(), await rig.one()
        assert (first.state, second.state) == (S.READY, S.IDLE)
        assert (second.telemetry, second.metric_lines_dropped) == ("partial", 2)
        assert (second.running, second.waiting, second.kv_num_gpu_blocks) == (0, 0, 16384)
        rig.server.metrics = _capture("vllm-0.32.0-cpu__idle.txt")
        whole = await rig.one()
        assert (whole.telemetry, whole.metric_lines_dropped) == ("full", 0)

    run(t)


def test_reading_a_body_just_under_the_limit_costs_a_few_times_the_body():
    """A 2 MB scrape (the real busy one with 60 LoRA adapters' series) is read with at most twice
    its size in Python allocations on top of it; reading the whole text first cost 14 times."""
    import tracemalloc

    from vgpumon.sources.vllm.metrics import parse_metrics
    from vgpumon.testing.vllm import with_adapters

    body = with_adapters(_capture("vllm-0.32.0-cpu__busy.txt"), 2_000_000)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        reading = parse_metrics(body)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert len(reading.model_names) > 50
    assert peak < 2 * len(body), f"{peak / len(body):.1f}x the body"
