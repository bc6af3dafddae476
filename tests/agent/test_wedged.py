"""A call that does not return (a wedged driver, the failure that makes other GPU exporters hang)
costs only its GPU: the others keep their schedule, the wedged one is marked and skipped until
the call returns, and SIGTERM still ends the agent at once. Derived from the recorded H200
capture: 8 GPUs (``replicate_devices``), GPU 3's power read blocking 30 s at tick 5
(``delay_call``), replayed at the capture's own pace."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

import pytest
from conftest import H200_CAPTURE, replay_into
from exporter_support import scrape

from vgpumon.agent import Agent
from vgpumon.exporter.collector import MetricsExporter
from vgpumon.sources.nvml import NvmlSource
from vgpumon.sources.nvml.capture import ReplayBackend, read_capture
from vgpumon.store import open_store
from vgpumon.testing import scenarios

pytestmark = pytest.mark.slow  # starts processes or servers: not in the quick subset (docs/testing.md)


def _wedge():
    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 8)
    return scenarios.delay_call(header, list(ticks), 3, "nvmlDeviceGetPowerUsage", 30.0, at=[5])


def test_one_wedged_gpu_of_eight_costs_the_others_nothing(tmp_path, store_of):
    """40 s at recorded pace: 7 GPUs keep at least 38 ticks, GPU 3 is down ('wedged') while its
    call hangs and comes back after it returns; both are events."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    header, ticks = _wedge()
    agent = replay_into(
        url, scenarios.backend(header, ticks), hostname="h", agent_kw={"recorded_pace": True, "duration": 40.0}
    )
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


def test_sigterm_during_a_wedge_ends_the_agent_at_once(tmp_path):
    header, ticks = _wedge()
    cap = tmp_path / "wedge.jsonl.gz"
    scenarios.write(cap, header, ticks)
    db = tmp_path / "x.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "vgpumon", "agent", "--listen", "off", "--replay", str(cap), "--pace", "recorded", "--db", f"sqlite:///{db}",
         "--hostname", "h"],
        stderr=subprocess.PIPE, text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:  # until the agent says that GPU 3's call hangs (tick 5, ~30 s to go)
        if "did not return" in line:
            break
    else:
        raise AssertionError(f"the agent ended (exit {proc.wait()}) without meeting the wedge")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    # it did not wait for the hung call: that would have logged its return (~30 s later)
    assert "returned after" not in err, err
    ticks_taken = int(err.split("vgpumon agent: ")[1].split(" ticks")[0])
    assert ticks_taken >= 5


