"""Failure classes of the NVML source, each on a scenario derived from a real H200 capture.

Every scenario names its transformation (``vgpumon.testing.scenarios``); none of them may stop
the agent or store a number that is not a reading.
"""

from __future__ import annotations

from conftest import DATA, H200_CAPTURE, read_all, replay_into
from rules_support import with_slowdown_threshold

from vgpumon.sources.nvml import NvmlSource
from vgpumon.sources.nvml.backend import (
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_SUPPORTED,
    EndOfCapture,
)
from vgpumon.sources.nvml.capture import RecordingBackend, read_capture
from vgpumon.testing import scenarios

IDLE_FULL = DATA / "h200-idle-full.jsonl.gz"  # recorded with --slow-every 2


def run(header, ticks, **kw):
    return read_all(scenarios.backend(header, ticks), **kw)


def test_field_not_supported_is_none_and_not_asked_again(tmp_path):
    header, ticks = scenarios.fail_call(*read_capture(H200_CAPTURE), "nvmlDeviceGetPowerUsage", NVML_ERROR_NOT_SUPPORTED)
    rec = RecordingBackend(scenarios.backend(header, ticks), tmp_path / "calls.jsonl")
    src = NvmlSource(rec)
    src.start()
    samples = []
    while True:
        try:
            samples.append(src.sample().samples[0])
        except EndOfCapture:
            break
    rec.close()
    assert all(s.power_watts is None and s.missing["power_watts"] == "not supported" for s in samples)
    assert all(s.temperature_celsius is not None for s in samples)
    asked = (tmp_path / "calls.jsonl").read_text().count('"nvmlDeviceGetPowerUsage"')
    assert asked == 1, "an unsupported field must be remembered, not asked every tick"


def test_function_not_found_on_old_driver_falls_back_to_memory_v1():
    header, ticks = scenarios.fail_call(
        *read_capture(H200_CAPTURE), "nvmlDeviceGetMemoryInfo", NVML_ERROR_FUNCTION_NOT_FOUND, from_tick=0
    )
    _, readings = run(header, ticks)
    s = readings[30].samples[0]
    # v1 "used" (from the recorded v1 answer) includes the ~615 MiB the driver reserves
    assert s.memory_used_bytes == 644939776 and s.memory_total_bytes == 150754820096
    assert s.memory_reserved_bytes is None and s.missing["memory_reserved_bytes"] == "memory v2 not available"


def test_no_permission_degrades_one_field():
    header, ticks = scenarios.fail_call(*read_capture(IDLE_FULL), "nvmlDeviceGetTotalEnergyConsumption", NVML_ERROR_NO_PERMISSION)
    _, readings = run(header, ticks, slow_every=2)
    slow = readings[0].samples[0]  # the energy counter is read on the first slow tick, then every 6th
    assert slow.energy_joules_total is None and slow.missing["energy_joules_total"] == "no permission"
    assert slow.ecc_uncorrected_volatile_total == 0 and slow.remapped_rows_pending is False
    assert readings[2].samples[0].ecc_uncorrected_volatile_total == 0


def test_the_minute_set_is_read_each_minute_and_the_slow_set_every_slow_tick():
    """Energy (2.8-3.3 ms of CPU a read, FACTS §1) and the rest of the minute set: read on the
    first slow tick a minute after the last read, not on every slow tick; ECC on every one."""
    header, ticks = scenarios.repeat(*read_capture(IDLE_FULL), 7)  # 147 s at 1 s, slow every 2
    _, readings = run(header, ticks, slow_every=2)
    def asked(field):  # read, or asked and answered "not in capture" (the recording read it less often)
        return [r.ts for r in readings if getattr(r.samples[0], field) is not None or field in r.samples[0].missing]

    read = asked("energy_joules_total")
    assert read[0] == readings[0].ts and len(read) == 3
    assert all(57 <= b - a <= 61 for a, b in zip(read, read[1:]))  # each minute, on a slow tick
    assert asked("bar1_used_bytes") == asked("violation_power_seconds_total") == asked("mig_mode") == read
    assert all(r.samples[0].ecc_uncorrected_volatile_total == 0 for r in readings[:21:2])  # every slow tick


