"""The NVML source across re-initialisations, resets and a changing device set (issue "collectors
under faults", items 2–4). Every scenario is a documented transformation of the recorded H200
capture (``vgpumon.testing.scenarios``)."""

from __future__ import annotations

import logging

from conftest import H200_CAPTURE, read_all, replay_into

from vgpumon.diagnose import build_report
from vgpumon.sources.nvml import NVML_MEMORY_V2
from vgpumon.sources.nvml.backend import (
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
)
from vgpumon.sources.nvml.capture import read_capture
from vgpumon.testing import scenarios


def _uuid(i: int) -> str:
    return f"GPU-00000000-0000-4000-8000-{i:012d}"


def _events(store, host: str = "h200-replay") -> list[tuple[str, str, str]]:
    return [(e.kind, e.subject, e.detail) for e in store.events(host, 0, 2e9)]


# -- item 2: "not supported" is not remembered forever ------------------------------------------


def test_memory_v2_is_used_again_after_the_driver_upgrade_reinitialises_nvml(tmp_path, store_of):
    """An old driver without memory v2 (FUNCTION_NOT_FOUND) until tick 30; the upgrade shows as
    a library/driver mismatch at tick 30 and NVML re-initialises: from then on v2 answers, and
    the switch (v1 used memory includes ~615 MiB reserved) is stored as an event."""
    header, ticks = read_capture(H200_CAPTURE)
    header, ticks = scenarios.fail_call(
        header, ticks, "nvmlDeviceGetMemoryInfo", NVML_ERROR_FUNCTION_NOT_FOUND, from_tick=0, until_tick=30
    )
    header, ticks = scenarios.fail_call(header, ticks, "*", NVML_ERROR_LIB_RM_VERSION_MISMATCH, from_tick=30, until_tick=31)
    url = f"sqlite:///{tmp_path / 'x.db'}"
    replay_into(url, scenarios.backend(header, ticks))
    store = store_of(url)
    (gpu,) = store.gpus_of("h200-replay")
    rows = store.series(gpu.id, 0, 2e9, ("up", "memory_reserved_bytes", "memory_used_bytes"))
    assert all(r["memory_reserved_bytes"] is None for r in rows[:30])  # v1: no reserved figure
    after = [r for r in rows[31:] if r["up"]]
    assert after and all(r["memory_reserved_bytes"] == 644939776 for r in after)  # v2 again: 615 MiB apart
    kinds = [k for k, _, _ in _events(store)]
    assert kinds == ["nvml_down", "nvml_reinitialized", "memory_api_changed"]
    assert ("memory_api_changed", f"gpu:{_uuid(0)}", "v1 → v2") in _events(store)


def test_utilization_is_asked_again_after_mig_is_turned_off(caplog):
    """Utilization answers NOT_SUPPORTED while MIG is on (ticks 0–19), then again. The cached
    answer is re-probed every ``reprobe_every`` ticks (10 here), and the log says so."""
    header, ticks = scenarios.fail_call(
        *read_capture(H200_CAPTURE), "nvmlDeviceGetUtilizationRates", NVML_ERROR_NOT_SUPPORTED, until_tick=20
    )
    with caplog.at_level(logging.INFO, logger="vgpumon.sources.nvml"):
        _, readings = read_all(scenarios.backend(header, ticks), reprobe_every=10)
    util = [r.samples[0].utilization_gpu_ratio for r in readings]
    assert util[:20] == [None] * 20
    assert all(u is not None for u in util[20:])
    assert "GPU 0: re-probing 1 call(s) cached as not supported: nvmlDeviceGetUtilizationRates" in caplog.text
    # without the re-probe it would stay unknown for the whole run
    _, stale = read_all(scenarios.backend(header, ticks), reprobe_every=10_000)
    assert all(r.samples[0].utilization_gpu_ratio is None for r in stale)


