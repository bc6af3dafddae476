"""Time and keys (issue "collectors under faults", items 5 and 6): distinct things are never
collapsed into one row, and a wall clock that steps neither loses ticks nor hides the newest
ones. Derived from the recorded H200 captures."""

from __future__ import annotations

import asyncio

import pytest
from conftest import DATA, H200_CAPTURE, replay_into
from sqlalchemy import text

from vgpumon.agent import Agent
from vgpumon.diagnose import build_report
from vgpumon.sources.nvml import NvmlSource
from vgpumon.sources.nvml.capture import ReplayBackend, read_capture
from vgpumon.store import open_store
from vgpumon.testing import scenarios

pytestmark = pytest.mark.slow  # starts processes or servers: not in the quick subset (docs/testing.md)

IDLE_FULL = DATA / "h200-idle-full.jsonl.gz"


def _count(url: str, sql: str) -> int:
    with open_store(url).engine.connect() as conn:
        return conn.scalar(text(sql))


def test_three_xids_in_one_millisecond_are_three_events_and_a_replay_adds_none(tmp_path):
    header, ticks = read_capture(IDLE_FULL)
    t10 = next(t for t in ticks if t["tick"] == 10)["ts"]
    burst = {"v": [{"index": 0, "xid": 31, "ts": t10}] * 3}
    header, ticks = scenarios.set_call(header, ticks, "sys", "xid_poll", burst, at=[10])
    url = f"sqlite:///{tmp_path / 'x.db'}"
    replay_into(url, scenarios.backend(header, ticks))
    assert _count(url, "SELECT count(*) FROM xid_events WHERE xid = 31") == 3
    replay_into(url, scenarios.backend(header, ticks))  # the same capture again: nothing twice
    assert _count(url, "SELECT count(*) FROM xid_events WHERE xid = 31") == 3


def test_a_tick_in_the_same_millisecond_as_the_last_is_kept(tmp_path):
    """Tick 11 stamped in tick 10's millisecond (a fast interval, a coarse clock): before, its rows
    were dropped as duplicates while the agent said every row was stored."""
    header, ticks = read_capture(H200_CAPTURE)
    t10 = next(t for t in ticks if t["tick"] == 10)["ts"]
    ticks = [{**t, "ts": t10 + 0.0002} if t["tick"] == 11 else t for t in ticks]
    url = f"sqlite:///{tmp_path / 'x.db'}"
    agent = replay_into(url, scenarios.backend(header, ticks))
    assert agent.stats.ticks == 76
    assert _count(url, "SELECT count(*) FROM gpu_samples") == 76
    assert _count(url, "SELECT count(DISTINCT ts) FROM gpu_samples") == 76


class _LiveTime:
    """The NVML process edge for a clock test: a capture's answers, but tick times from the
    agent's clocks, which advance 1 s per tick; the wall clock jumps by ``step`` seconds at
    tick ``at`` (an NTP step, a VM resume)."""

    replays_time = False

    def __init__(self, inner: ReplayBackend, step: float, at: int) -> None:
        self.inner, self.step, self.at = inner, step, at
        self.mono, self.wall, self.n = 1000.0, 1_800_000_000.0, 0

    def monotonic(self) -> float:
        return self.mono

    def clock(self) -> float:
        return self.wall

    def begin_tick(self, ts: float) -> float:
        self.inner.begin_tick(ts)
        self.n += 1
        self.mono += 1.0
        self.wall += 1.0 + (self.step if self.n == self.at else 0.0)
        return ts

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def _run_live(url: str, step: float, at: int, **kw) -> Agent:
    header, ticks = read_capture(IDLE_FULL)
    edge = _LiveTime(scenarios.backend(header, ticks), step, at)
    store = open_store(url)
    agent = Agent(
        NvmlSource(edge, slow_every=2), store, hostname="h", paced=False, monotonic=edge.monotonic, clock=edge.clock, **kw
    )
    try:
        asyncio.run(agent.run())
    finally:
        store.close()
    return agent


