"""A replay's one clock, unit by unit (docs/exporter.md, "Replays on one clock"): at the recorded
pace the capture moves onto the wall clock at its first tick; as fast as possible a live source
beside it reads the capture's clock. On the recorded H200 capture (November 2026)."""

from __future__ import annotations

from conftest import H200_CAPTURE

from vgpumon.agent.process import ReplayClock
from vgpumon.sources.nvml.capture import ReplayBackend, read_capture


def _recorded() -> list[float]:
    _, ticks = read_capture(H200_CAPTURE)
    return [float(t["ts"]) for t in ticks if t["tick"] >= 0 and t["ts"] is not None]


def test_at_the_recorded_pace_the_first_tick_lands_on_the_wall_clock_and_the_rest_keep_their_spacing():
    recorded = _recorded()
    wall = 1_900_000_000.0  # the moment of the replay, long after the capture
    backend = ReplayBackend(H200_CAPTURE, shift_s=-3600.0, anchor=lambda: wall)  # --shift-to-now's shift is replaced
    backend.init()
    times = [backend.begin_tick(0.0) for _ in range(5)]
    assert times[0] == wall
    assert [b - a for a, b in zip(times, times[1:])] == [b - a for a, b in zip(recorded[:5], recorded[1:5])]
    assert backend.shift_s == wall - recorded[0]  # XID events move with the ticks


def test_as_fast_as_possible_a_live_source_reads_the_captures_clock_between_ticks():
    recorded = _recorded()
    now = {"wall": 1_900_000_000.0}
    clock = ReplayClock(ReplayBackend(H200_CAPTURE).first_ts, wall=lambda: now["wall"])
    assert clock.now() == recorded[0]  # before the first tick: the capture's start, not today
    now["wall"] += 0.5
    clock.observe(type("Snap", (), {"ts": recorded[40]})())  # the replay raced 40 ticks ahead in half a second
    now["wall"] += 0.25
    assert clock.now() == recorded[40] + 0.25  # a vLLM poll now is stamped 0.25 s after that tick
