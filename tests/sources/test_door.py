"""Impossible values from NVML and psutil are refused at the door and cost only themselves.

Each case replays a recorded H200 capture with one answer changed (``scenarios.set_call`` /
``scenarios.edit_call``) to a value seen in the wild: NVML's and DCGM's blank sentinels, a PCIe
rate no link carries, a negative or 2^63-sized process figure, the string ``[N/A]`` where a number
belongs. Before the field catalogue's door these crashed the agent (exit 70), dropped whole
batches of all GPUs, stopped every later process write, or made ``diagnose`` say "drain and reset
the GPU" for 9223372036854775794 ECC errors. Now: every tick of every GPU is stored, the field is
NULL exactly where it was injected, the rejection is counted and stored with its reason, and no
finding comes from the injected value.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Callable

import pytest
from conftest import DATA, H200_CAPTURE
from sqlalchemy import text

from vgpumon.agent import Agent
from vgpumon.diagnose import build_report
from vgpumon.sources.host import HostSource
from vgpumon.sources.nvml import NVML_MEMORY_V2, NvmlSource
from vgpumon.sources.nvml.capture import read_capture
from vgpumon.store import open_store
from vgpumon.testing import scenarios

IDLE_FULL = DATA / "h200-idle-full.jsonl.gz"  # full slow set every 2 ticks
NO_GPM = DATA / "h200-nogpm-copy.jsonl.gz"  # PCIe from the throughput poller
INT64_BLANK = 9223372036854775794  # DCGM_INT64_NOT_SUPPORTED, seen in the wild as "9.22e18"
INT32_BLANK = 2147483632  # DCGM_INT32_BLANK
MIB = 1 << 20


def _set(value: Any) -> Callable[[Any], Any]:
    return lambda _old: value


def _member(key: str, value: Any) -> Callable[[Any], Any]:
    return lambda old: {**old, key: value}


def _processes(value: Any) -> Callable[[Any], Any]:
    return lambda old: [{**p, "usedGpuMemory": value} for p in old]


@dataclass(frozen=True)
class Injection:
    name: str
    capture: Any
    fn: str
    edit: Callable[[Any], Any]
    at: range
    field: str
    args: tuple = ()
    kwargs: dict | None = None
    table: str = "gpu_samples"


SLOW = range(2, 21, 2)  # the idle capture's slow ticks
MINUTE = range(0, 21, 2)  # ... of which the first reads the minute set (energy) in its 20 s
INJECTIONS = [
    Injection("power: 64-bit blank", H200_CAPTURE, "nvmlDeviceGetPowerUsage", _set(INT64_BLANK), range(10, 20), "power_watts"),
    Injection("energy: 64-bit blank", IDLE_FULL, "nvmlDeviceGetTotalEnergyConsumption", _set(INT64_BLANK), MINUTE, "energy_joules_total"),
    Injection("SM clock: 64-bit blank", H200_CAPTURE, "nvmlDeviceGetClockInfo", _set(INT64_BLANK), range(10, 20), "sm_clock_hertz", (1,)),
    Injection("power limit: 64-bit blank", IDLE_FULL, "nvmlDeviceGetEnforcedPowerLimit", _set(INT64_BLANK), SLOW, "power_limit_watts"),
    Injection(
        "uncorrectable ECC: 64-bit blank", IDLE_FULL, "nvmlDeviceGetTotalEccErrors", _set(INT64_BLANK), SLOW,
        "ecc_uncorrected_volatile_total", (1, 0),
    ),
    Injection(
        "memory used: 64-bit blank", H200_CAPTURE, "nvmlDeviceGetMemoryInfo", _member("used", INT64_BLANK), range(10, 20),
        "memory_used_bytes", kwargs={"version": NVML_MEMORY_V2},
    ),
    Injection("power: 32-bit blank", H200_CAPTURE, "nvmlDeviceGetPowerUsage", _set(INT32_BLANK), range(10, 20), "power_watts"),
    Injection(
        "link generation: 32-bit blank", H200_CAPTURE, "nvmlDeviceGetCurrPcieLinkGeneration", _set(INT32_BLANK),
        range(10, 20), "pcie_link_gen_current",
    ),
    Injection(
        "PCIe RX 4.3 TB/s (throughput call)", NO_GPM, "pcie_throughput", _member("rx_KBps", 4_300_000_000),
        range(8, 14), "pcie_rx_bytes_per_second",
    ),
    Injection(
        "PCIe RX 4.4 TB/s (GPM)", H200_CAPTURE, "gpm", _member("21", 4.4e12 / MIB), range(10, 20),
        "pcie_rx_bytes_per_second", ([2, 3, 5, 10, 20, 21],),
    ),
    Injection(
        "process memory 2^63+5", H200_CAPTURE, "nvmlDeviceGetComputeRunningProcesses", _processes(2**63 + 5),
        range(10, 20), "used_gpu_memory_bytes", table="gpu_process_samples",
    ),
    Injection(
        "process memory -1", H200_CAPTURE, "nvmlDeviceGetComputeRunningProcesses", _processes(-1), range(10, 20),
        "used_gpu_memory_bytes", table="gpu_process_samples",
    ),
    Injection(
        "process memory [N/A]", H200_CAPTURE, "nvmlDeviceGetComputeRunningProcesses", _processes("[N/A]"),
        range(10, 20), "used_gpu_memory_bytes", table="gpu_process_samples",
    ),
    Injection("P-state [N/A]", IDLE_FULL, "nvmlDeviceGetPerformanceState", _set("[N/A]"), range(3, 9), "performance_state"),
    Injection(
        "memory info [N/A]", H200_CAPTURE, "nvmlDeviceGetMemoryInfo", _member("used", "[N/A]"), range(10, 20),
        "memory_used_bytes", kwargs={"version": NVML_MEMORY_V2},
    ),
    Injection(
        "clocks event reasons [N/A]", H200_CAPTURE, "nvmlDeviceGetCurrentClocksEventReasons", _set("[N/A]"),
        range(10, 20), "clocks_event_reasons",
    ),
    Injection(
        "link generation [N/A]", H200_CAPTURE, "nvmlDeviceGetCurrPcieLinkGeneration", _set("[N/A]"), range(10, 20),
        "pcie_link_gen_current",
    ),
    Injection("compute mode [N/A]", IDLE_FULL, "nvmlDeviceGetComputeMode", _set("[N/A]"), SLOW, "compute_mode"),
]


def _replay(url: str, header: dict, ticks: list, *, paced: bool = False, **agent_kw: Any) -> Agent:
    source = NvmlSource(scenarios.backend(header, ticks), slow_every=int(header.get("slow_every", 10)))
    store = open_store(url)
    # A host source, so that per-process rows are written too (the recorded PIDs do not exist
    # here: they are stored as unresolved processes, with their GPU memory).
    # a generous call deadline: on a loaded machine a replayed read that waits for the CPU past
    # the default (half the interval) is rightly taken as wedged, and its tick's values are None,
    # which is the watchdog's test (tests/agent/test_wedged.py), not the door's
    agent_kw.setdefault("call_deadline", 30.0)
    agent = Agent(source, store, hostname="h200", paced=paced, host=HostSource(), host_every=1, **agent_kw)
    try:
        asyncio.run(agent.run())
    finally:
        store.close()
    return agent


def _column(url: str, inj: Injection) -> list[tuple[int, Any]]:
    """(tick, value) of the injected field, by tick order."""
    with open_store(url).engine.connect() as conn:
        if inj.table == "gpu_samples":
            rows = conn.execute(text(f"SELECT ts, {inj.field} FROM gpu_samples ORDER BY ts")).all()
        else:
            rows = conn.execute(text(f"SELECT ts, {inj.field} FROM gpu_process_samples ORDER BY ts")).all()
    return rows


def _serious(report: dict) -> list[str]:
    return sorted(f["message"] for g in [report, *report["gpus"]] for f in g["findings"] if f["severity"] != "info")


@pytest.mark.parametrize("inj", INJECTIONS, ids=[i.name for i in INJECTIONS])
def test_an_impossible_value_costs_only_its_own_field(inj, tmp_path, store_of):
    header, ticks = read_capture(inj.capture)
    base_url = f"sqlite:///{tmp_path / 'base.db'}"
    base = _replay(base_url, header, ticks)
    header2, ticks2 = scenarios.edit_call(header, ticks, 0, inj.fn, inj.edit, at=inj.at, args=inj.args, kwargs=inj.kwargs)
    url = f"sqlite:///{tmp_path / 'injected.db'}"
    agent = _replay(url, header2, ticks2)

    # every tick stored, as in the clean replay
    assert agent.stats.ticks == base.stats.ticks == sum(1 for t in ticks if t["tick"] >= 0)
    assert agent.stats.rows_written == base.stats.rows_written == agent.stats.ticks
    before, after = _column(base_url, inj), _column(url, inj)
    assert len(after) == len(before) > 0

    # NULL exactly where a value was injected into a tick that read it
    t0 = before[0][0] if inj.table == "gpu_samples" else None
    tick_ts = {t["tick"]: round(t["ts"] * 1000) for t in ticks2 if t["tick"] >= 0}
    hit = {tick_ts[k] for k in inj.at}
    expected_nulls = [ts for ts, v in before if ts in hit and v is not None]
    assert expected_nulls, "the injection must land on ticks where the field was read"
    # (a tick that did not read the field, e.g. the energy counter between its reads, stays NULL)
    assert [(ts, v) for ts, v in after if ts in hit] == [(ts, None) for ts, v in before if ts in hit]
    assert [(ts, v) for ts, v in after if ts not in hit] == [(ts, v) for ts, v in before if ts not in hit]
    del t0

    # counted by the source, stored with the reason
    assert agent.source.rejected[inj.field] == len(expected_nulls)
    with open_store(url).engine.connect() as conn:
        stored = conn.execute(text("SELECT field, reason FROM rejected_values")).all()
    assert [f for f, _ in stored] == [inj.field] * len(expected_nulls)
    assert all(r.startswith("rejected: ") for _, r in stored)

    # no finding comes from the injected value; the report says what was refused
    base_report = build_report(store_of(base_url), "h200")
    report = build_report(store_of(url), "h200")
    assert report["status"] == base_report["status"]
    assert _serious(report) == _serious(base_report)
    if inj.table == "gpu_samples":
        info = [f["message"] for f in report["gpus"][0]["findings"] if f["severity"] == "info"]
        assert any(m.startswith(f"{inj.field}: reported impossible values {len(expected_nulls)} times") for m in info)


def test_blank_power_on_one_gpu_of_eight_loses_no_tick_of_any_gpu(tmp_path):
    """The paced 8-GPU case: before, five ticks of all 8 GPUs were silently gone (a batch failed
    on the overflow). Batches are flushed every 0.2 s here, so the bad value lands in several."""
    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 8)
    header, ticks = scenarios.set_call(header, ticks, 3, "nvmlDeviceGetPowerUsage", {"v": INT64_BLANK}, at=range(5, 70))
    url = f"sqlite:///{tmp_path / 'eight.db'}"
    agent = _replay(url, header, ticks, paced=True, interval=0.02, flush_interval=0.2)
    assert agent.stats.ticks == 76 and agent.stats.rows_written == 8 * 76
    with open_store(url).engine.connect() as conn:
        per_gpu = dict(conn.execute(text("SELECT gpu_id, count(power_watts) FROM gpu_samples GROUP BY gpu_id")).all())
        gpu3 = conn.scalar(text("SELECT id FROM gpus WHERE \"index\" = 3"))
    assert per_gpu.pop(gpu3) == 76 - 65
    assert set(per_gpu.values()) == {76}


def test_the_agent_exits_0_on_a_blank_sentinel(tmp_path):
    """Through the console script, as the report of the bug ran it: a fast replay with the 64-bit
    blank in every power reading used to exit 70 with nothing stored."""
    header, ticks = scenarios.set_call(*read_capture(H200_CAPTURE), 0, "nvmlDeviceGetPowerUsage", {"v": INT64_BLANK}, at=range(76))
    cap = tmp_path / "blank.jsonl.gz"
    scenarios.write(cap, header, ticks)
    db = tmp_path / "x.db"
    run = subprocess.run(
        [sys.executable, "-m", "vgpumon", "agent", "--listen", "off", "--replay", str(cap), "--db", f"sqlite:///{db}", "--hostname", "h"],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "76 rows stored" in run.stderr
    diag = subprocess.run(
        [sys.executable, "-m", "vgpumon", "diagnose", "h", "--db", f"sqlite:///{db}"], capture_output=True, text=True, timeout=60
    )
    assert diag.returncode == 0, diag.stdout
    # information, not a verdict: the refused value is named with its reason, the power column is N/A
    assert "GPU 0: power_watts: reported impossible values 76 times in the window (rejected: blank sentinel 9223372036854775794" in diag.stdout
    assert "N/A (reported impossible values" in diag.stdout
