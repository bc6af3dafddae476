"""Small rules of the vLLM reader that a user would notice if they broke: which processes are
vLLM servers and engine processes and where they listen, and how interval latency quantiles come out of cumulative
histogram buckets."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from vgpumon.sources.vllm.derive import IntervalDeriver, quantile
from vgpumon.sources.vllm.discovery import (
    DEFAULT_PORT,
    PsutilProcessTable,
    is_engine_process,
    is_vllm_server,
    port_and_host,
)
from vgpumon.sources.vllm.metrics import parse_metrics
from vgpumon.testing.vllm import free_port


@pytest.mark.parametrize(
    "cmdline,server",
    [
        (["/usr/bin/python3", "/venv/bin/vllm", "serve", "meta-llama/Llama-3-8B", "--port", "8001"], True),
        (["vllm", "serve", "m"], True),
        (["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], True),
        (["VLLM::EngineCore"], False),
        (["python", "-c", "from multiprocessing.resource_tracker import main;main(32)"], False),
        (["vllm", "bench", "serve"], False),
        (["python", "train.py", "--port", "8000"], False),
    ],
)
def test_which_processes_are_vllm_servers(cmdline, server):
    assert is_vllm_server(cmdline) is server


def test_port_and_host_from_arguments_sockets_or_default():
    assert port_and_host(["vllm", "serve", "m", "--port", "8123", "--host", "0.0.0.0"]) == ("127.0.0.1", 8123)
    assert port_and_host(["vllm", "serve", "m", "--port=9000", "--host=10.1.2.3"]) == ("10.1.2.3", 9000)
    assert port_and_host(["vllm", "serve", "m"], listening=[8555]) == ("127.0.0.1", 8555)
    # several listening sockets (ZMQ between API server and engine): the HTTP default
    assert port_and_host(["vllm", "serve", "m"], listening=[8000, 41233]) == ("127.0.0.1", DEFAULT_PORT)
    assert port_and_host(["vllm", "serve", "m"]) == ("127.0.0.1", DEFAULT_PORT)


def _ttft(counts: dict[str, float], bounds=("0.1", "0.25", "0.5", "+Inf")) -> str:
    lines = ["# TYPE vllm:time_to_first_token_seconds histogram"]
    for le in bounds:
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{le}",model_name="m"}} {counts[le]}')
    lines.append(f'vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {counts["+Inf"]}')
    return "\n".join(lines) + "\n"


def test_interval_quantiles_come_from_bucket_deltas():
    """10 old requests all under 0.1 s; in the interval 4 new ones, all in (0.1, 0.25]: the
    interval's p50 is inside that bucket (0.175 by linear interpolation), not pulled down by
    the old ones. An interval without requests has no latency (None), not 0. A reset (counts
    fall) reads the new counts as the interval's."""
    d = IntervalDeriver()
    assert d.step(0.0, parse_metrics(_ttft({"0.1": 10, "0.25": 10, "0.5": 10, "+Inf": 10})))["ttft_p50_seconds"] is None
    out = d.step(1.0, parse_metrics(_ttft({"0.1": 10, "0.25": 14, "0.5": 14, "+Inf": 14})))
    assert out["ttft_p50_seconds"] == pytest.approx(0.175)
    assert out["ttft_p99_seconds"] == pytest.approx(0.1 + 0.15 * 0.99)
    assert d.step(2.0, parse_metrics(_ttft({"0.1": 10, "0.25": 14, "0.5": 14, "+Inf": 14})))["ttft_p50_seconds"] is None
    reset = d.step(3.0, parse_metrics(_ttft({"0.1": 0, "0.25": 0, "0.5": 2, "+Inf": 2})))
    assert reset["ttft_p50_seconds"] == pytest.approx(0.375)


def test_quantile_beyond_the_last_finite_bucket_is_that_bound():
    assert quantile(0.99, [(0.1, 0.0), (0.5, 1.0), (math.inf, 10.0)]) == 0.5
    assert quantile(0.5, []) is None


