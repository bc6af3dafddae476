"""The collector's straight-line path (``vgpumon.sources.nvml._FastPath``) answers as the general
one, whatever the library says.

The live backend runs over ``vgpumon.testing.fake_nvml`` (the process edge: a stand-in for
libnvidia-ml.so under nvidia-ml-py); each case makes the library answer something ordinary or
odd — impossible values, blank sentinels, errors, a lost GPU — and two collectors, one with the
straight-line path and one without, read the same ticks. Their samples, reasons and rejection
counts must be equal, and the straight-line path must actually have served.
"""

from __future__ import annotations

import dataclasses

import pytest

from vgpumon.sources.nvml import NvmlSource
from vgpumon.sources.nvml.backend import LiveBackend
from vgpumon.testing import fake_nvml

TIMEOUT, NOT_SUPPORTED, GPU_IS_LOST, UNKNOWN = 10, 3, 15, 999
BLANK32, BLANK64 = 0xFFFF_FFFF, 0xFFFF_FFFF_FFFF_FFFF

CASES = {
    "ordinary": ({}, {}),
    "busy, with processes": (
        {"nvmlDeviceGetUtilizationRates": {"gpu": 87, "memory": 41},
         "nvmlDeviceGetMemoryInfo_v2": {"used": 70 << 30},
         "nvmlDeviceGetComputeRunningProcesses_v3": [(4242, 30 << 30), (4243, BLANK64)],
         "nvmlDeviceGetPowerUsage": 612345, "nvmlDeviceGetClockInfo": 1980, "nvmlDeviceGetCurrentClocksEventReasons": 0x44},
        {},
    ),
    "impossible values": (
        {"nvmlDeviceGetTemperature": 644245923, "nvmlDeviceGetPowerUsage": BLANK32, "nvmlDeviceGetClockInfo": 0x7FFF_FFF5,
         "nvmlDeviceGetUtilizationRates": {"gpu": BLANK32, "memory": 101},
         "nvmlDeviceGetMemoryInfo_v2": {"used": 150754820096 + (1 << 30), "reserved": BLANK64},
         "nvmlDeviceGetFieldValues": 644245923, "nvmlDeviceGetCurrPcieLinkGeneration": 9},
        {},
    ),
    "more processes than the first array holds": (
        {"nvmlDeviceGetComputeRunningProcesses_v3": [(5000 + i, i << 20) for i in range(40)]}, {},
    ),
    "process memory impossible": ({"nvmlDeviceGetComputeRunningProcesses_v3": [(4242, (1 << 63) + 5)]}, {}),
    "garbage PIDs": ({"nvmlDeviceGetComputeRunningProcesses_v3": [(0, 1 << 30), (4294967295, 0)]}, {}),
    "unknown performance state": ({"nvmlDeviceGetPerformanceState": 32}, {}),
    "calls answering errors": (
        {},
        {"nvmlDeviceGetTemperature": TIMEOUT, "nvmlDeviceGetPowerUsage": NOT_SUPPORTED,
         "nvmlDeviceGetUtilizationRates": NOT_SUPPORTED, "nvmlDeviceGetFieldValues": NOT_SUPPORTED,
         "nvmlDeviceGetComputeRunningProcesses_v3": TIMEOUT, "nvmlDeviceGetPerformanceState": UNKNOWN},
    ),
    "memory call failing": ({}, {"nvmlDeviceGetMemoryInfo_v2": TIMEOUT}),
    "GPM busy, odd and failing metrics": (
        {"nvmlGpmMetricsGet": {2: 95.5, 3: 14.0, 5: float("nan"), 10: 101.0, 20: 56600.0, 21: float(1 << 40)}},
        {},
    ),
    "GPM metric not supported": ({"nvmlGpmMetricsGet": {5: NOT_SUPPORTED}}, {}),
    "GPM sample failing": ({}, {"nvmlGpmSampleGet": TIMEOUT}),
    "GPM lost": ({}, {"nvmlGpmMetricsGet": GPU_IS_LOST}),
    "GPU lost": ({}, {"nvmlDeviceGetClockInfo": GPU_IS_LOST}),
}


@pytest.fixture
def lib():
    fake = fake_nvml.install(2).nvmlLib
    try:
        yield fake
    finally:
        fake_nvml.uninstall()


