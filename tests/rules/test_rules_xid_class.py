"""XID classes on the 8-GPU incident (``vgpumon.testing.incident``, derived from the recorded H200
captures), its ticks spread 5 min apart (76 ticks: 6 h 15 min) so that its XIDs fall in windows of
their own. The incident has XID 13 on GPU 2 at tick 20 (an application fault, as seen in the
wild); each case adds events at tick 74 (the end of the run):

* XID 13 again on GPU 2 alone: the same code on one GPU in two windows → ``GpuXidRepeated``;
* XID 13 on GPUs 0–3 at once: spread over the host → ``HostXidSpread``, and the GPU-2 window
  does not count as a repeat;
* XID 13 three times within tick 20 (a burst): one window, no repeat.

The replay runs through the agent with its rule runner (alerts stored), then is evaluated as
``diagnose`` does at the end; both must agree."""

from __future__ import annotations

import math

import pytest
from conftest import DATA
from rules_support import at_end, diagnosed, firing, replay, stored_alerts

from vgpumon.config.thresholds import Thresholds
from vgpumon.rules.catalogue import BY_NAME
from vgpumon.testing import incident, scenarios

TICK_S = 300.0  # the recorded 1 s ticks, spread to 5 min
WINDOW_S = Thresholds().xid_burst_seconds


def _window_start(ts: float) -> float:
    return math.floor(ts / WINDOW_S) * WINDOW_S


def _incident(extra: dict[int, list[tuple[int, int, float]]]):
    """The incident, retimed, with ``extra[tick]`` = [(gpu, xid, seconds)] as that tick's XID
    events (replacing the tick's own), each at that many seconds into the XID window (3 min,
    aligned in Unix time) the tick's time falls in: events meant to share a window do."""
    header, ticks = incident.build(DATA)
    header, ticks = scenarios.retime(header, ticks, TICK_S)
    ticks = list(ticks)
    ts = {t["tick"]: t["ts"] for t in ticks}
    for at, events in extra.items():
        header, ticks = scenarios.set_call(
            header, ticks, "sys", "xid_poll", {"v": [{"index": g, "xid": x, "ts": _window_start(ts[at]) + d} for g, x, d in events]}, at=[at])
    return header, list(ticks)


def _run(tmp_path, extra):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    replay(url, *_incident(extra))
    by_rule, _ = at_end(url)
    return by_rule, stored_alerts(url)


def _diagnosed(tmp_path, alert: str) -> list[str]:
    return diagnosed(f"sqlite:///{tmp_path / 'x.db'}", alert)


def _gpu(findings, gpu: str):
    (f,) = [f for f in findings if f.labels["gpu"] == gpu]
    return f


def test_the_same_xid_alone_on_one_gpu_twice_in_a_day_points_at_the_hardware(tmp_path):
    by_rule, alerts = _run(tmp_path, {74: [(incident.APP_XID_GPU, 13, 1.0)]})
    f = _gpu(by_rule["GpuXidRepeated"], "2")
    assert f.state == "firing" and f.value == 2.0
    text = BY_NAME["GpuXidRepeated"].describe(f)
    assert text.startswith("XID 13 (graphics engine exception") and "in 2 windows of 3 min, alone on the host each time (2 events" in text
    assert [a.labels["gpu"] for a in firing(alerts, "GpuXidRepeated")] == ["2"]  # the agent agrees
    assert _diagnosed(tmp_path, "GpuXidRepeated") == [text]
    assert {g.labels["gpu"]: g.state for g in by_rule["GpuXidRepeated"] if g.labels["gpu"] != "2"} == {
        "0": "ok", "1": "ok", "3": "ok", "4": "ok", "5": "ok", "6": "ok", "7": "ok"}
    assert [g.state for g in by_rule["HostXidSpread"]] == ["ok"]


def test_the_same_xid_on_four_gpus_at_once_points_at_the_workload_not_the_board(tmp_path):
    by_rule, alerts = _run(tmp_path, {74: [(g, 13, 1.0 + g) for g in range(4)]})
    (spread,) = by_rule["HostXidSpread"]
    assert spread.state == "firing" and spread.value == 4.0 and spread.labels == {"hostname": "h"}
    assert "on GPUs 0, 1, 2, 3 within the 3 min ending" in BY_NAME["HostXidSpread"].describe(spread)
    assert "(4 events)" in BY_NAME["HostXidSpread"].describe(spread)
    assert len(firing(alerts, "HostXidSpread")) == 1
    assert _diagnosed(tmp_path, "HostXidSpread") == [BY_NAME["HostXidSpread"].describe(spread)]
    # GPU 2 had XID 13 at tick 20 too, but its second window is the host's, not its own
    assert _gpu(by_rule["GpuXidRepeated"], "2").state == "ok"
    assert firing(alerts, "GpuXidRepeated") == []


@pytest.mark.parametrize("burst", [3])
def test_a_burst_of_one_xid_counts_once(tmp_path, burst):
    by_rule, alerts = _run(tmp_path, {20: [(incident.APP_XID_GPU, 13, 1.0 + i) for i in range(burst)]})
    f = _gpu(by_rule["GpuXidRepeated"], "2")
    assert f.state == "ok" and f.value == 1.0  # three events, one window
    assert firing(alerts, "GpuXidRepeated") == [] and firing(alerts, "HostXidSpread") == []
