"""Every GPU health rule fires on a case derived from a recorded H200 capture and stays silent on its
recorded (or nearly recorded) counterpart — silent meaning judged ok, not unknown.

Each case names its transformation (``vgpumon.testing.scenarios``); values injected into real
ticks are ones seen on real boards (an uncorrectable ECC count, a failed row remap, XID 79, the
H200's own slowdown threshold of 89 °C from bench/results/h200-thresholds.txt). The replay runs
through the agent with its rule runner (alerts stored) and is then evaluated as ``diagnose``
does; both must agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
from conftest import H200_CAPTURE
from rules_support import (
    PCIE_GPM,
    at_end,
    copy_phase,
    firing,
    idle_full,
    replay,
    stored_alerts,
    with_slowdown_threshold,
)

from vgpumon.sources.nvml.backend import NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_GPU_IS_LOST
from vgpumon.testing import scenarios

MEMORY_V2 = {"version": 33554472}  # the kwargs of the recorded memory-info v2 call


def _set_every_tick(header, ticks, fn, value_of_tick, args=()):
    for t in [t["tick"] for t in ticks if t["tick"] >= 0]:
        header, ticks = scenarios.set_call(header, ticks, 0, fn, {"v": value_of_tick(t)}, at=[t], args=args)
    return header, ticks


def _xid(code: int):
    def derive():
        header, ticks = scenarios.load(str(H200_CAPTURE))
        ts = ticks[41]["ts"]  # tick 40 (the init block is first)
        return scenarios.set_call(header, ticks, "sys", "xid_poll", {"v": [{"index": 0, "xid": code, "ts": ts}]}, at=[40])
    return derive


def _slow(fn: str, value, args=()):
    """A slow-set call of idle_full answering ``value`` from tick 10 on."""
    def derive():
        header, ticks = idle_full()
        return scenarios.set_call(header, ticks, 0, fn, {"v": value}, at=range(10, 21), args=args)
    return derive


def _two_gpus_one_lost(until: int | None):
    def derive():
        header, ticks = scenarios.replicate_devices(*idle_full(repeat=5), 2)
        return scenarios.fail_call(header, ticks, "*", NVML_ERROR_GPU_IS_LOST, from_tick=20, until_tick=until, devices={1})
    return derive


def _two_gpus():
    return scenarios.replicate_devices(*idle_full(repeat=5), 2)


def _four_gpus(reload_loses_one: bool):
    """Four GPUs; with the reload, the driver goes away for two ticks at tick 30 and comes back
    with three (NVML lists GPU 3 no more): the agent re-initialises and never sees GPU 3 again."""
    def derive():
        header, ticks = scenarios.repeat(*scenarios.replicate_devices(*scenarios.load(str(H200_CAPTURE)), 4), 3)
        if reload_loses_one:
            header, ticks = scenarios.fail_call(header, ticks, "*", NVML_ERROR_DRIVER_NOT_LOADED, from_tick=30, until_tick=32)
            header, ticks = scenarios.set_call(header, ticks, "sys", "nvmlDeviceGetCount", {"v": 3}, at=range(30, 300))
        return header, ticks
    return derive


def _thermal(temperature: float | None = None, reasons: int | None = None):
    def derive():
        header, ticks = with_slowdown_threshold(*idle_full(repeat=8))
        if temperature is not None:
            header, ticks = _set_every_tick(header, ticks, "nvmlDeviceGetTemperature", lambda t: temperature, args=[0])
        if reasons is not None:
            header, ticks = _set_every_tick(header, ticks, "nvmlDeviceGetCurrentClocksEventReasons", lambda t: reasons)
        return header, ticks
    return derive


def _memory_used(share: float | None, repeat: int = 1):
    def derive():
        header, ticks = idle_full(repeat=repeat)
        if share is None:
            return header, ticks
        body = [t["tick"] for t in ticks if t["tick"] >= 0]
        return scenarios.edit_call(header, ticks, 0, "nvmlDeviceGetMemoryInfo", lambda v: {**v, "used": int(share * v["total"])},
                                   at=body, kwargs=MEMORY_V2)
    return derive


def _replays(per_read: int):
    def derive():
        # 84 s of the idle capture: the replay counter is read each minute (the minute set), twice here
        return _set_every_tick(*idle_full(repeat=4), "nvmlDeviceGetPcieReplayCounter", lambda t: 1 + per_read * t)
    return derive


#: GPM DRAM_BW_UTIL: the copy writes device memory (~1.1 % DRAM activity in the recording)
DRAM_GPM = 10


def _copy(stalled: bool = False, link_gen: int | None = None):
    """The recorded copy phase, 6 min. ``stalled``: the copy stopped moving data — PCIe and DRAM
    GPM outputs zeroed — while utilization stays at the recorded 99-100 % and SMs at 0: a context
    that holds the GPU and does nothing (a stuck GPU)."""
    def derive():
        header, ticks = copy_phase(minutes=6)
        if stalled:
            header, ticks = scenarios.scale_gpm(header, ticks, (DRAM_GPM, *PCIE_GPM), 0.0)
        if link_gen is not None:
            header, ticks = _set_every_tick(header, ticks, "nvmlDeviceGetCurrPcieLinkGeneration", lambda t: link_gen)
        return header, ticks
    return derive


def _slot(gen: int | None):
    def derive():
        header, ticks = idle_full()
        if gen is None:
            return header, ticks
        return scenarios.set_call(header, ticks, 0, "nvmlDeviceGetMaxPcieLinkGeneration", {"v": gen}, at=[-1])
    return derive


@dataclass(frozen=True)
class Case:
    rule: str
    fires: Callable[[], tuple]
    silent: Callable[[], tuple]
    gpu: str = "0"  # the GPU the rule names
    words: str = ""  # a phrase the firing alert's description must hold


CASES = [
    Case("GpuEccUncorrectable", _slow("nvmlDeviceGetTotalEccErrors", 2, args=[1, 0]), _slow("nvmlDeviceGetTotalEccErrors", 0, args=[1, 0]),
         words="2 volatile uncorrectable ECC errors"),
    Case("GpuRowRemapFailed", _slow("nvmlDeviceGetRemappedRows", [0, 1, 0, 1]), _slow("nvmlDeviceGetRemappedRows", [0, 1, 1, 0]),
         words="failed row remap"),
    Case("GpuRowRemapPending", _slow("nvmlDeviceGetRemappedRows", [0, 1, 1, 0]), _slow("nvmlDeviceGetRemappedRows", [0, 1, 0, 0]),
         words="A row remap is pending"),
    Case("GpuRemappedRowsHigh", _slow("nvmlDeviceGetRemappedRows", [0, 600, 0, 0]), _slow("nvmlDeviceGetRemappedRows", [0, 511, 0, 0]),
         words="600 rows remapped"),
    Case("GpuXidCritical", _xid(79), _xid(13), words="XID 79 × 1 (GPU has fallen off the bus)"),
    Case("GpuXidWarning", _xid(94), _xid(79), words="XID 94 × 1 (contained ECC error)"),
    Case("GpuXidOther", _xid(13), _xid(94), words="XID 13 × 1 (graphics engine exception"),
    Case("GpuLost", _two_gpus_one_lost(None), _two_gpus, gpu="1", words="it is lost now"),
    Case("GpuUnreadable", _two_gpus_one_lost(30), _two_gpus, gpu="1", words="GPU unreadable for"),
    Case("GpuMissing", _four_gpus(True), _four_gpus(False), gpu="3", words="3 of the host's 4 registered GPUs report now"),
    Case("GpuStuck", _copy(stalled=True), _copy(), words="the GPU is stuck, not busy"),
    Case("GpuThermalSlowdown", _thermal(temperature=90), _thermal(), words="against this GPU's own slowdown threshold 89 °C"),
    Case("GpuThermalSlowdown", _thermal(reasons=0x20), _thermal(reasons=0x4), words="Thermal clocks-event reason active 100 %"),
    Case("GpuPowerBrakeSlowdown", _thermal(reasons=0x80), _thermal(reasons=0x4), words="Hardware power brake active 100 %"),
    Case("GpuMemoryNearlyFull", _memory_used(0.97), _memory_used(None), words="97 % of the GPU's memory in use"),
    Case("GpuMemoryHeldIdle", _memory_used(0.2, repeat=180), _memory_used(None, repeat=180), words="30.15 GB held for the last 60 min"),
    Case("GpuPcieLinkDegraded", _copy(link_gen=3), _copy(), words="The link ran at Gen3 x16 (max Gen5 x16)"),
    Case("GpuPcieSlotSlower", _slot(4), _slot(None), words="supports PCIe Gen5 but the slot allows Gen4"),
    Case("GpuPcieReplaysHigh", _replays(100), _replays(0), words="above DCGM's budget of 31/min for Gen5 x16"),
]
IDS = [f"{c.rule}-{i}" for i, c in enumerate(CASES)]


def _finding(url: str, rule: str, gpu: str):
    by_rule, _ = at_end(url)
    (f,) = [f for f in by_rule[rule] if f.labels["gpu"] == gpu]
    return f


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_health_rule_fires_on_a_derived_capture(case, tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    replay(url, *case.fires())
    f = _finding(url, case.rule, case.gpu)
    assert f.state == "firing", f
    alerts = firing(stored_alerts(url), case.rule)  # the agent's own evaluation agrees
    assert [a.labels["gpu"] for a in alerts] == [case.gpu]
    assert case.words in alerts[0].description, alerts[0].description


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_health_rule_is_silent_on_its_counterpart(case, tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    replay(url, *case.silent())
    f = _finding(url, case.rule, case.gpu)
    assert f.state == "ok", f  # judged healthy on its inputs — not unknown for lack of them
    assert firing(stored_alerts(url), case.rule) == []



# -- a source that stopped reporting --------------------------------------------------------------

from vgpumon.model import InstanceIdentity, ServerSample, ServerState  # noqa: E402
from vgpumon.store import Store  # noqa: E402
from vgpumon.store.vllm_repository import VllmRepository  # noqa: E402


def _gpu_times(url: str) -> list[float]:
    store = Store(url)
    try:
        (gpu,) = store.gpus_of("h")
        return [r["ts"] for r in store.series(gpu.id, 0, 4e9, ("up",))]
    finally:
        store.close()


def _feed_sources(url: str, until: float) -> None:
    """Host samples and one vLLM server's polls alongside the GPU ticks, up to ``until``."""
    store = Store(url)
    try:
        host_id = store.host_id("h")
        times = [t for t in _gpu_times(url) if t <= until]
        store.write_extra_rows([{"host_samples": [{"host_id": host_id, "ts": t, "cpu_ratio": 0.1, "memory_used_bytes": 2**34,
                                                   "memory_total_bytes": 2**40, "load1": 1.0, "load5": 1.0, "load15": 1.0}
                                                  for t in times]}])
        ident = InstanceIdentity(host="127.0.0.1", port=8000, url="http://127.0.0.1:8000", origin="static", pid=None,
                                 process_start=None, first_seen=times[0])
        VllmRepository(store.engine).write("h", [ServerSample(instance=ident, ts=t, state=ServerState.IDLE, reason="idle",
                                                              telemetry="full") for t in times])
    finally:
        store.close()


