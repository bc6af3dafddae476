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
from vgpumon.sources.vllm.discovery import DEFAULT_PORT, PsutilProcessTable, is_engine_process, is_vllm_server, port_and_host
from vgpumon.sources.vllm.metrics import parse_metrics


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
import multiprocessing, sys, time

def engine():
    time.sleep(600)

if __name__ == "__main__":
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
    proc = subprocess.Popen([sys.executable, str(script), "serve", "m", "--port", "18999"], stdout=subprocess.PIPE, text=True)
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
        proc.kill()
        proc.wait(10)
