"""The agent's rules read their windows from memory (``vgpumon.alerts.windows``): on recorded
captures the verdicts equal those read from the store for every rule — across an agent restart
too —, memory holds the rules' windows however long the run, and once restored an evaluation
reads nothing of the GPU tables from the store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from conftest import DATA
from rules_support import PCIE_GPM, copy_phase, replay

from vgpumon.alerts.windows import RuleWindows
from vgpumon.config.thresholds import Thresholds
from vgpumon.model import GpuIdentity
from vgpumon.rules.catalogue import RULES
from vgpumon.rules.core import Finding
from vgpumon.rules.engine import Engine
from vgpumon.rules.view import HostView
from vgpumon.store import Store, open_store
from vgpumon.store.codec import GPU_ROW_COLUMNS
from vgpumon.store.retention import Retention
from vgpumon.testing import scenarios, sysfs

STEP_S = 15.0


def _recorded_rows(url: str) -> list[tuple]:
    """Every GPU row a replayed agent stored, as stored (encoded), in time order."""
    store = Store(url)
    try:
        ids = [g.id for g in store.gpus_of("h")]
        rows = store.stored_rows(ids, 0, 4e9, GPU_ROW_COLUMNS[2:])
    finally:
        store.close()
    return sorted(rows, key=lambda r: (r[1], r[0]))


def _register_like(source_url: str, store: Store, rows: list[tuple]) -> list[tuple]:
    """Register the source's GPUs in ``store``; the rows with the GPU ids ``store`` gave them."""
    src = Store(source_url)
    try:
        gpus = src.gpus_of("h")
    finally:
        src.close()
    ids = store.register_gpus("h", [g.identity for g in gpus])
    new = {g.id: ids[g.identity.uuid] for g in gpus}
    src = Store(source_url)
    try:
        hops = src.topology("h").hops
    finally:
        src.close()
    if hops:  # the PCIe tree the agent read from sysfs (the shared-port rule reads it)
        host_id = store.host_id("h")
        assert host_id is not None
        store.replace_topology(host_id, hops, ids, 0.0)
    return [(new[r[0]], *r[1:]) for r in rows]


def _ticks(rows: list[tuple]) -> Iterator[list[tuple]]:
    tick: list[tuple] = []
    for r in rows:
        if tick and r[1] != tick[0][1]:
            yield tick
            tick = []
        tick.append(r)
    if tick:
        yield tick


def _key(f: Finding) -> tuple:
    return (f.rule, tuple(sorted(f.labels.items())), f.state, f.value, repr(sorted(f.evidence.items())), f.reason)


@contextmanager
def _gpu_reads(store: Store) -> Iterator[list[str]]:
    """The statements run on ``store`` that read the GPU tables, while inside."""
    from sqlalchemy import event

    seen: list[str] = []

    def on(conn, cursor, statement, params, context, executemany):  # noqa: ANN001 - SQLAlchemy's event signature
        s = statement.lower()
        if s.lstrip().startswith("select") and ("gpu_samples" in s):
            seen.append(statement)

    event.listen(store.engine, "before_cursor_execute", on)
    try:
        yield seen
    finally:
        event.remove(store.engine, "before_cursor_execute", on)


def _drive(source_url: str, url: str, restart_at: float | None = None) -> dict:
    """Write the recorded rows tick by tick into a fresh store as the agent's writer does, feed
    the same rows to the windows, roll up as the agent's retention does (every completed
    minute) and, every 15 s of data, evaluate every rule twice at the newest tick: through
    memory and through the store. ``restart_at``: the windows are dropped there and a new
    agent's windows restore from the store."""
    rows = _recorded_rows(source_url)
    store = open_store(url)
    engine = Engine(Thresholds())
    out = {"evaluations": 0, "differences": [], "states": set(), "memory_reads": [], "rules": set(), "misses": []}
    try:
        rows = _register_like(source_url, store, rows)
        now = [0.0]
        retention = Retention(store, clock=lambda: now[0])
        retention.active_gpus = {g.id for g in store.gpus_of("h")}
        windows = RuleWindows(store, "h")
        last_eval: float | None = None
        restarted = False
        for tick in _ticks(rows):
            at = tick[0][1] / 1000.0
            if restart_at is not None and not restarted and at >= restart_at:
                windows, restarted = RuleWindows(store, "h"), True  # a new agent: nothing in memory
                out["restart_misses_before"] = 0
            store.write_gpu_rows(tick)
            windows.feed(tick)
            now[0] = at
            if last_eval is not None and at - last_eval < STEP_S:
                continue
            last_eval = at
            retention.run()
            windows.prepare()
            with _gpu_reads(store) as seen:
                before = windows.misses
                mem = engine.evaluate(HostView(windows, "h", at, gpus=windows.gpus))
                out["misses"].append((at, windows.misses - before))
            if windows.misses == before:
                out["memory_reads"] += seen
            db = engine.evaluate(HostView(store, "h", at))
            a, b = sorted(map(_key, mem)), sorted(map(_key, db))
            if a != b:
                out["differences"].append((at, [x for x in a if x not in b], [x for x in b if x not in a]))
            out["evaluations"] += 1
            out["states"] |= {(f.rule, f.state) for f in db}
            out["rules"] |= {f.rule for f in db}
            out["windows"] = windows
    finally:
        store.close()
    return out