@pytest.mark.parametrize("stopped", [True, False])
def test_a_source_that_stopped_reporting_is_its_own_alert(tmp_path, stopped):
    """GPU ticks for 210 s (the idle capture, repeated); host samples and vLLM polls stop after
    the first minute — or go on to the end."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    replay(url, *idle_full(repeat=10))
    times = _gpu_times(url)
    _feed_sources(url, times[0] + 60 if stopped else times[-1])
    by_rule, alerts = at_end(url)
    states = {f.labels["source"]: f.state for f in by_rule["VgpumonSourceSilent"]}
    assert states == ({"nvml": "ok", "host": "firing", "vllm": "firing"} if stopped else {"nvml": "ok", "host": "ok", "vllm": "ok"})
    if stopped:
        (host,) = [a for a in alerts if a.name == "VgpumonSourceSilent" and a.labels["source"] == "host"]
        assert host.description == "The host source's newest host sample is 3 min old (limit 2 min)."


# -- collector faults reach every face ------------------------------------------------------------


def _copy_with_gpm_zero(first: int, last: int, until: int | None = None) -> tuple[dict, list]:
    """3 min of the recorded copy, the throughput call reading 59.6 GB/s (what it read on this
    H200, FACTS §1) on every tick, and GPM's PCIe at 0 B/s on ticks ``first`` … ``last - 1``
    (the failure seen in another exporter); cut after tick ``until``."""
    header, ticks = copy_phase(minutes=3)
    for t in ticks:
        if t["tick"] >= 0:
            reading = {"v": {"tx_KBps": 20_000, "rx_KBps": 59_600_000, "ts": t["ts"] - 0.5}}
            header, ticks = scenarios.set_call(header, ticks, 0, "pcie_throughput", reading, at=[t["tick"]], kwargs={"period": 10.0})
    if last > first:
        header, ticks = scenarios.edit_call(header, ticks, 0, "gpm", lambda m: {**m, "20": 0.0, "21": 0.0},
                                            at=list(range(first, last)), args=([2, 3, 5, 10, 20, 21],))
    if until is not None:
        ticks = [t for t in ticks if t["tick"] <= until]
    return {**header, "slow_every": 2}, ticks  # a cross-check every other tick


def test_a_collector_fault_is_a_finding_an_alert_and_a_series(tmp_path):
    """The recorded copy with GPM reading 0 B/s for 90 s while the throughput call reads
    59.6 GB/s: the agent withholds GPM's PCIe figures. The fault was only a log line and an
    event, and diagnose said OK. Now VgpumonCollectorFault fires in the agent while the figures
    are withheld and resolves once a cross-check agrees; a report read after an agent stopped
    mid-fault is a WARNING naming both figures; /metrics serves vgpumon_gpu_collector_fault 1
    while it lasts, 0 before and after. Without the fault nothing fires."""
    from conftest import read_all
    from exporter_support import fed, scrape

    from vgpumon.diagnose import build_report
    from vgpumon.model import Snapshot
    from vgpumon.store import Store

    url = f"sqlite:///{tmp_path / 'x.db'}"
    replay(url, *_copy_with_gpm_zero(30, 120))
    (episode,) = firing(stored_alerts(url), "VgpumonCollectorFault")
    assert episode.labels["gpu"] == "0" and episode.resolved_at is not None  # cleared after GPM agreed again
    assert "GPM PCIe RX 0.00 GB/s while nvmlDeviceGetPcieThroughput reads 59.60 GB/s" in (episode.description or "")

    stopped = f"sqlite:///{tmp_path / 'stopped.db'}"  # the agent stopped mid-fault
    replay(stopped, *_copy_with_gpm_zero(30, 120, until=90))
    store = Store(stopped)
    try:
        report = build_report(store, "h", window_seconds=120)
    finally:
        store.close()
    assert report["status"] == "warning", report["verdict"]
    (finding,) = [f for f in report["findings"] if f["alert"] == "VgpumonCollectorFault"]
    assert finding["severity"] == "warning" and "withheld, not zero" in finding["message"], finding
    assert "59.60 GB/s" in finding["message"]

    header, ticks = _copy_with_gpm_zero(30, 120)
    src, readings = read_all(scenarios.backend(header, ticks), slow_every=2)
    uuid = src.gpus[0].uuid
    faults = [scrape(fed([Snapshot(ts=r.ts, hostname="h", gpus=src.gpus, samples=r.samples)])).value(
        "vgpumon_gpu_collector_fault", hostname="h200-replay", gpu="0", uuid=uuid) for r in readings]
    assert faults[10] == 0.0 and faults[-1] == 0.0 and faults.count(1.0) >= 60, faults

    clean = f"sqlite:///{tmp_path / 'clean.db'}"
    replay(clean, *_copy_with_gpm_zero(0, 0))
    assert firing(stored_alerts(clean), "VgpumonCollectorFault") == []