def test_library_mismatch_at_start_is_retried_and_recovers():
    """nvmlInit answers LIB_RM_VERSION_MISMATCH at start and until tick 5 (driver upgraded, not
    yet reloaded): the source does not exit, reports NVML down with the reason, re-initialises
    with back-off (ticks 1, 3, 7) and reads the GPU from tick 7 on."""
    header, ticks = read_capture(H200_CAPTURE)
    header, ticks = scenarios.set_call(header, ticks, "sys", "nvmlInit", {"e": NVML_ERROR_LIB_RM_VERSION_MISMATCH}, at=[-1])
    header, ticks = scenarios.set_call(header, ticks, "sys", "nvmlInit", {"v": None}, at=range(5, 200))
    src = NvmlSource(scenarios.backend(header, ticks))
    assert src.start() == ()
    readings = [src.sample() for _ in range(12)]
    assert [r.status.up for r in readings] == [False] * 7 + [True] * 5
    assert "version mismatch" in readings[0].status.message and "reload" in readings[0].status.message
    assert readings[7].samples[0].up and readings[7].samples[0].power_watts > 0


def test_library_mismatch_mid_run_marks_host_down_then_recovers(db_url, store_of):
    header, ticks = read_capture(H200_CAPTURE)
    header, ticks = scenarios.fail_call(header, ticks, "*", NVML_ERROR_LIB_RM_VERSION_MISMATCH, from_tick=20, until_tick=26)
    header, ticks = scenarios.fail_call(header, ticks, "nvmlInit", NVML_ERROR_LIB_RM_VERSION_MISMATCH, from_tick=20, until_tick=26)
    agent = replay_into(db_url, scenarios.backend(header, ticks))
    (gpu,) = store_of(db_url).gpus_of("h200-replay")
    rows = store_of(db_url).series(gpu.id, 0, 2e9, ("up", "power_watts"))
    assert len(rows) == agent.stats.ticks  # every tick stored, the down ones too
    down = [i for i, r in enumerate(rows) if not r["up"]]
    assert down[0] == 20 and 26 <= down[-1] + 1 <= 20 + 1 + 2 + 4 + 8  # back within the back-off
    assert all(r["power_watts"] is None for r in rows if not r["up"])
    assert rows[-1]["up"]


def test_impossible_values_are_rejected_counted_and_never_stored(db_url, store_of):
    header, ticks = read_capture(H200_CAPTURE)
    header, ticks = scenarios.set_call(header, ticks, 0, "nvmlDeviceGetUtilizationRates", {"v": {"gpu": 4294967295, "memory": 0}}, at=[10, 11, 12])
    header, ticks = scenarios.set_call(header, ticks, 0, "nvmlDeviceGetTemperature", {"v": 644245923}, at=[15], args=[0])
    gpm = {"v": {"2": 150.0, "3": -1.0, "5": 0.0, "10": 0.0, "20": 0.5, "21": 0.5}}
    header, ticks = scenarios.set_call(header, ticks, 0, "gpm", gpm, at=[20], args=[[2, 3, 5, 10, 20, 21]])
    agent = replay_into(db_url, scenarios.backend(header, ticks))
    assert agent.source.rejected == {"utilization_gpu_ratio": 3, "temperature_celsius": 1, "sm_active_ratio": 1, "sm_occupancy_ratio": 1}
    (gpu,) = store_of(db_url).gpus_of("h200-replay")
    rows = store_of(db_url).series(gpu.id, 0, 2e9, ("utilization_gpu_ratio", "temperature_celsius", "sm_active_ratio", "sm_occupancy_ratio"))
    assert [rows[i]["utilization_gpu_ratio"] for i in (10, 11, 12)] == [None] * 3
    assert rows[15]["temperature_celsius"] is None and rows[16]["temperature_celsius"] is not None
    assert rows[20]["sm_active_ratio"] is None and rows[20]["sm_occupancy_ratio"] is None
    assert max(r["utilization_gpu_ratio"] or 0 for r in rows) <= 1.0


