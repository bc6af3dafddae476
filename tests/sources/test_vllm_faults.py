"""The vLLM source under faults, with the agent and a real store: a failure handling one server
costs only that server's poll, a failing source is restarted, the GPU rows are stored whatever the
source does, and vLLM samples wait in the spool with the GPU rows while the store is away."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, AsyncIterator

import pytest
from conftest import H200_CAPTURE, count, replay_into, run_locked_sqlite
from vllm_support import ServerThread, shared_dir, source

from vgpumon.agent import Agent
from vgpumon.sources.nvml import NvmlSource
from vgpumon.sources.nvml.capture import ReplayBackend
from vgpumon.sources.vllm import ServerState, VllmProcess, VllmSource
from vgpumon.sources.vllm.discovery import NoProcesses, ProcessUsage
from vgpumon.store import open_store
from vgpumon.store.spool import Backlog
from vgpumon.store.vllm_repository import VllmRepository
from vgpumon.testing.vllm import FakeClock, FakeProcessTable, FakeVllmServer

pytestmark = pytest.mark.slow  # starts processes or servers: not in the quick subset (docs/testing.md)

S = ServerState


def _capture(name: str) -> str:
    return (shared_dir("fixtures", "vllm-real") / name).read_text()


def _with_value(body: str, metric: str, value: str) -> str:
    """The capture with every sample of ``metric`` set to ``value`` (a value seen in the wild)."""
    return "\n".join(re.sub(r" \S+$", f" {value}", ln) if ln.startswith(metric + "{") else ln for ln in body.splitlines()) + "\n"


def _samples_by_url(url: str, hostname: str) -> dict[str, list[dict[str, Any]]]:
    """Stored samples per server URL, every start of it, oldest first."""
    store = open_store(url)
    try:
        repo = VllmRepository(store.engine)
        out: dict[str, list[dict[str, Any]]] = {}
        for i in repo.instances(hostname):
            out.setdefault(i["url"], []).extend(repo.samples(i["id"]))
        return out
    finally:
        store.close()


# -- item 8: one server's failure costs only that server's poll ----------------------------------


def test_a_value_the_store_cannot_hold_costs_only_that_servers_rows(db_url):
    """One server reports 1e16 running requests (seen in the wild): a value the store's column
    cannot hold (1e19 in its fixed-point unit). The other server is stored at every poll, every
    GPU tick is stored, the source is never stopped, and each poll of the odd server is either
    stored or set aside in the dead-letter file — none is lost without a word."""
    idle = _capture("vllm-0.32.0-cpu__idle.txt")
    servers = ServerThread()
    try:
        healthy = servers.start(FakeVllmServer(metrics=idle, version="0.32.0"))
        odd = servers.start(FakeVllmServer(metrics=_with_value(idle, "vllm:num_requests_running", "1e16"), version="0.32.0"))
        vllm = VllmSource(static_urls=[healthy.url, odd.url], processes=NoProcesses(), interval=0.05, request_timeout=1.0)
        stats = replay_into(
            db_url, hostname="h", agent_kw={"interval": 0.02, "paced": True, "flush_interval": 0.2, "vllm": vllm}
        ).stats
    finally:
        servers.close()
    assert count(db_url, "SELECT count(*) FROM gpu_samples") == stats.ticks
    assert stats.vllm_restarts == 0 and stats.rows_pending == 0
    rows = _samples_by_url(db_url, "h")
    polls = stats.vllm_samples // 2
    assert polls >= 5
    assert len(rows[healthy.url]) == polls
    assert len(rows.get(odd.url, [])) + stats.dead_letters == polls


def test_agent_exits_0_and_stores_every_gpu_row_while_a_server_reports_1e16(tmp_path):
    """The same through the command line: exit 0 and every tick stored (it used to exit 70 and
    lose the GPU rows of the last batch)."""
    idle = _capture("vllm-0.32.0-cpu__idle.txt")
    servers = ServerThread()
    try:
        odd = servers.start(FakeVllmServer(metrics=_with_value(idle, "vllm:num_requests_running", "1e16"), version="0.32.0"))
        db = tmp_path / "x.db"
        out = subprocess.run(
            [sys.executable, "-m", "vgpumon", "agent", "--listen", "off", "--replay", str(H200_CAPTURE), "--db", f"sqlite:///{db}",
             "--spool", str(tmp_path / "spool"), "--vllm-url", odd.url, "--vllm-interval", "0.1", "--hostname", "h"],
            capture_output=True, text=True, timeout=120,
        )
    finally:
        servers.close()
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    ticks = int(re.search(r"(\d+) ticks of 1 GPU", out.stderr).group(1))
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == ticks
        stored = conn.execute("SELECT count(*) FROM vllm_samples").fetchone()[0]
    letters = tmp_path / "spool.dead-letter.jsonl"
    set_aside = len(letters.read_text().splitlines()) if letters.exists() else 0
    assert stored + set_aside >= 1  # the odd server was polled, and its poll is accounted for


class _SecondServerUsageFails(FakeProcessTable):
    """A process table whose resource reading fails with an I/O error for one server's
    processes, once (psutil lets errno values other than ENOENT/ESRCH/EPERM through)."""

    def __init__(self, processes: list[VllmProcess], failing_pid: int) -> None:
        super().__init__(processes)
        self.failing_pid = failing_pid

    def usage(self, pids):
        if self.failing_pid in pids:
            self.failing_pid = -1
            raise OSError(5, "Input/output error")
        return ProcessUsage(rss_bytes=1 << 30, cpu_seconds={p: 1.0 for p in pids})


def test_one_servers_failing_poll_costs_only_that_poll():
    idle = _capture("vllm-0.32.0-cpu__idle.txt")

    async def go() -> None:
        a = await FakeVllmServer(metrics=idle, version="0.32.0").start()
        b = await FakeVllmServer(metrics=idle, version="0.32.0").start()
        clock = FakeClock()
        procs = [
            VllmProcess(pid=100, create_time=clock.now, host="127.0.0.1", port=a.port, pids=(100,)),
            VllmProcess(pid=200, create_time=clock.now, host="127.0.0.1", port=b.port, pids=(200,)),
        ]
        src = source(clock, processes=_SecondServerUsageFails(procs, failing_pid=200))
        try:
            polls = []
            for _ in range(3):
                polls.append({smp.instance.pid: smp for smp in await src.poll()})
                clock.advance(0.5)
        finally:
            await src.close()
            await a.stop()
            await b.stop()
        # the failing poll of b is a sample that says why it has no figures; a is untouched
        assert polls[0][200].reason == "poll failed: OSError: [Errno 5] Input/output error"
        assert polls[0][200].running is None
        assert (polls[0][100].state, polls[0][100].running) == (S.READY, 0)
        # and b's next polls are whole again
        assert [p[200].state for p in polls[1:]] == [S.READY, S.IDLE]
        assert polls[2][200].rss_bytes == 1 << 30

    asyncio.run(go())


class _BrokenThenFineSource:
    """A vLLM source whose first two runs fail, as a bug in a source would; then it polls. The
    agent takes any source through its constructor (``vllm=``)."""

    def __init__(self) -> None:
        self.runs = 0
        self.closed = False

    def observe(self, snap: Any) -> None:
        pass

    def attach(self, snap: Any) -> Any:
        return snap  # no server: the tick carries no vLLM view

    async def run(self, stop: asyncio.Event) -> AsyncIterator[list[Any]]:
        self.runs += 1
        if self.runs <= 2:
            raise RuntimeError(f"bug in run {self.runs}")
        while not stop.is_set():
            yield []
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        self.closed = True


def test_a_failing_source_is_restarted_with_back_off_and_counted(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    broken = _BrokenThenFineSource()
    stats = replay_into(
        url, hostname="h", agent_kw={"interval": 0.02, "paced": True, "vllm": broken, "vllm_backoff": 0.05}
    ).stats
    assert (stats.vllm_restarts, broken.runs, broken.closed) == (2, 3, True)
    assert count(url, "SELECT count(*) FROM gpu_samples") == stats.ticks


class _DeafSource(_BrokenThenFineSource):
    """A vLLM source stuck in a poll that never returns and never looks at ``stop``."""

    async def run(self, stop: asyncio.Event) -> AsyncIterator[list[Any]]:
        self.runs += 1
        await asyncio.Event().wait()
        yield []


def test_a_source_that_never_stops_does_not_keep_the_gpu_rows_from_the_store(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    deaf = _DeafSource()

    async def go() -> Any:
        return await asyncio.wait_for(
            replay_into_async(url, {"interval": 0.01, "paced": True, "vllm": deaf, "vllm_stop_timeout": 0.2}), 30
        )

    stats = asyncio.run(go())
    assert deaf.closed
    assert count(url, "SELECT count(*) FROM gpu_samples") == stats.ticks == 76


async def replay_into_async(url: str, agent_kw: dict[str, Any]) -> Any:
    store = open_store(url)
    try:
        return await Agent(NvmlSource(ReplayBackend(H200_CAPTURE)), store, hostname="h", **agent_kw).run()
    finally:
        store.close()


# -- item 9: vLLM rows ride the backlog -------------------------------------------------------


class _StepClock:
    """An epoch clock that moves ``step`` seconds each time it is read (one read per poll), so
    that a short test spans several minutes of sample time."""

    def __init__(self, step: float, start: float = 1_800_000_000.0) -> None:
        self._times = itertools.count()
        self.step, self.start = step, start

    def __call__(self) -> float:
        return self.start + next(self._times) * self.step


def _run_locked(url: str, spool: Path, servers: list[FakeVllmServer], *, unlock_at_tick: int | None = None,
                stop_at_tick: int | None = None, on_tick=None, clock=None, **backlog_kw: Any) -> tuple[Agent, Backlog]:
    """Replay the H200 capture with a vLLM source while another connection holds SQLite's write
    lock from the first tick until ``unlock_at_tick`` (None: throughout)."""
    backlog = Backlog(spool, **backlog_kw)
    vllm = VllmSource(
        static_urls=[s.url for s in servers], processes=NoProcesses(), interval=0.03, request_timeout=1.0,
        **({"clock": clock} if clock else {}),
    )
    agent = run_locked_sqlite(
        url,
        lambda store, tick: Agent(
            NvmlSource(ReplayBackend(H200_CAPTURE)), store, hostname="h", interval=0.03, paced=True, flush_interval=0.1,
            backlog=backlog, on_tick=tick, vllm=vllm,
        ),
        unlock_at_tick=unlock_at_tick, stop_at_tick=stop_at_tick, on_tick=on_tick,
    )
    return agent, backlog


def test_vllm_samples_wait_in_the_spool_and_land_in_order_after_a_restart(tmp_path):
    """The store is locked for a whole run: the vLLM samples wait in the spool beside the GPU
    ticks (they used to wait in memory and be lost at exit); the next run replays them first,
    oldest first, and every one of them is stored once."""
    idle = _capture("vllm-0.32.0-cpu__idle.txt")
    url = f"sqlite:///{tmp_path / 'x.db'}"
    spool = tmp_path / "spool"
    servers = ServerThread()
    try:
        srv = servers.start(FakeVllmServer(metrics=idle, version="0.32.0"))
        first, _ = _run_locked(url, spool, [srv])
        assert first.stats.vllm_samples >= 5
        assert any(p.name.endswith(".vllm.json") for p in spool.iterdir())
        assert first.stats.rows_pending == 0
        second, _ = _run_locked(url, spool, [srv], unlock_at_tick=1, stop_at_tick=3)
    finally:
        servers.close()
    assert list(spool.glob("*.json")) == []
    (rows,) = _samples_by_url(url, "h").values()
    assert len(rows) == first.stats.vllm_samples + second.stats.vllm_samples
    assert [r["ts"] for r in rows] == sorted(r["ts"] for r in rows)
    assert [r["state"] for r in rows[:2]] == [S.READY, S.IDLE]


def test_vllm_samples_in_a_full_memory_buffer_fold_to_their_state_changes_and_minutes(tmp_path):
    """Spool unwritable (its path is a file), store locked, room for 12 vLLM samples in memory,
    a poll every 20 s of sample time: the oldest samples fold to one per minute, every change of
    state is kept (the server dies half-way), nothing else is lost, and the count says so."""
    idle = _capture("vllm-0.32.0-cpu__idle.txt")
    url = f"sqlite:///{tmp_path / 'x.db'}"
    not_a_dir = tmp_path / "spool-is-a-file"
    not_a_dir.write_text("")
    servers = ServerThread()
    try:
        srv = servers.start(FakeVllmServer(metrics=idle, version="0.32.0"))

        def kill_half_way(n: int) -> None:
            if n == 35:
                srv.health_status = 503

        agent, backlog = _run_locked(
            url, not_a_dir, [srv], unlock_at_tick=70, on_tick=kill_half_way, clock=_StepClock(20.0),
            max_memory_vllm_rows=12,
        )
    finally:
        servers.close()
    assert agent.stats.vllm_rows_folded > 0 and agent.stats.rows_pending == 0
    (rows,) = _samples_by_url(url, "h").values()
    assert len(rows) + agent.stats.vllm_rows_folded == agent.stats.vllm_samples
    states = [r["state"] for r in rows]
    assert states[0] is S.READY and S.DEAD in states and states[-1] is S.DEAD
    first_dead = states.index(S.DEAD)
    assert set(states[1:first_dead]) == {S.IDLE}
    # a minute of 20 s polls keeps at most its last sample and the changes of state
    by_minute = {}
    for r in rows:
        by_minute.setdefault(int(r["ts"] // 60), []).append(r["state"])
    assert max(len(v) for v in by_minute.values()) <= 3
    assert json.dumps(agent.stats.vllm_rows_folded)  # a plain count for the exit summary
