"""Helpers of the rule tests: replay a (transformed) recorded capture through the agent with its
rule runner into a real store, then read what the rules said — the alerts the agent stored and
what ``diagnose``'s evaluation finds at the end."""

from __future__ import annotations

import asyncio
from typing import Any

from conftest import DATA, H200_CAPTURE, phase

from vgpumon.agent import Agent
from vgpumon.alerts.runner import RuleRunner
from vgpumon.alerts.sinks import LogSink
from vgpumon.config.thresholds import Thresholds
from vgpumon.model import Alert
from vgpumon.rules.core import Finding
from vgpumon.rules.engine import Engine
from vgpumon.sources.nvml import NvmlSource
from vgpumon.store import Store, open_store
from vgpumon.store.alerts import AlertRepository
from vgpumon.testing import scenarios

IDLE_FULL = DATA / "h200-idle-full.jsonl.gz"  # every field, slow set every 2 ticks
#: GPM metric ids of PCIe TX and RX (FACTS §2)
PCIE_GPM = (20, 21)


#: nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) on the H200 that recorded
#: the captures (driver 580.159.04; bench/results/h200-thresholds.txt): 89 °C.
H200_SLOWDOWN_C = 89


def with_slowdown_threshold(header: dict, ticks: list, outcome: dict | None = None) -> tuple[dict, list]:
    """The capture with the H200's slowdown-threshold answer in its init block (the captures were
    recorded before the collector asked for it; the answer is the one the same H200 gave)."""
    return scenarios.set_call(
        header, ticks, 0, "nvmlDeviceGetTemperatureThreshold", outcome or {"v": H200_SLOWDOWN_C}, at=[-1], args=[1]
    )


def copy_phase(minutes: float = 10.0, devices: int = 1) -> tuple[dict, list]:
    """The recorded H2D copy phase of the H200 capture (ticks at least 1.2 s inside it: a tick's
    GPM figures average the second before it), repeated to ``minutes``, as ``devices`` GPUs."""
    p = phase("h2d_copy")
    header, ticks = scenarios.between(*scenarios.load(str(H200_CAPTURE)), p["start"] + 1.2, p["end"])
    if devices > 1:
        header, ticks = scenarios.replicate_devices(header, ticks, devices)
    body = sum(1 for t in ticks if t["tick"] >= 0)
    return scenarios.repeat(header, ticks, int(minutes * 60 / body) + 1)


def idle_full(repeat: int = 1) -> tuple[dict, list]:
    header, ticks = scenarios.load(str(IDLE_FULL))
    return scenarios.repeat(header, ticks, repeat) if repeat > 1 else (header, ticks)


def replay(url: str, header: dict, ticks: list, *, hostname: str = "h", sysfs_root: Any = None,
           thresholds: Thresholds | None = None, rules: bool = True) -> Agent:
    """Replay through the agent, rules evaluated as the agent evaluates them (every 5 s of data
    time, each rule at its own cadence), alerts stored; ``rules=False``: an agent with its rules
    off (no alert rows)."""
    source = NvmlSource(scenarios.backend(header, ticks), slow_every=int(header.get("slow_every", 10)))
    store = open_store(url)
    runner = RuleRunner(Engine(thresholds), sinks=[LogSink()], wall=None) if rules else None
    # a generous call deadline: on a loaded machine a replayed read past half the interval is
    # taken as wedged (GpuUnreadable), which the watchdog's own tests check, not the rules'
    agent = Agent(source, store, hostname=hostname, paced=False, rules=runner, call_deadline=30.0,
                  sysfs_root=None if sysfs_root is None else str(sysfs_root))
    try:
        asyncio.run(agent.run())
    finally:
        store.close()
    return agent


def stored_alerts(url: str, hostname: str = "h") -> list[Alert]:
    """Every alert episode the agent stored that fired (resolved ones included)."""
    store = Store(url)
    try:
        return AlertRepository(store.engine).history(hostname, 0, 4e9)
    finally:
        store.close()


def firing(alerts: list[Alert], name: str) -> list[Alert]:
    return [a for a in alerts if a.name == name and a.fired_at is not None]


def at_end(url: str, hostname: str = "h", thresholds: Thresholds | None = None) -> tuple[dict[str, list[Finding]], list[Alert]]:
    """What ``diagnose`` evaluates at the newest stored tick: findings by rule, open alerts."""
    store = Store(url)
    try:
        gpus = store.gpus_of(hostname)
        end = store.newest_ts([g.id for g in gpus])
        findings, book = Engine(thresholds).evaluate_window(store, hostname, end)
    finally:
        store.close()
    by_rule: dict[str, list[Finding]] = {}
    for f in findings:
        by_rule.setdefault(f.rule, []).append(f)
    return by_rule, book.open()


def diagnosed(url: str, alert: str, hostname: str = "h", now: float = 4e9) -> list[str]:
    """The messages of ``diagnose``'s findings of ``alert`` for ``hostname`` (the report a user
    reads)."""
    from vgpumon.diagnose.report import build_report

    store = Store(url)
    try:
        report = build_report(store, hostname, now=now)
    finally:
        store.close()
    return [f["message"] for f in report["findings"] if f["alert"] == alert]