def test_counter_reset_gives_no_negative_rate():
    """The PCIe replay counter restarts (driver reload) between two slow reads: the rate is
    ``None`` with reason "counter reset" for that interval, never negative."""
    header, ticks = read_capture(IDLE_FULL)
    for tick, value in ((0, 100), (2, 110), (4, 3), (6, 13)):
        header, ticks = scenarios.set_call(header, ticks, 0, "nvmlDeviceGetPcieReplayCounter", {"v": value}, at=[tick])
    _, readings = run(header, ticks, slow_every=2, minute_seconds=0)  # the counter on every slow tick
    rates = [readings[i].samples[0].pcie_replay_rate_per_second for i in (0, 2, 4, 6)]
    assert rates[0] is None and rates[2] is None
    assert readings[4].samples[0].missing["pcie_replay_rate_per_second"] == "counter reset"
    assert abs(rates[1] - 10 / 2.0) < 0.1 and abs(rates[3] - 10 / 2.0) < 0.1  # ticks 2 s apart


def test_mig_enabled_utilization_is_none_not_zero():
    header, ticks = read_capture(IDLE_FULL)
    header, ticks = scenarios.fail_call(header, ticks, "nvmlDeviceGetUtilizationRates", NVML_ERROR_NOT_SUPPORTED)
    header, ticks = scenarios.set_call(header, ticks, 0, "nvmlDeviceGetMigMode", {"v": [1, 1]}, at=range(0, 100, 2))
    _, readings = run(header, ticks, slow_every=2, minute_seconds=0)  # MIG mode on every slow tick
    s = readings[2].samples[0]
    assert s.mig_mode == 1
    assert s.utilization_gpu_ratio is None and s.utilization_memory_ratio is None
    assert s.missing["utilization_gpu_ratio"] == "not supported"


def test_garbage_pids_are_reported_not_stored_as_processes():
    header, ticks = read_capture(H200_CAPTURE)
    garbage = {"v": [{"pid": 0, "usedGpuMemory": 1 << 30}, {"pid": 4294967295, "usedGpuMemory": 0}] * 2}
    header, ticks = scenarios.set_call(header, ticks, 0, "nvmlDeviceGetComputeRunningProcesses", garbage, at=[30])
    src, readings = run(header, ticks)
    s = readings[30].samples[0]
    assert s.processes == () and "garbage PIDs" in s.missing["processes"]
    assert src.rejected["processes"] == 1
    assert readings[31].samples[0].processes  # the real torch process is back next tick


def test_xid_events_are_kept_per_code_and_stored(db_url, store_of):
    header, ticks = read_capture(H200_CAPTURE)
    t5, t6 = ticks[6]["ts"], ticks[7]["ts"]
    header, ticks = scenarios.set_call(header, ticks, "sys", "xid_poll", {"v": [{"index": 0, "xid": 79, "ts": t5}]}, at=[5])
    two = [{"index": 0, "xid": 79, "ts": t6}, {"index": 0, "xid": 48, "ts": t6 + 0.01}]
    header, ticks = scenarios.set_call(header, ticks, "sys", "xid_poll", {"v": two}, at=[6])
    agent = replay_into(db_url, scenarios.backend(header, ticks))
    last = agent.latest.samples[0]
    assert last.xid_counts == {79: 2, 48: 1}  # repeats stay visible: no "last XID" gauge
    assert last.xid_last_seen[48] == t6 + 0.01
    store = store_of(db_url)
    (gpu,) = store.gpus_of("h200-replay")
    stored = store.xid_events(gpu.id, 0, 2e9)  # times kept to the millisecond
    assert [(round(ts, 3), xid) for ts, xid in stored] == [(round(t5, 3), 79), (round(t6, 3), 79), (round(t6 + 0.01, 3), 48)]


def test_diagnose_turns_xid_79_into_critical(tmp_path):
    """XID 79 (GPU fallen off the bus) is critical in DCGM's health watches: diagnose exits 2."""
    import subprocess
    import sys

    header, ticks = read_capture(H200_CAPTURE)
    header, ticks = scenarios.set_call(header, ticks, "sys", "xid_poll", {"v": [{"index": 0, "xid": 79, "ts": ticks[40]["ts"]}]}, at=[40])
    cap = tmp_path / "xid79.jsonl"
    scenarios.write(cap, header, ticks)
    url = f"sqlite:///{tmp_path / 'x.db'}"
    vg = [sys.executable, "-m", "vgpumon"]
    subprocess.run(vg + ["agent", "--listen", "off", "--replay", str(cap), "--db", url], check=True, capture_output=True)
    out = subprocess.run(vg + ["diagnose", "localhost", "--db", url], capture_output=True, text=True)
    assert out.returncode == 2
    verdict, reason = out.stdout.splitlines()[:2]
    assert verdict.startswith("CRITICAL ") and "GPU 0: XID 79 (GPU has fallen off the bus)" in reason
    assert "evidence  XID 79 × 1 (GPU has fallen off the bus) in the last 10 min." in out.stdout


