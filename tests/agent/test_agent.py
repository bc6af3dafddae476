"""The agent under stop signals and device failures: nothing lost, nothing half-written."""

from __future__ import annotations

import signal
import subprocess
import sys

from conftest import H200_CAPTURE, replay_into, stored_ticks, wait_for
from sqlalchemy import text

from vgpumon.diagnose import build_report
from vgpumon.sources.nvml.backend import NVML_ERROR_GPU_IS_LOST
from vgpumon.sources.nvml.capture import read_capture
from vgpumon.store.engine import make_engine
from vgpumon.testing import scenarios


def test_sigterm_mid_run_stores_every_sampled_tick_whole(tmp_path):
    """An 8-GPU host (the H200 capture replicated) replayed at recorded pace, stopped by
    SIGTERM once it has stored two ticks and is taking more: exit 0, and every tick the agent
    took is stored for all 8 GPUs (those of the unfinished flush interval included)."""
    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 8)
    cap = tmp_path / "eight.jsonl.gz"
    scenarios.write(cap, header, ticks)
    db = tmp_path / "x.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "vgpumon", "agent", "--replay", str(cap), "--pace", "recorded", "--db", f"sqlite:///{db}",
         "--flush-interval", "3s", "--listen", "off"],
        stderr=subprocess.PIPE, text=True,
    )
    wait_for(lambda: stored_ticks(db) >= 16 or proc.poll() is not None, what="two stored ticks of 8 GPUs")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    reported_ticks = int(err.split("vgpumon agent: ")[1].split(" ticks")[0])
    assert 2 <= reported_ticks < 70
    with make_engine(f"sqlite:///{db}").connect() as conn:
        per_tick = conn.execute(text("SELECT ts, count(*) FROM gpu_samples GROUP BY ts")).all()
    assert len(per_tick) == reported_ticks
    assert {n for _, n in per_tick} == {8}


def test_lost_gpu_degrades_only_itself_and_comes_back(db_url, store_of):
    """GPU 1 of 4 answers GPU_IS_LOST to every call for ticks 20–29 (derived from the H200
    capture): the other three keep every tick; GPU 1 is stored as down (no values) and retried
    with back-off at ticks 20, 21, 23, 27 and 35 — so it is down for ticks 20–34 and reports again
    from tick 35; diagnose warns."""
    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 4)
    header, ticks = scenarios.fail_call(header, ticks, "*", NVML_ERROR_GPU_IS_LOST, from_tick=20, until_tick=30, devices={1})
    agent = replay_into(db_url, scenarios.backend(header, ticks))
    store = store_of(db_url)
    gpus = store.gpus_of("h200-replay")
    assert len(gpus) == 4
    for g in gpus:
        rows = store.series(g.id, 0, 2e9, ("up", "power_watts"))
        assert len(rows) == agent.stats.ticks
        down = [r for r in rows if not r["up"]]
        if g.identity.index == 1:
            assert [rows.index(r) for r in down] == list(range(20, 35))
            assert all(r["power_watts"] is None for r in down)
            assert rows[-1]["up"] and rows[-1]["power_watts"] is not None
        else:
            assert down == []
    report = build_report(store, "h200-replay")
    assert report["status"] == "warning"
    assert report["gpus"][1]["findings"][0]["message"].startswith("GPU unreadable for 15 of")


def test_gpu_processes_are_stored_with_their_owner_state(db_url):
    """The capture's torch process (a PID of the recording host, absent here) is stored as an
    unresolved process, and its GPU memory per tick rises through the growth phase."""
    import asyncio

    from conftest import H200_PHASES

    from vgpumon.agent import Agent
    from vgpumon.sources.host import HostSource
    from vgpumon.sources.nvml import NvmlSource
    from vgpumon.sources.nvml.capture import ReplayBackend
    from vgpumon.store import open_store

    store = open_store(db_url)
    asyncio.run(Agent(NvmlSource(ReplayBackend(H200_CAPTURE)), store, hostname="h", paced=False, host=HostSource()).run())
    with store.engine.connect() as conn:
        procs = conn.execute(text("SELECT pid, resolved, name FROM processes")).all()
        used = [r[0] for r in conn.execute(text("SELECT used_gpu_memory_bytes FROM gpu_process_samples ORDER BY ts"))]
    store.close()
    assert len(procs) == 1 and not procs[0][1] and procs[0][2] is None
    growth = H200_PHASES["growth_total_bytes"]
    assert max(used) - min(used) >= growth  # the process's own bytes grew by what it allocated