def test_a_wall_clock_step_back_keeps_every_tick_in_order_and_reports_the_newest(tmp_path, store_of):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    agent = _run_live(url, step=-3600.0, at=10)
    assert agent.stats.ticks == 21
    store = store_of(url)
    (gpu,) = store.gpus_of("h")
    rows = store.series(gpu.id, 0, 2e9, ("up", "pcie_replay_total"))
    assert len(rows) == 21
    stamps = [r["ts"] for r in rows]
    assert stamps == sorted(stamps) and len(set(stamps)) == 21
    (event,) = store.events("h", 0, 2e9)
    assert (event.kind, event.detail) == ("clock_step", "-3600.000 s (back)")
    report = build_report(store, "h", now=stamps[-1])
    assert report["window"]["end"].startswith(__import__("vgpumon.diagnose").diagnose._iso(stamps[-1])[:19])
    assert report["gpus"][0]["samples"] == 21  # the ticks after the step are the newest ones


def test_rates_across_a_wall_clock_step_are_unknown_and_duration_is_monotonic(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    header, ticks = read_capture(IDLE_FULL)
    edge = _LiveTime(scenarios.backend(header, ticks), step=+7200.0, at=9)
    source = NvmlSource(edge, slow_every=2, minute_seconds=0)  # the replay counter on every slow tick
    store = open_store(url)
    readings = []
    agent = Agent(
        source, store, hostname="h", paced=False, monotonic=edge.monotonic, clock=edge.clock, duration=15.0,
        on_tick=lambda snap: readings.append(snap),
    )
    try:
        asyncio.run(agent.run())
    finally:
        store.close()
    # --duration 15 s of monotonic time: a 2 h forward step does not end the run early
    assert agent.stats.ticks == 15
    rates = [s.samples[0].pcie_replay_rate_per_second for s in readings if s.samples[0].pcie_replay_total is not None]
    reasons = [s.samples[0].missing.get("pcie_replay_rate_per_second") for s in readings]
    assert "wall-clock step" in reasons
    assert rates[0] is None and all(r is not None for r in rates[1:4])
    assert [e.kind for s in readings for e in s.events] == ["clock_step"]


def test_rows_stored_counts_rows_inserted_and_duplicates_apart(tmp_path):
    """The same capture replayed twice into one store: the second run stores nothing and says
    so, instead of "76 rows stored"."""
    import subprocess
    import sys

    db = tmp_path / "x.db"
    cmd = [sys.executable, "-m", "vgpumon", "agent", "--listen", "off", "--replay", str(H200_CAPTURE), "--db", f"sqlite:///{db}", "--hostname", "h"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert first.returncode == second.returncode == 0, second.stderr
    assert "76 rows stored" in first.stderr and "skipped" not in first.stderr
    assert "0 rows stored" in second.stderr
    assert "76 rows were stored already and skipped" in second.stderr


class _RealTime:
    """The NVML process edge of a live run: a capture's answers at this host's real clocks."""

    replays_time = False

    def __init__(self, inner: ReplayBackend) -> None:
        self.inner = inner

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


@pytest.mark.parametrize(("interval", "duration", "ticks"), [(0.2, 1.0, 5), (0.25, 0.6, 3)])
def test_a_paced_run_of_a_given_duration_holds_the_ticks_before_it(tmp_path, interval, duration, ticks):
    """``--interval 0.2s --duration 1s``: the ticks at 0, 0.2, 0.4, 0.6 and 0.8 s, never the one
    due at 1 s itself, whichever way the scheduling jitter falls (reads start on their slots)."""
    header, capture = read_capture(IDLE_FULL)
    for _ in range(3):
        agent = Agent(NvmlSource(_RealTime(scenarios.backend(header, capture))), None, hostname="h",
                      interval=interval, duration=duration, paced=True)
        asyncio.run(agent.run())
        assert agent.stats.ticks == ticks