@pytest.mark.parametrize("watchdog", ["auto", "thread"])  # the SIGALRM timer (main thread), the thread
def test_a_paced_run_gives_up_on_a_wedged_call_on_its_own_thread(tmp_path, store_of, watchdog):
    """The daemon's path: ticks paced at 0.5 s on the sampling thread, GPU 3's power read hanging
    6 s at tick 3. The watchdog gives up on it after the deadline (0.25 s): the other 7 GPUs keep
    every tick, GPU 3 is down while the call hangs and read again after it returns."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 8)
    header, ticks = scenarios.delay_call(header, list(ticks), 3, "nvmlDeviceGetPowerUsage", 6.0, at=[3])
    agent = replay_into(url, scenarios.backend(header, ticks), hostname="h",
                        agent_kw={"paced": True, "interval": 0.5, "duration": 24.0, "watchdog": watchdog})
    store = store_of(url)
    rows = {g.identity.index: store.series(g.id, 0, 2e9, ("up",)) for g in store.gpus_of("h")}
    assert agent.stats.ticks == 24
    for index, series in rows.items():
        up = sum(1 for r in series if r["up"])
        if index == 3:
            assert 9 <= len(series) - up <= 13, len(series) - up  # ~6 s of 0.5-s ticks
            assert series[-1]["up"]
        else:
            assert up == 24, (index, up)
    kinds = [e.kind for e in store.events("h", 0, 2e9)]
    assert kinds == ["gpu_wedged", "gpu_unwedged"]
    # 24 ticks of 0.5 s in its 24 s, every one with the other 7 GPUs: the hang did not add its 6 s


def test_a_stop_during_a_wedge_ends_a_paced_run_within_the_deadline(tmp_path, store_of):
    """A stop while the sampling thread hangs in a call (30 s): the watchdog gives up on the call,
    the tick is finished on a fresh thread and stored, and the run ends; nothing waits 30 s."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 2)
    header, ticks = scenarios.delay_call(header, list(ticks), 1, "nvmlDeviceGetPowerUsage", 30.0, at=[2])
    source = NvmlSource(scenarios.backend(header, ticks))
    store = open_store(url)
    agent = Agent(source, store, hostname="h", paced=True, interval=0.5, call_deadline=1.0)

    async def main() -> float:
        stop = asyncio.Event()

        async def stop_in_the_hang() -> None:  # tick 2's call on GPU 1 hangs; stop 0.1 s into it
            while (source.inflight() or (None, ""))[:2] != (1, "nvmlDeviceGetPowerUsage"):
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            stop.set()

        stopper = asyncio.ensure_future(stop_in_the_hang())
        await agent.run(stop)
        stopper.cancel()
        return asyncio.get_running_loop().time()

    try:
        asyncio.run(main())
    finally:
        store.close()
    # the run ended while the 30-s call still hung (its return is an event): it did not wait for it
    assert [e.kind for e in store_of(url).events("h", 0, 2e9)] == ["gpu_wedged"]
    assert agent.stats.ticks == 3  # ticks 0 and 1, and tick 2 finished without GPU 1
    rows = {g.identity.index: store_of(url).series(g.id, 0, 2e9, ("up",)) for g in store_of(url).gpus_of("h")}
    assert [r["up"] for r in rows[0]] == [True, True, True]
    assert [r["up"] for r in rows[1]] == [True, True, False]


def test_a_read_that_ended_before_the_watchdog_acts_is_not_given_up(tmp_path, store_of):
    """The race, one way: the watchdog reads "GPU 0 in a call for a minute" just as that read
    ends (here: a stale answer of ``inflight``). The source refuses to abandon a read no longer
    in flight: no wedge, no event, no tick lost, the GPU never marked down."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    source = NvmlSource(ReplayBackend(H200_CAPTURE))
    store = open_store(url)
    # the watchdog thread asks ``inflight`` every tick (the timer asks only when a read overruns)
    agent = Agent(source, store, hostname="h", paced=True, interval=0.2, duration=12.0, watchdog="thread")
    real_inflight = source.inflight
    state = {"stale": 0, "resumed": 0}

    def inflight():
        if state["stale"] == 0 and agent.stats.ticks >= 3:
            state["stale"] = 1
            return (0, "nvmlDeviceGetPowerUsage", time.monotonic() - 60.0)  # "hung" for a minute
        return real_inflight()

    real_resume = source.resume

    def resume():
        state["resumed"] += 1
        return real_resume()

    source.inflight, source.resume = inflight, resume  # type: ignore[method-assign]
    try:
        asyncio.run(agent.run())
    finally:
        store.close()
    assert state == {"stale": 1, "resumed": 0}
    assert agent.stats.ticks == 12  # capture seconds 0..11, every one
    store = store_of(url)
    (gpu,) = store.gpus_of("h")
    assert [r["up"] for r in store.series(gpu.id, 0, 2e9, ("up",))] == [True] * 12
    assert store.events("h", 0, 2e9) == []


def test_a_timer_that_fires_as_a_slow_read_ends_gives_nothing_up(tmp_path, store_of):
    """The timer's race: a tick's read overruns the deadline outside any device's calls (1.5 s
    as the tick is stamped; nothing hangs) and SIGALRM's handler reads "GPU 0 in a call for a
    minute" (a stale answer of ``inflight``). The source refuses to abandon a read no longer in
    flight and the timer is armed again: no wedge, no event, no tick lost."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    source = NvmlSource(ReplayBackend(H200_CAPTURE))
    store = open_store(url)
    # a deadline no real read of a loaded machine overruns (a 0.3-s one did, once, and was rightly
    # given up on), and a stall past it
    agent = Agent(source, store, hostname="h", paced=True, interval=2.0, call_deadline=1.0, duration=16.0)
    real_inflight, real_stamp, real_resume = source.inflight, source._stamp, source.resume
    state = {"slow": 0, "stale": 0, "resumed": 0}

    def stamp(ts):
        if agent.stats.ticks == 3 and state["slow"] == 0:
            state["slow"] = 1
            time.sleep(1.5)  # past the deadline, in no device's calls: the timer fires meanwhile
        return real_stamp(ts)

    def inflight():
        if state["slow"] == 1 and state["stale"] == 0:
            state["stale"] = 1
            return (0, "nvmlDeviceGetPowerUsage", time.monotonic() - 60.0)
        return real_inflight()

    def resume():
        state["resumed"] += 1
        return real_resume()

    source._stamp, source.inflight, source.resume = stamp, inflight, resume  # type: ignore[method-assign]
    try:
        asyncio.run(agent.run())
    finally:
        store.close()
    assert state == {"slow": 1, "stale": 1, "resumed": 0}
    store = store_of(url)
    (gpu,) = store.gpus_of("h")
    ups = [r["up"] for r in store.series(gpu.id, 0, 2e9, ("up",))]
    assert len(ups) == agent.stats.ticks >= 8 and all(ups)
    assert store.events("h", 0, 2e9) == []