def _field_values(ret: int, value: int) -> dict:
    # the shape nvmlDeviceGetFieldValues answers in a capture (to_plain of nvmlFieldValue_t)
    return {"v": [{"fieldId": 82, "scopeId": 0, "timestamp": 0, "latencyUsec": 0, "valueType": 1, "nvmlReturn": ret, "value": value}]}


def test_memory_temperature_reads_the_field_entry_and_its_own_return_code(tmp_path):
    """HBM temperature comes from nvmlDeviceGetFieldValues([82]). The call succeeds when any entry
    was filled, so an entry answering NOT_SUPPORTED beside a zeroed value must be None — not 0 °C
    (a real exporter's bug) — and is not asked again."""
    header, ticks = read_capture(H200_CAPTURE)
    args = ([82],)
    header, ticks = scenarios.set_call(header, ticks, 0, "nvmlDeviceGetFieldValues", _field_values(0, 37), at=range(0, 10), args=args)
    header, ticks = scenarios.set_call(
        header, ticks, 0, "nvmlDeviceGetFieldValues", _field_values(NVML_ERROR_NOT_SUPPORTED, 0), at=range(10, 76), args=args
    )
    rec = RecordingBackend(scenarios.backend(header, ticks), tmp_path / "calls.jsonl")
    src, readings = read_all(rec)
    rec.close()
    temps = [r.samples[0].memory_temperature_celsius for r in readings]
    assert temps[:10] == [37.0] * 10
    assert temps[10:] == [None] * 66
    assert readings[40].samples[0].missing["memory_temperature_celsius"] == "not supported"
    assert (tmp_path / "calls.jsonl").read_text().count('"nvmlDeviceGetFieldValues"') == 11  # asked once after


def test_hbm_temperature_recorded_on_the_h200_replays_as_nvidia_smi_read_it(tmp_path, store_of):
    """The real answer of the field-values call (h200-idle-hbm, recorded with nvidia-smi reading
    temperature.memory 38 °C beside it) goes through the door into the store."""
    url = f"sqlite:///{tmp_path / 'hbm.db'}"
    agent = replay_into(url, scenarios.backend(*read_capture(DATA / "h200-idle-hbm.jsonl.gz")))
    store = store_of(url)
    (gpu,) = store.gpus_of("h200-replay")
    rows = store.series(gpu.id, 0, 2e9, ("memory_temperature_celsius", "temperature_celsius"))
    assert len(rows) == agent.stats.ticks == 13
    assert {r["memory_temperature_celsius"] for r in rows} == {38.0}
    assert {r["temperature_celsius"] for r in rows} == {34.0}


def test_slowdown_temperature_is_read_once_at_start_and_stored(tmp_path, db_url, store_of):
    """The GPU's own slowdown threshold is a static fact: read at start (init block), stored on
    the GPU's row; a board that does not report it has None with the reason, not 0 °C."""
    src = NvmlSource(scenarios.backend(*with_slowdown_threshold(*read_capture(H200_CAPTURE))))
    (gpu,) = src.start()
    assert gpu.slowdown_temperature_celsius == 89.0
    replay_into(db_url, scenarios.backend(*with_slowdown_threshold(*read_capture(H200_CAPTURE))), hostname="h")
    (stored,) = store_of(db_url).gpus_of("h")
    assert stored.identity.slowdown_temperature_celsius == 89.0

    header, ticks = with_slowdown_threshold(*read_capture(H200_CAPTURE), {"e": NVML_ERROR_NOT_SUPPORTED})
    (gpu,) = NvmlSource(scenarios.backend(header, ticks)).start()
    assert gpu.slowdown_temperature_celsius is None
