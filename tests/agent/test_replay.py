"""Replays of long and wide captures: read as they go (bounded memory), and at the capture's own
pace when asked. Captures are derived from the recorded H200 one (``vgpumon.testing.scenarios``)."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import H200_CAPTURE

from vgpumon.agent import Agent
from vgpumon.sources.nvml import NvmlSource
from vgpumon.testing import scenarios

pytestmark = pytest.mark.slow  # starts processes or servers: not in the quick subset (docs/testing.md)

# Runs the agent as a child and prints the child's peak RSS (KiB): a fresh parent, so that no
# other child of the test run (a vLLM server, say) is counted.
_PEAK_RSS = textwrap.dedent(
    """
    import resource, subprocess, sys
    out = subprocess.run(sys.argv[1:], capture_output=True, text=True)
    sys.stderr.write(out.stderr)
    print(out.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    """
)


def test_an_8_gpu_hour_replays_in_bounded_memory(tmp_path: Path) -> None:
    """8 GPUs × 1 h (3648 ticks, 29 184 rows) replayed from a capture file: under 200 MB peak
    RSS, every row stored. Reading the capture whole cost about 290 MB per 8-GPU hour (1.1 GB
    for 4 h); docs/benchmarks.md has the 4-hour figure."""
    header, ticks = scenarios.load(str(H200_CAPTURE))
    header, ticks = scenarios.repeat(header, ticks, 48)
    header, ticks = scenarios.replicate_devices(header, ticks, 8)
    capture = tmp_path / "h200-x8-1h.jsonl.gz"
    scenarios.write(capture, header, ticks)
    db = tmp_path / "x.db"
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, sys.executable, "-m", "vgpumon", "agent", "--listen", "off", "--replay", str(capture),
         "--db", f"sqlite:///{db}", "--spool", str(tmp_path / "spool"), "--hostname", "h"],
        capture_output=True, text=True, timeout=600,
    )
    rc, peak_kib = map(int, out.stdout.split())
    assert rc == 0, out.stderr
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == 48 * 76 * 8, out.stderr[-2000:]
    assert peak_kib < 200 * 1000, f"peak RSS {peak_kib / 1024:.0f} MiB"


def _retimed(tmp_path: Path, factor: float) -> tuple[Path, list[float]]:
    header, ticks = scenarios.retime(*scenarios.load(str(H200_CAPTURE)), factor)
    path = tmp_path / "retimed.jsonl.gz"
    scenarios.write(path, header, ticks)
    return path, [t["ts"] for t in ticks if t["tick"] >= 0]


def test_recorded_pace_follows_the_captures_timestamps_not_the_interval(tmp_path: Path) -> None:
    """The H200 capture at 25 times its pace (ticks 40 ms apart, 3 s in all) with an interval of
    1 s: each tick is taken in no earlier than its recorded offset, and the whole replay takes
    about the capture's 3 s, not the 75 s that pacing by the interval would."""
    from vgpumon.sources.nvml.capture import ReplayBackend

    capture, stamps = _retimed(tmp_path, 0.04)
    seen: list[tuple[float, float]] = []
    agent = Agent(
        NvmlSource(ReplayBackend(capture)), None, hostname="h", interval=1.0, paced=False, recorded_pace=True,
        on_tick=lambda snap: seen.append((time.monotonic(), snap.ts)),
    )
    asyncio.run(agent.run())
    assert [ts for _, ts in seen] == stamps
    (m0, t0) = seen[0]
    assert all(m - m0 >= (ts - t0) - 1e-3 for m, ts in seen)  # never ahead of the recording
    assert seen[-1][0] - m0 < 30.0  # the interval would have taken 75 s


def test_recorded_pace_after_a_gap_in_the_capture_keeps_each_tick_on_time(tmp_path: Path) -> None:
    """A capture with a 1.5 s gap (the recorder paused): the tick after the gap comes when its
    recorded offset says, and so does every later one — no tick held back by the gap's wait
    taken twice (that showed as a stale ``/metrics`` for the gap's length, then a burst)."""
    from vgpumon.sources.nvml.capture import ReplayBackend

    header, ticks = scenarios.retime(*scenarios.load(str(H200_CAPTURE)), 0.04)
    ticks = [t if t["tick"] < 20 else {**t, "ts": t["ts"] + 1.5} for t in ticks]
    capture = tmp_path / "gap.jsonl.gz"
    scenarios.write(capture, header, ticks)
    seen: list[tuple[float, float]] = []
    agent = Agent(
        NvmlSource(ReplayBackend(capture)), None, hostname="h", interval=1.0, paced=False, recorded_pace=True,
        on_tick=lambda snap: seen.append((time.monotonic(), snap.ts)),
    )
    asyncio.run(agent.run())
    (m0, t0) = seen[0]
    late = [round((m - m0) - (ts - t0), 2) for m, ts in seen]
    assert all(x >= -1e-3 for x in late)  # never ahead of the recording
    assert max(late) < 0.75, late  # nor half the gap behind it


def test_pace_recorded_from_the_command_line(tmp_path: Path) -> None:
    capture, stamps = _retimed(tmp_path, 0.04)
    db = tmp_path / "x.db"
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "vgpumon", "agent", "--listen", "off", "--replay", str(capture), "--pace", "recorded", "--interval", "5",
         "--db", f"sqlite:///{db}", "--spool", str(tmp_path / "spool"), "--hostname", "h"],
        capture_output=True, text=True, timeout=120,
    )
    elapsed = time.monotonic() - t0
    assert out.returncode == 0, out.stderr
    assert stamps[-1] - stamps[0] <= elapsed < 60  # 76 ticks at --interval 5 would take 375 s
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == len(stamps)