@pytest.mark.parametrize(
    "name,cmdline,engine",
    [
        ("VLLM::EngineCor", ["VLLM::EngineCore"], True),  # 0.32.0 titles its engine core ...
        ("VLLM::Worker", ["VLLM::Worker"], True),  # ... and its worker
        ("python", ["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)", "--multiprocessing-fork"], True),
        ("vllm", ["/venv/bin/python", "/venv/bin/vllm", "serve", "m"], True),  # a forked engine keeps the server's arguments
        ("python", ["python", "-B", "-c", "from multiprocessing.resource_tracker import main;main(32)"], False),
        ("g++", ["g++", "/root/.cache/vllm/torch_compile_cache/x.cpp"], False),  # torch.compile's compiler, while starting
    ],
)
def test_which_descendants_are_engine_processes(name, cmdline, engine):
    assert is_engine_process(name, cmdline) is engine


_FAKE_SERVER = """
import multiprocessing, socket, sys, time

def engine():
    time.sleep(600)

if __name__ == "__main__":
    http = socket.create_server(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])))  # where it says: a server
    child = multiprocessing.get_context("spawn").Process(target=engine)
    child.start()
    print(child.pid, flush=True)
    time.sleep(600)  # never joins: a killed engine stays a zombie, as under a busy API process
"""


def test_the_process_table_sees_an_engine_process_go_even_while_it_is_a_zombie(tmp_path):
    """A real process tree: a program run as ``vllm serve`` that starts its engine with
    multiprocessing (as builds without process titles do). The scan lists the engine; once the
    engine is killed (a zombie its parent never reaps) the scan no longer does."""
    script = tmp_path / "vllm"
    script.write_text(_FAKE_SERVER)
    proc = subprocess.Popen([sys.executable, str(script), "serve", "m", "--port", str(free_port())], stdout=subprocess.PIPE, text=True)
    try:
        engine_pid = int(proc.stdout.readline())
        table = PsutilProcessTable()
        (mine,) = [p for p in table.scan() if p.pid == proc.pid]
        assert mine.engine_pids == (engine_pid,) and engine_pid in mine.pids
        os.kill(engine_pid, signal.SIGKILL)
        for _ in range(100):
            if psutil.Process(engine_pid).status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.05)
        (mine,) = [p for p in table.scan() if p.pid == proc.pid]
        assert mine.engine_pids == ()
    finally:
        _kill_tree(proc)


def _kill_tree(proc: subprocess.Popen) -> None:
    """Kill the fake server and what it started (its engine, multiprocessing's resource
    tracker): killing the parent alone leaves them running after the suite."""
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    proc.kill()
    proc.wait(10)
    for c in children:
        try:
            c.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(children, timeout=10)


_WRAPPER = """
import os, sys, time
print("preparing", flush=True)
sys.stdin.readline()  # an entrypoint script's setup, until the test says go
os.execv(sys.executable, [sys.executable, {script!r}, "serve", "m", "--port", "{port}"])
"""