def _source(tmp_path, minutes: float = 8.0) -> str:
    """A store written by the agent replaying the recorded H200 copy phase, ``minutes`` long, as
    four GPUs behind two PCIe switches, GPU 0 at the recorded rate (its link saturated), the
    others at half of it (each switch's uplink saturated by its two GPUs)."""
    url = f"sqlite:///{tmp_path / 'source.db'}"
    header, ticks = copy_phase(minutes=minutes, devices=4)
    _, half = scenarios.scale_gpm(header, ticks, PCIE_GPM, 0.5)
    # GPU 0's calls as recorded, the others' GPM at half the rate
    ticks = [{**t, "calls": [c if c[0] == 0 else h for c, h in zip(t["calls"], half_t["calls"])]} for t, half_t in zip(ticks, half)]
    gpus = [GpuIdentity(index=i, uuid=f"u{i}", pci_bus_id=f"00000000:{scenarios.bus_number(i, 4):02X}:00.0") for i in range(4)]
    real = json.loads((DATA / "h200-sysfs.json").read_text())
    root = sysfs.materialize(sysfs.switch_tree(real, gpus, per_switch=2), tmp_path / "sys")
    replay(url, header, ticks, rules=False, sysfs_root=root)
    return url


def test_verdicts_from_memory_equal_the_stores_for_every_rule_across_a_restart(tmp_path, db_url):
    source = _source(tmp_path)
    rows = _recorded_rows(source)
    first, last = rows[0][1] / 1000.0, rows[-1][1] / 1000.0
    out = _drive(source, db_url, restart_at=first + (last - first) / 2)
    assert out["evaluations"] >= 25
    assert out["differences"] == []
    # every rule with a subject in the capture was compared (it has no vLLM server and, replayed
    # without host samples, no processes), and the capture makes some of them fire
    assert out["rules"] == {r.name for r in RULES if r.subject not in ("vllm", "gpu_process")}
    assert {("GpuPcieSaturated", "firing"), ("PcieUplinkSaturated", "firing")} <= out["states"]
    # memory answered: after each start (the first agent's, the restarted one's) at most the
    # first two cycles went to the store, every later one read memory only
    missed = [at for at, n in out["misses"] if n]
    restart = first + (last - first) / 2
    assert len([t for t in missed if t < restart]) <= 2 and len([t for t in missed if t >= restart]) <= 2
    assert out["memory_reads"] == []


def test_a_rule_evaluation_reads_no_gpu_table_of_the_store_once_restored(tmp_path):
    source = _source(tmp_path, minutes=3.0)
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    out = _drive(source, url)
    # the first cycle learns the reads; the percentile reads that a window of a minute brings
    # are learned at the fifth; every later one reads memory only
    late = [n for _, n in out["misses"][6:]]
    assert late and all(n == 0 for n in late)
    assert out["memory_reads"] == []
    w = out["windows"]
    assert w.restores >= 1


def test_memory_holds_the_rules_windows_not_the_run(tmp_path):
    """30 hours of ticks every 10 s: memory holds the longest window each tier is read for (24 h of
    tick times for the XID rules' sample count, an hour of the memory-idle rule's columns, 6 h 10
    min of rollups for the leak fit), not the run."""
    source = _source(tmp_path, minutes=2.0)
    rows = _recorded_rows(source)
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    store = open_store(url)
    try:
        rows = _register_like(source, store, rows)
        windows = RuleWindows(store, "h")
        engine = Engine(Thresholds())
        template = [r for r in rows if r[1] == rows[-1][1]]
        t0 = rows[-1][1]
        step_ms, n = 10_000, 30 * 360
        for k in range(n):
            tick = [(r[0], t0 + k * step_ms, *r[2:]) for r in template]
            if k < 2:
                store.write_gpu_rows(tick)  # the store has the start; memory restores it
            windows.feed(tick)
            if k % 90 == 0:
                windows.prepare()
                engine.evaluate(HostView(windows, "h", tick[0][1] / 1000.0, gpus=windows.gpus))
        size = windows.size()
    finally:
        store.close()
    g = len(template)
    th = Thresholds()
    longest = th.xid_repeat_lookback_seconds
    assert windows.needs.ticks == longest and max(windows.needs.columns.values()) == th.memory_idle_window_seconds
    assert windows.needs.rollup == th.leak_fit_seconds + th.leak_step_seconds
    slack = 60 / 10 + 256  # a minute held for catch-up times, and trims that delete 256 at a time
    assert size["ticks"] <= g * (longest / 10 + slack) < g * n
    assert size["rollups"] <= g * (windows.needs.rollup / 60 + 4)
    assert size["values"] <= g * len(windows.needs.columns) * (th.memory_idle_window_seconds / 10 + slack)
    assert size["full"] <= g * (RuleWindows.FULL_SECONDS / 10 + RuleWindows.TRIM_EVERY)  # trimmed every few ticks
