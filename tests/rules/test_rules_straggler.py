"""Stragglers on the recorded matmul phase of the H200 capture (utilization 100 %, SM clock
1470 MHz, about 690 W, power-capped: ``sw_power_cap``), its ticks from 1.2 s inside the phase
repeated to 6 minutes and replicated to four GPUs. Each case changes GPU 2 in every tick, as seen
on a board that runs hot: its SM clock and power scaled, its clocks-event reasons with
``hw_thermal_slowdown`` added. The replay runs through the agent with its rule runner (alerts
stored), then is evaluated as ``diagnose`` does at the end; both must agree."""

from __future__ import annotations

import pytest
from conftest import H200_CAPTURE, phase
from rules_support import at_end, diagnosed, firing, replay, stored_alerts

from vgpumon.rules.catalogue import BY_NAME
from vgpumon.rules.core import unknown_code
from vgpumon.testing import scenarios

STRAGGLER = 2
HW_THERMAL = 0x40


def _matmul(clock: float = 1.0, power: float = 1.0, reasons: int = 0, gpus: int = 4, straggler: int = STRAGGLER):
    p = phase("matmul")
    header, ticks = scenarios.between(*scenarios.load(str(H200_CAPTURE)), p["start"] + 1.2, p["end"])
    header, ticks = scenarios.replicate_devices(header, ticks, gpus)
    body = sum(1 for t in ticks if t["tick"] >= 0)
    header, ticks = scenarios.repeat(header, ticks, int(6 * 60 / body) + 1)
    ticks = list(ticks)
    every = [t["tick"] for t in ticks if t["tick"] >= 0]
    header, ticks = scenarios.edit_call(header, ticks, straggler, "nvmlDeviceGetClockInfo", lambda v: round(v * clock), at=every, args=[1])
    header, ticks = scenarios.edit_call(header, ticks, straggler, "nvmlDeviceGetPowerUsage", lambda v: round(v * power), at=every)
    header, ticks = scenarios.edit_call(header, ticks, straggler, "nvmlDeviceGetCurrentClocksEventReasons", lambda v: v | reasons, at=every)
    return header, list(ticks)


def _diagnosed(tmp_path, alert: str) -> list[str]:
    return diagnosed(f"sqlite:///{tmp_path / 'x.db'}", alert)


def _run(tmp_path, **kw):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    replay(url, *_matmul(**kw))
    by_rule, _ = at_end(url)
    return {f.labels["gpu"]: f for f in by_rule["GpuStraggler"]}, stored_alerts(url)


def test_a_gpu_hot_and_slow_under_the_same_work_is_a_straggler_explained_by_its_thermal_reason(tmp_path):
    found, alerts = _run(tmp_path, clock=0.8, power=0.8, reasons=HW_THERMAL)
    f = found[str(STRAGGLER)]
    assert f.state == "firing" and f.value == pytest.approx(0.2, abs=0.01)
    text = BY_NAME["GpuStraggler"].describe(f)
    assert text.startswith("Busy like its 3 busy siblings (NVIDIA H200) over the last 5 min: SM clock 1177 MHz, 20 % below the median 1471 MHz (tolerance 10 %); power ")
    assert "; power 552.8 W, 20 % below the median 691.0 W (tolerance 15 %)." in text
    assert text.endswith("Explained by hw_thermal_slowdown active 100 % of the window (median sibling 0 %).")
    assert [a.labels["gpu"] for a in firing(alerts, "GpuStraggler")] == [str(STRAGGLER)]  # the agent agrees
    assert _diagnosed(tmp_path, "GpuStraggler") == [text]  # and diagnose says the same
    assert {g: x.state for g, x in found.items() if g != str(STRAGGLER)} == {"0": "ok", "1": "ok", "3": "ok"}


def test_a_slow_gpu_without_a_reason_is_a_straggler_that_says_so(tmp_path):
    found, _ = _run(tmp_path, clock=0.85)
    f = found[str(STRAGGLER)]
    assert f.state == "firing"
    assert BY_NAME["GpuStraggler"].describe(f).endswith("No clocks-event reason explains it (a board, cooling or power-delivery fault, or unequal work).")


@pytest.mark.parametrize(("kw", "why"), [
    ({"clock": 0.95, "power": 0.9}, "within the tolerances (clock 5 %, power 10 % lower)"),
    ({}, "identical boards"),
])
def test_a_gpu_within_tolerance_is_not_a_straggler(tmp_path, kw, why):
    found, alerts = _run(tmp_path, **kw)
    assert {g: f.state for g, f in found.items()} == {"0": "ok", "1": "ok", "2": "ok", "3": "ok"}, why
    assert firing(alerts, "GpuStraggler") == []


def test_on_a_host_of_two_gpus_the_straggler_rule_does_not_apply(tmp_path):
    """Two boards cannot say which one is slow: on a host that has only two of the model the rule
    does not apply (not "cannot judge": nothing is missing, docs/rules.md)."""
    found, alerts = _run(tmp_path, clock=0.8, gpus=2, straggler=1)
    assert {g: f.state for g, f in found.items()} == {"0": "unknown", "1": "unknown"}
    assert found["1"].reason == "not applicable: the host has 2 GPU(s) of its model; 3 are needed to compare with"
    assert unknown_code(found["1"].reason) == "not_applicable"
    assert firing(alerts, "GpuStraggler") == []