def test_a_server_execed_by_its_wrapper_under_the_same_pid_is_found_at_the_next_scan(tmp_path):
    """An entrypoint that prepares, then ``exec``s ``vllm serve`` keeps its PID: the scan that
    saw the wrapper ("not a server") must not hide the server until the next full read."""
    script = tmp_path / "vllm"
    script.write_text(_FAKE_SERVER)
    wrapper = tmp_path / "entrypoint.py"
    port = free_port()
    wrapper.write_text(_WRAPPER.format(script=str(script), port=port))
    proc = subprocess.Popen([sys.executable, str(wrapper)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "preparing"
        table = PsutilProcessTable(full_every_s=3600)  # no full read during the test
        assert [p for p in table.scan() if p.pid == proc.pid] == []
        proc.stdin.write("go\n")
        proc.stdin.flush()
        int(proc.stdout.readline())  # the server is up (it printed its engine's pid)
        (mine,) = [p for p in table.scan() if p.pid == proc.pid]
        assert mine.port == port
    finally:
        _kill_tree(proc)


def test_discovery_polls_less_often_while_no_server_exists():
    """No server: a scan every ``idle_interval`` and nothing yielded (the agent's event loop is
    not woken for a scan that finds nothing); once one is tracked, a poll every ``interval``."""
    import asyncio

    from vgpumon.sources.vllm import NoProcesses, VllmSource

    class Table(NoProcesses):
        def __init__(self) -> None:
            self.scans: list[float] = []

        def scan(self):
            self.scans.append(time.monotonic())
            return []

    async def main(src: VllmSource, polls: int, limit: float) -> int:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(limit, stop.set)
        n = 0
        async for _ in src.run(stop):
            n += 1
            if n == polls:
                stop.set()
        await src.close()
        return n

    idle = VllmSource(processes=Table(), interval=0.05, idle_interval=0.25)
    assert asyncio.run(main(idle, 4, 1.1)) == 0
    gaps = [b - a for a, b in zip(idle.processes.scans, idle.processes.scans[1:])]
    # (a starved machine scans less often, never more: counts and lower bounds only)
    assert 1 <= len(gaps) <= 4 and min(gaps) >= 0.2, gaps

    # tracked: four polls long before one idle interval (30 s) could have passed
    busy = VllmSource(processes=Table(), interval=0.05, idle_interval=30.0, static_urls=["http://127.0.0.1:9"])
    assert asyncio.run(main(busy, 4, 20.0)) == 4
    assert len(busy.processes.scans) == 4


def test_idle_discovery_finds_a_new_server_at_the_next_scan_and_polls_it_at_once():
    """A server that appears while none is tracked is found by the next idle scan and polled
    right away; a stop ends the idle wait without a poll."""
    import asyncio

    from vgpumon.sources.vllm import NoProcesses, VllmSource
    from vgpumon.sources.vllm.discovery import VllmProcess

    class Table(NoProcesses):
        def __init__(self, appear_at: float) -> None:
            self.appear_at, self.scans = appear_at, []

        def scan(self):
            self.scans.append(time.monotonic())
            if time.monotonic() < self.appear_at:
                return []
            return [VllmProcess(pid=4242, create_time=1.0, host="127.0.0.1", port=9, pids=(4242,), cmdline=("vllm", "serve"))]

    async def main(src: VllmSource) -> list:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(3.0, stop.set)
        started = time.monotonic()
        async for batch in src.run(stop):
            stop.set()
            await src.close()
            return [time.monotonic() - started, batch]
        await src.close()
        return []

    t0 = time.monotonic()
    src = VllmSource(processes=Table(t0 + 0.6), interval=0.05, idle_interval=0.25, request_timeout=0.2)
    took, batch = asyncio.run(main(src))
    # found by the first scan after it appeared (every 0.25 s: at most three before) and polled at
    # once: after it appeared, only that scan and the poll's own
    before = [s for s in src.processes.scans if s < t0 + 0.6]
    after = len(src.processes.scans) - len(before)
    assert took >= 0.6 and 1 <= len(before) <= 3 and 1 <= after <= 2, src.processes.scans
    assert [s.instance.port for s in batch] == [9] and batch[0].instance.pid == 4242


# vllm issue 8115 (vLLM 0.5.x with broken timing): 8060 TTFTs, every one in the first bucket
# (le="0.1"), with a _sum of 0.5871782302856445 s. Two scrapes of such a server, one interval
# apart, "poll after poll".
_BROKEN_BOUNDS = ("0.1", "0.25", "0.5", "0.75", "1.0", "2.5", "5.0", "7.5", "10.0", "+Inf")


def _ttft_with_sum(count: float, total: float, bounds=_BROKEN_BOUNDS, counts=None) -> str:
    counts = counts or {le: count for le in bounds}
    lines = ["# TYPE vllm:time_to_first_token_seconds histogram"]
    for le in bounds:
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{le="{le}",model_name="m"}} {counts[le]}')
    lines.append(f'vllm:time_to_first_token_seconds_count{{model_name="m"}} {count}')
    lines.append(f'vllm:time_to_first_token_seconds_sum{{model_name="m"}} {total}')
    return "\n".join(lines) + "\n"


def test_quantiles_a_broken_timer_gives_are_kept_but_flagged_unreliable():
    """The quantiles read 0.05/0.095/0.099 s as if measured, while the interval's mean is 73 µs:
    no median can exceed twice the mean of non-negative values. They are flagged, with the
    reason, poll after poll, and a rule reading them for an alert gets nothing."""
    from vgpumon.model.vllm import ServerSample, ServerState, latency_for_alerts

    d = IntervalDeriver()
    d.step(0.0, parse_metrics(_ttft_with_sum(8060, 0.5871782302856445)))
    for k in (2, 3):
        out = d.step(k - 1.0, parse_metrics(_ttft_with_sum(8060 * k, 0.5871782302856445 * k)))
        assert (out["ttft_p50_seconds"], out["ttft_p95_seconds"], out["ttft_p99_seconds"]) == pytest.approx((0.05, 0.095, 0.099))
        why = out["latency_unreliable"]["ttft"]
        assert why.startswith("p50 0.05 s above what the mean 7.29e-05 s allows (0.000146 s)")
        assert why.endswith("all 8060 in the lowest bucket (≤ 0.1 s)")
    smp = ServerSample(instance=None, ts=0.0, state=ServerState.BUSY, reason="", ttft_p99_seconds=0.099,
                       latency_unreliable=out["latency_unreliable"])  # type: ignore[arg-type]
    assert latency_for_alerts(smp, "ttft", 99) is None


def test_identical_buckets_without_a_sum_are_flagged():
    """The broken timer's histogram as an exposition without _sum (some builds, some proxies
    drop it): every bucket counts the same 8060, all in the lowest (≤ 0.1 s). Its quantiles
    are interpolation inside that bucket (p50 0.05 s whatever the truth) and no _sum can check
    them: flagged, so no latency rule reads them. A spread histogram without _sum is not."""
    def without_sum(text: str) -> str:
        return "".join(ln + "\n" for ln in text.splitlines() if "_sum" not in ln)

    d = IntervalDeriver()
    d.step(0.0, parse_metrics(without_sum(_ttft_with_sum(8060, 0.5871782302856445))))
    out = d.step(1.0, parse_metrics(without_sum(_ttft_with_sum(16120, 1.1743564605712890))))
    assert out["ttft_p50_seconds"] == pytest.approx(0.05)
    assert out["latency_unreliable"]["ttft"] == (
        "all 8060 in the lowest bucket (≤ 0.1 s) and no _sum to check them by: the quantiles only interpolate inside it")
    spread = {le: (0 if le == "0.1" else 10) for le in _BROKEN_BOUNDS}
    d = IntervalDeriver()
    d.step(0.0, parse_metrics(without_sum(_ttft_with_sum(0, 0.0, counts=dict.fromkeys(_BROKEN_BOUNDS, 0)))))
    assert d.step(1.0, parse_metrics(without_sum(_ttft_with_sum(10, 0.0, counts=spread))))["latency_unreliable"] == {}


def test_a_sum_outside_what_the_buckets_allow_is_flagged():
    """Negative durations (a timer mixing clocks) land in the first bucket and pull _sum below 0;
    a _sum above every observation's upper bound is as impossible."""
    d = IntervalDeriver()
    d.step(0.0, parse_metrics(_ttft_with_sum(0, 0.0)))
    neg = d.step(1.0, parse_metrics(_ttft_with_sum(100, -3.5)))["latency_unreliable"]["ttft"]
    assert neg == "_sum -3.5 s outside what its buckets allow (0…10 s for 100 observations)"
    d = IntervalDeriver()
    d.step(0.0, parse_metrics(_ttft_with_sum(0, 0.0)))
    high = {le: (0 if le == "0.1" else 10) for le in _BROKEN_BOUNDS}  # 10 in (0.1, 0.25]
    assert "outside" in d.step(1.0, parse_metrics(_ttft_with_sum(10, 9.0, counts=high)))["latency_unreliable"]["ttft"]


def test_real_latency_histograms_are_flagged_only_where_interpolation_invents():
    """The real vLLM 0.32.0 server from idle to busy: TTFT (577 between 1 ms and 2.5 s, _sum
    52.4 s), inter-token and end-to-end latencies are plausible and not flagged. Its queue time is:
    all 480 requests waited ≤ 0.3 s (the lowest bucket) for a mean of 9.3 ms, so the median is at
    most 18.6 ms, yet interpolation across [0, 0.3] says 0.15 s."""
    from vllm_support import shared_dir

    d = shared_dir("fixtures", "vllm-real")
    deriver = IntervalDeriver()
    deriver.step(0.0, parse_metrics((d / "vllm-0.32.0-cpu__idle.txt").read_text()))
    out = deriver.step(10.0, parse_metrics((d / "vllm-0.32.0-cpu__busy.txt").read_text()))
    assert out["ttft_p50_seconds"] is not None and out["e2e_p99_seconds"] is not None
    assert set(out["latency_unreliable"]) == {"queue"}
    assert out["queue_p50_seconds"] == pytest.approx(0.15)
    assert out["latency_unreliable"]["queue"] == (
        "p50 0.15 s above what the mean 0.00931 s allows (0.0186 s); all 480 in the lowest bucket (≤ 0.3 s)"
    )


def test_the_gpu_activity_log_keeps_its_window_and_averages_over_it():
    """The prewarm figure's source: per GPU, the activity of the last ``max_age`` seconds (GPM's
    SM activity, else utilization, labelled); older readings are dropped, so a long-running
    agent's log stays the same size."""
    from types import SimpleNamespace as NS

    from vgpumon.sources.vllm import GpuActivityLog

    log_ = GpuActivityLog(max_age=100.0)
    for t in range(1000):
        log_.observe(NS(ts=float(t), samples=[
            NS(ts=float(t), uuid="GPU-a", sm_active_ratio=0.5 if t < 900 else 1.0, utilization_gpu_ratio=0.9),
            NS(ts=float(t), uuid="GPU-b", sm_active_ratio=None, utilization_gpu_ratio=0.25),
            NS(ts=float(t), uuid="GPU-c", sm_active_ratio=None, utilization_gpu_ratio=None),
        ]))
    assert log_.mean(["GPU-a"], 950.0, 999.0) == (1.0, "gpm")
    assert log_.mean(["GPU-a"], 890.0, 909.0) == (0.75, "gpm")  # ten at 0.5, ten at 1.0
    assert log_.mean(["GPU-b"], 0.0, 2000.0) == (0.25, "utilization")
    assert log_.mean(["GPU-a", "GPU-b"], 990.0, 999.0) == (0.625, "mixed")
    assert log_.mean(["GPU-c", "GPU-x"], 0.0, 2000.0) is None
    assert log_.mean(["GPU-a"], 0.0, 850.0) is None  # older than 100 s: gone
    held = [len(times) for times, _, _ in log_._gpus.values()]
    assert all(100 <= n <= 100 + 100 // 7 + 1 for n in held), held  # the window, pruned in batches


def test_an_idle_scan_skips_the_listing_only_while_no_process_was_created(monkeypatch):
    """While no server exists and the kernel's last-given PID (``/proc/loadavg``) has not moved
    since the previous scan, nothing new can be a server: the table is not listed. Any new PID,
    or a kernel whose field never moves, and it is listed again."""
    from vgpumon.sources.vllm import discovery

    last = [1000]
    listings = []
    real_pids = psutil.pids
    monkeypatch.setattr(discovery, "_last_pid", lambda: last[0])
    monkeypatch.setattr(discovery.psutil, "pids", lambda: listings.append(1) or real_pids())
    # no server on this table, whatever else runs on the machine (a test beside this one may run
    # processes whose argv says vllm serve: a server not listening yet is a server found)
    monkeypatch.setattr(discovery, "is_vllm_server", lambda argv: False)
    table = PsutilProcessTable(full_every_s=3600)
    table.scan()
    table.scan()
    assert len(listings) == 2  # the field has not been seen to move yet: listed every time
    last[0] += 1
    table.scan()
    assert len(listings) == 3  # it moved: listed
    table.scan()
    table.scan()
    assert len(listings) == 3  # nothing created since: not listed
    last[0] += 7
    assert [p for p in table.scan() if p.pid == os.getpid()] == []
    assert len(listings) == 4


def test_the_last_pid_is_trusted_only_for_this_namespaces_own_proc(monkeypatch):
    """An agent in a PID namespace of its own that lists a host's procfs (``/proc/self`` is not
    its PID) would never see the host's forks move its namespace's counter: no shortcut there,
    every idle scan lists the table."""
    from vgpumon.sources.vllm import discovery

    assert discovery._last_pid_usable()  # this test's own /proc
    real_readlink = os.readlink
    monkeypatch.setattr(discovery.os, "readlink", lambda p: "1" if p == "/proc/self" else real_readlink(p))
    assert not discovery._last_pid_usable()
    listings = []
    real_pids = psutil.pids
    monkeypatch.setattr(discovery, "_last_pid", lambda: 1000)
    monkeypatch.setattr(discovery.psutil, "pids", lambda: listings.append(1) or real_pids())
    table = PsutilProcessTable(full_every_s=3600)
    table._last_pid_moves = True  # as if it had moved: still listed
    for _ in range(3):
        table.scan()
    assert len(listings) == 3