def test_a_gpu_back_from_a_reset_is_asked_again_what_it_supports():
    """Power answers NOT_SUPPORTED until the GPU is lost (ticks 20–24, a reset); after it comes
    back, power is asked again and answers."""
    header, ticks = read_capture(H200_CAPTURE)
    header, ticks = scenarios.fail_call(header, ticks, "nvmlDeviceGetPowerUsage", NVML_ERROR_NOT_SUPPORTED, until_tick=20)
    header, ticks = scenarios.fail_call(header, ticks, "*", NVML_ERROR_GPU_IS_LOST, from_tick=20, until_tick=25)
    _, readings = read_all(scenarios.backend(header, ticks))
    power = [r.samples[0].power_watts for r in readings]
    back = next(i for i, r in enumerate(readings) if i > 20 and r.samples[0].up)
    assert power[:20] == [None] * 20
    assert power[back] is not None and all(p is not None for p in power[back:])
    assert [e.kind for r in readings for e in r.events] == ["gpu_down", "gpu_recovered"]


# -- item 3: the device set is not read once -----------------------------------------------------


def test_a_gpu_that_fails_at_start_is_retried_and_joins_with_its_history(tmp_path, store_of):
    """GPU 2 of 4 cannot be named at start (its UUID answers GPU_IS_LOST) until tick 10: it is
    retried with back-off (ticks 1, 3, 7, 15), stored from the tick it is named, and both facts
    are events; until then diagnose is not OK."""
    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 4)
    header, ticks = scenarios.set_call(header, ticks, 2, "nvmlDeviceGetUUID", {"e": NVML_ERROR_GPU_IS_LOST}, at=[-1])
    header, ticks = scenarios.set_call(header, ticks, 2, "nvmlDeviceGetUUID", {"v": _uuid(2)}, at=range(10, 76))
    url = f"sqlite:///{tmp_path / 'x.db'}"
    early = replay_into(url, scenarios.backend(header, [t for t in ticks if t["tick"] < 5]))
    assert early.stats.gpus == 3
    report = build_report(store_of(url), "h200-replay")
    assert report["status"] == "warning"
    assert any("index:2" in f["message"] and "GPU is lost" in f["message"] for f in report["findings"])

    url = f"sqlite:///{tmp_path / 'y.db'}"
    replay_into(url, scenarios.backend(header, ticks))
    store = store_of(url)
    gpus = {g.identity.index: g for g in store.gpus_of("h200-replay")}
    assert sorted(gpus) == [0, 1, 2, 3]
    rows = store.series(gpus[2].id, 0, 2e9, ("up",))
    assert len(rows) == 76 - 15
    assert [k for k, _, _ in _events(store)] == ["gpu_unidentified", "gpu_appeared"]


def test_a_gpu_that_appears_later_is_sampled_and_one_that_goes_is_an_event(tmp_path, store_of):
    """NVML counts 2 GPUs, then 3 from tick 30 (re-initialised on the slow tick that sees it),
    then 1 from tick 50: GPU 2 is sampled from tick 30, GPUs 1 and 2 stop at tick 50, and the
    store says what appeared and what went."""
    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 3)
    header, ticks = scenarios.set_call(header, ticks, "sys", "nvmlDeviceGetCount", {"v": 2}, at=range(-1, 30))
    header, ticks = scenarios.set_call(header, ticks, "sys", "nvmlDeviceGetCount", {"v": 3}, at=range(30, 50))
    header, ticks = scenarios.set_call(header, ticks, "sys", "nvmlDeviceGetCount", {"v": 1}, at=range(50, 76))
    url = f"sqlite:///{tmp_path / 'x.db'}"
    replay_into(url, scenarios.backend(header, ticks))
    store = store_of(url)
    gpus = {g.identity.index: g for g in store.gpus_of("h200-replay")}
    counts = {i: len(store.series(g.id, 0, 2e9, ("up",))) for i, g in gpus.items()}
    assert counts == {0: 76, 1: 50, 2: 20}
    events = [(k, s) for k, s, _ in _events(store)]
    assert events == [
        ("nvml_reinitialized", "host"),
        ("gpu_appeared", f"gpu:{_uuid(2)}"),
        ("nvml_reinitialized", "host"),
        ("gpu_disappeared", f"gpu:{_uuid(1)}"),
        ("gpu_disappeared", f"gpu:{_uuid(2)}"),
    ]
    report = build_report(store, "h200-replay", window_seconds=3600)
    assert report["status"] == "critical"  # GpuMissing, at once: the source saw them go
    messages = [f["message"] for g in report["gpus"] for f in g["findings"] if f["severity"] == "critical"]
    assert sum("recorded it disappearing" in m and "1 of the host's 3 registered GPUs report now" in m for m in messages) == 2