def _read(lib, values, errors, fast):
    """Four ticks: two ordinary (the memory API is decided, the paths are built), then two with
    the case's answers; the samples of the last two without their times, and the counts."""
    lib.values, lib.errors = {}, {}
    src = NvmlSource(LiveBackend(), slow_every=10**6)
    src.fast_path = fast
    src.start()
    out = []
    try:
        served = False
        for tick in range(4):
            if tick == 2:
                lib.values, lib.errors = dict(values), dict(errors)
                served = bool(src._fast) and all(fp is not None for fp in src._fast.values())  # built for the case's ticks
            reading = src.sample()
            if tick >= 2:
                out.append([dataclasses.replace(s, ts=0.0) for s in reading.samples])
        return out, dict(src.rejected), served
    finally:
        src.close()
        lib.values, lib.errors = {}, {}


@pytest.mark.parametrize("case", list(CASES))
def test_the_straight_line_path_answers_as_the_general_one(lib, case):
    values, errors = CASES[case]
    general, general_rejected, general_served = _read(lib, values, errors, fast=False)
    fast, fast_rejected, fast_served = _read(lib, values, errors, fast=True)
    assert not general_served and fast_served
    assert fast == general
    assert fast_rejected == general_rejected


def test_the_cases_are_not_all_alike(lib):
    """The test above would pass for two paths that ignore the library: the cases must differ."""
    ordinary, _, _ = _read(lib, *CASES["ordinary"], fast=True)
    odd, rejected, _ = _read(lib, *CASES["impossible values"], fast=True)
    s, o = ordinary[-1][0], odd[-1][0]
    assert s.temperature_celsius == 34 and o.temperature_celsius is None
    assert o.missing["temperature_celsius"].startswith("rejected:")
    assert rejected["temperature_celsius"] == 4  # one per GPU per tick
    assert s.memory_used_bytes == 0 and o.memory_used_bytes is None
    lost, _, _ = _read(lib, *CASES["GPU lost"], fast=True)
    assert lost[-1][0].up is False
    gpm, _, _ = _read(lib, *CASES["GPM busy, odd and failing metrics"], fast=True)
    g = gpm[-1][0]
    assert g.sm_active_ratio == pytest.approx(0.955) and g.pcie_tx_bytes_per_second == 56600.0 * 2**20
    assert g.tensor_active_ratio is None and g.missing["tensor_active_ratio"].startswith("rejected:")
    assert g.pcie_rx_bytes_per_second is None and g.dram_active_ratio is None
    failing, _, _ = _read(lib, *CASES["GPM sample failing"], fast=True)
    assert failing[-1][0].up and failing[-1][0].sm_active_ratio is None
    many, _, _ = _read(lib, *CASES["more processes than the first array holds"], fast=True)
    assert len(many[-1][0].processes) == 40
    busy, _, _ = _read(lib, *CASES["busy, with processes"], fast=True)
    assert busy[-1][0].processes == ((4242, 30 << 30), (4243, None))
    assert busy[-1][0].utilization_gpu_ratio == pytest.approx(0.87)


def _cached_then_back(lib, fn, fast):
    """Eight ticks on which ``fn`` answers "not supported" on ticks 2-4 and normally after; the
    cache holds it until the re-probe (10 000 ticks here), so it stays unknown."""
    src = NvmlSource(LiveBackend(), slow_every=10**6, reprobe_every=10_000)
    src.fast_path = fast
    src.start()
    try:
        out = []
        for tick in range(8):
            lib.values, lib.errors = {}, ({fn: NOT_SUPPORTED} if 2 <= tick < 5 else {})
            out.append([dataclasses.replace(s, ts=0.0) for s in src.sample().samples])
        return out
    finally:
        src.close()
        lib.values, lib.errors = {}, {}


@pytest.mark.parametrize("fn, field", [
    ("nvmlDeviceGetUtilizationRates", "utilization_gpu_ratio"),
    ("nvmlDeviceGetPerformanceState", "performance_state"),
    ("nvmlDeviceGetMemoryInfo_v2", "memory_used_bytes"),
    ("nvmlDeviceGetComputeRunningProcesses_v3", "processes"),
])
def test_a_call_cached_as_not_supported_stays_unknown_on_the_straight_line_path(lib, fn, field):
    """The calls the straight-line path always makes: once one answered "not supported" (MIG
    turned on), the general path does not ask it again until the re-probe; the straight-line path
    must not store its answer either when it comes back (MIG turned off)."""
    general = _cached_then_back(lib, fn, fast=False)
    fast = _cached_then_back(lib, fn, fast=True)
    assert general[-1][0].missing.get(field) == "not supported"
    assert fast == general