def test_a_read_given_up_on_as_it_ends_leaves_its_gpu_sampled(tmp_path, store_of):
    """The race, the other way: GPU 0's last call of a tick returns, and the watchdog gives up on
    the read before it is marked done (here: the read ends 0.6 s after its last call, past the
    0.3-s deadline). The GPU is wedged for that moment and back at once: it used to stay marked
    wedged (down, "wedged: …") for the rest of the run, since no later call of the abandoned read
    came back to say so."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    source = NvmlSource(ReplayBackend(H200_CAPTURE))
    store = open_store(url)
    agent = Agent(source, store, hostname="h", paced=True, interval=1.0, call_deadline=0.3, duration=10.0)
    real_read = source._read_device
    state = {"slow": 0}

    def read_device(gpu, ts, tick, slow):
        sample = real_read(gpu, ts, tick, slow)
        if tick == 3 and state["slow"] == 0:
            state["slow"] = 1
            time.sleep(0.6)  # after the last NVML call of the read: the watchdog acts meanwhile
        return sample

    source._read_device = read_device  # type: ignore[method-assign]
    try:
        asyncio.run(agent.run())
    finally:
        store.close()
    assert state["slow"] == 1
    store = store_of(url)
    (gpu,) = store.gpus_of("h")
    up = [r["up"] for r in store.series(gpu.id, 0, 2e9, ("up",))]
    assert len(up) >= 9 and all(up[4:]), up  # sampled again from the next tick on
    kinds = [e.kind for e in store.events("h", 0, 2e9)]
    assert kinds == ["gpu_wedged", "gpu_unwedged"], kinds


def test_a_call_slow_but_within_its_deadline_skips_slots_and_says_so(tmp_path, store_of, caplog):
    """A deadline longer than the interval (``--call-deadline 2s`` at 0.5 s) lets a 1.6-s call run
    to its end: every GPU's tick waits for it and the slots it ran past have no tick. That is
    counted, logged, and warned about at start."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 2)
    header, ticks = scenarios.delay_call(header, list(ticks), 1, "nvmlDeviceGetPowerUsage", 1.6, at=[2])
    with caplog.at_level("WARNING", logger="vgpumon.agent"):
        agent = replay_into(url, scenarios.backend(header, ticks), hostname="h",
                            agent_kw={"paced": True, "interval": 0.5, "call_deadline": 2.0, "duration": 8.0})
    assert agent.stats.ticks == 8  # the capture's seconds 0..7, every one stored
    assert 2 <= agent.stats.ticks_skipped <= 4, agent.stats.ticks_skipped  # 1.6 s over 0.5-s slots
    served = scrape(MetricsExporter.for_agent(agent))
    assert served.value("vgpumon_agent_ticks_skipped_total", hostname="h") == agent.stats.ticks_skipped
    text = caplog.text
    assert "is not shorter than the interval" in text
    assert "slot(s) without a tick" in text
    assert [e.kind for e in store_of(url).events("h", 0, 2e9)] == []  # slow, not wedged