# -- item 4: semantics never mix -----------------------------------------------------------------


def test_a_timed_out_memory_v2_read_is_unknown_not_a_v1_figure():
    """Memory v2 times out at ticks 20–22: those ticks have no memory figure at all — before, they
    fell back to v1, whose 'used' includes ~615 MiB of reserved memory (a step a trend would take
    for a leak)."""
    header, ticks = scenarios.fail_call(
        *read_capture(H200_CAPTURE), "nvmlDeviceGetMemoryInfo", NVML_ERROR_TIMEOUT, from_tick=20, until_tick=23
    )
    _, readings = read_all(scenarios.backend(header, ticks))
    used = [r.samples[0].memory_used_bytes for r in readings]
    assert used[19] is not None and used[23] is not None
    assert used[20:23] == [None, None, None]
    assert readings[21].samples[0].missing["memory_used_bytes"] == "timeout"
    assert NVML_MEMORY_V2 == 0x02000028


# -- item 7: GPM's PCIe figures are cross-checked ------------------------------------------------


def _crosscheck_scenario(zero_gpm: bool):
    """The recorded copy phase (GPM RX ~59 GB/s) with the throughput call's answers on the
    cross-check cadence: 59.6 GB/s during the copy (what the call read on this H200, FACTS §1),
    0.1 GB/s after. With ``zero_gpm`` GPM reads 0 B/s during the copy — the failure seen in
    another exporter — and nothing else changes."""
    from conftest import phase

    header, ticks = read_capture(H200_CAPTURE)
    copy = phase("h2d_copy")
    in_copy = [t["tick"] for t in ticks if t["tick"] >= 0 and copy["start"] + 1 < t["ts"] <= copy["end"]]
    for t in ticks:
        if t["tick"] < 0:
            continue
        rx = 59_600_000 if t["tick"] in in_copy else 100_000
        reading = {"v": {"tx_KBps": 20_000, "rx_KBps": rx, "ts": t["ts"] - 0.5}}
        header, ticks = scenarios.set_call(header, ticks, 0, "pcie_throughput", reading, at=[t["tick"]], kwargs={"period": 10.0})
    if zero_gpm:
        header, ticks = scenarios.edit_call(
            header, ticks, 0, "gpm", lambda m: {**m, "20": 0.0, "21": 0.0}, at=in_copy, args=([2, 3, 5, 10, 20, 21],)
        )
    return header, ticks, in_copy


def test_gpm_reading_zero_during_a_copy_is_a_collector_fault_not_an_idle_link():
    header, ticks, in_copy = _crosscheck_scenario(zero_gpm=True)
    _, readings = read_all(scenarios.backend(header, ticks), slow_every=2)
    events = [(i, e.kind, e.detail) for i, r in enumerate(readings) for e in r.events]
    assert [k for _, k, _ in events] == ["collector_fault", "collector_fault_cleared"]
    fault_tick = events[0][0]
    assert fault_tick in in_copy and "GPM PCIe RX 0.00 GB/s while nvmlDeviceGetPcieThroughput reads 59.60 GB/s" in events[0][2]
    withheld = readings[fault_tick].samples[0]
    assert withheld.pcie_rx_bytes_per_second is None
    assert withheld.missing["pcie_rx_bytes_per_second"].startswith("collector fault: GPM PCIe RX")
    # before the third strike the zero was still served; after the all-clear GPM is trusted again
    assert readings[fault_tick - 1].samples[0].pcie_rx_bytes_per_second == 0.0
    assert readings[-1].samples[0].pcie_rx_bytes_per_second is not None


def test_gpm_agreeing_with_the_throughput_call_raises_nothing():
    header, ticks, _ = _crosscheck_scenario(zero_gpm=False)
    _, readings = read_all(scenarios.backend(header, ticks), slow_every=2)
    assert [e.kind for r in readings for e in r.events] == []
    assert max(r.samples[0].pcie_rx_bytes_per_second or 0 for r in readings) > 55e9
