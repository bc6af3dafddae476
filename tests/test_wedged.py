"""A call that does not return (a wedged driver, the failure that makes other GPU exporters hang)
costs only its GPU: the others keep their schedule, the wedged one is marked and skipped until
the call returns, and SIGTERM still ends the agent at once. Derived from the recorded H200
capture: 8 GPUs (``replicate_devices``), GPU 3's power read blocking 30 s at tick 5
(``delay_call``), replayed at the capture's own pace."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from conftest import H200_CAPTURE, replay_into

from vgpumon.sources.nvml_backend import read_capture
from vgpumon.testing import scenarios


def _wedge():
    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 8)
    return scenarios.delay_call(header, list(ticks), 3, "nvmlDeviceGetPowerUsage", 30.0, at=[5])


def test_one_wedged_gpu_of_eight_costs_the_others_nothing(tmp_path, store_of):
    """40 s at recorded pace: 7 GPUs keep at least 38 ticks, GPU 3 is down ('wedged') while its
    call hangs and comes back after it returns; both are events."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    header, ticks = _wedge()
    t0 = time.monotonic()
    agent = replay_into(
        url, scenarios.backend(header, ticks), hostname="h", agent_kw={"recorded_pace": True, "duration": 40.0}
    )
    took = time.monotonic() - t0
    store = store_of(url)
    rows = {g.identity.index: store.series(g.id, 0, 2e9, ("up", "power_watts")) for g in store.gpus_of("h")}
    assert agent.stats.ticks >= 38
    for index, series in rows.items():
        up = [r for r in series if r["up"]]
        if index == 3:
            down = [r for r in series if not r["up"]]
            assert 25 <= len(down) <= 31, len(down)  # the ~30 s the call hung
            assert up and series[-1]["up"] and series[-1]["power_watts"] is not None  # back after it returned
        else:
            assert len(up) >= 38, (index, len(up))
    events = [(e.kind, e.subject, e.detail) for e in store.events("h", 0, 2e9)]
    kinds = [k for k, _, _ in events]
    assert kinds == ["gpu_wedged", "gpu_unwedged"]
    assert events[0][1].endswith("000000000003") and "nvmlDeviceGetPowerUsage did not return" in events[0][2]
    assert "nvmlDeviceGetPowerUsage returned after 3" in events[1][2]  # ~30 s
    assert took < 50  # the run kept the capture's pace: the hang did not add its 30 s


def test_sigterm_during_a_wedge_ends_the_agent_at_once(tmp_path):
    header, ticks = _wedge()
    cap = tmp_path / "wedge.jsonl.gz"
    scenarios.write(cap, header, ticks)
    db = tmp_path / "x.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "vgpumon", "agent", "--replay", str(cap), "--pace", "recorded", "--db", f"sqlite:///{db}",
         "--hostname", "h"],
        stderr=subprocess.PIPE, text=True,
    )
    time.sleep(10)  # tick 5's call has hung for about 5 s
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    took = time.monotonic() - sent
    assert proc.returncode == 0, err
    assert took < 2.0, f"SIGTERM took {took:.1f} s during the wedge"
    assert "Traceback" not in err
    ticks_taken = int(err.split("vgpumon agent: ")[1].split(" ticks")[0])
    assert ticks_taken >= 8
