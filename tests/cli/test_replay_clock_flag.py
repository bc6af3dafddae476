"""``vgpumon agent --replay-clock``: the clock a replay's rows are stamped with (docs/exporter.md,
"Replays on one clock"). At the recorded pace the default is the wall clock; ``capture`` keeps the
capture's own times, which an agent restarted on the rest of a capture needs for the ticks it
sends twice to be stored once (bench/fault_run.py). On the recorded H200 capture (November 2026)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import H200_CAPTURE

from vgpumon.sources.nvml.capture import read_capture


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUMON_")}
    return subprocess.run([sys.executable, "-m", "vgpumon", *args], capture_output=True, text=True, env=env, timeout=300)


def _stored_times(db: Path) -> list[float]:
    with sqlite3.connect(db) as conn:
        return [ts / 1000.0 for (ts,) in conn.execute("SELECT DISTINCT ts FROM gpu_samples ORDER BY ts")]


def _first_recorded() -> float:
    _, ticks = read_capture(H200_CAPTURE)
    return next(float(t["ts"]) for t in ticks if t["tick"] >= 0 and t["ts"] is not None)


@pytest.mark.parametrize("clock", ["wall", "capture", None])
def test_a_recorded_pace_replay_is_stamped_on_the_clock_asked_for(tmp_path, clock):
    db = tmp_path / "s.db"
    started = time.time()
    out = _run("agent", "--replay", str(H200_CAPTURE), "--pace", "recorded", *(["--replay-clock", clock] if clock else []),
               "--duration", "2s", "--db", str(db), "--listen", "off", "--no-rules", "--spool", str(tmp_path / "spool"))
    assert out.returncode == 0, out.stderr
    times = _stored_times(db)
    assert times, "the replay stored no tick"
    if clock == "capture":
        assert times[0] == pytest.approx(_first_recorded(), abs=0.001)  # the capture's own first tick
    else:  # the default at the recorded pace: the first tick lands when it is replayed
        assert started - 1 <= times[0] <= time.time()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--replay-clock", "capture"], "vgpumon: --replay-clock stamps a replay: give --replay CAPTURE (a live agent reads the wall clock)"),
        (["--replay", str(H200_CAPTURE), "--replay-clock", "wall"],
         "vgpumon: --replay-clock wall needs --pace recorded: a replay as fast as possible runs ahead of the wall clock"),
    ],
)
def test_a_replay_clock_that_cannot_apply_is_a_usage_error(tmp_path, args, said):
    out = _run("agent", *args, "--db", str(tmp_path / "s.db"), "--listen", "off")
    assert out.returncode == 64
    assert out.stderr.strip() == said
    assert not (tmp_path / "s.db").exists()
