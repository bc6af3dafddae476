"""The slow-leak rule on issue 11's simulated 72 h series (1 s ticks of a 141 GB GPU: 40 GB at start,
0.1 GB of noise, a +20 GB model load at hour 2, a restart at hour 30, 0.3 GB/day leaking from hour
12), through real SQLite/Postgres rollups, the rule engine and the alert lifecycle as the agent runs
them (the leak rule every 5 minutes)."""

from __future__ import annotations

import pytest
from conftest import ROOT

from vgpumon.model import GpuIdentity
from vgpumon.rules.catalogue import BY_NAME
from vgpumon.rules.engine import Engine
from vgpumon.rules.lifecycle import AlertBook
from vgpumon.rules.view import HostView
from vgpumon.store import open_store
from vgpumon.testing.memory import HOUR, MemoryStory, rollup_rows

pytestmark = pytest.mark.slow  # starts processes or servers: not in the quick subset (docs/testing.md)

START = 1_800_000_000.0  # a whole minute
LEAK = BY_NAME["GpuMemoryLeak"]
GPU = GpuIdentity(index=0, uuid="GPU-leak", name="NVIDIA H200", memory_total_bytes=141_000_000_000, gpm_supported=True)


def _store(url: str, story: MemoryStory):
    store = open_store(url)
    ids = store.register_gpus("h", [GPU])
    store.write_rollup_rows(rollup_rows(story, ids[GPU.uuid], START))
    return store


def run_agent_schedule(store, hours: float = 72.0, every: float = 300.0):
    """Evaluate the leak rule every ``every`` seconds of the story, as the agent does; returns the
    first alert that went firing (with the evaluation's finding) or ``None``, and every state seen."""
    engine = Engine()
    book = AlertBook(engine.by_name, engine.thresholds)
    seen = []
    t = START + every
    while t <= START + hours * HOUR:
        (finding,) = engine.evaluate(HostView(store, "h", t, active=book.active()), [LEAK])
        seen.append((t, finding))
        for a in book.update([finding], [LEAK], t).notify:
            if a.state == "firing":
                return a, finding, seen
        t += every
    return None, None, seen


def test_leak_fires_within_12_hours_with_time_to_full_within_20_percent(db_url):
    story = MemoryStory()
    store = _store(db_url, story)
    try:
        alert, finding, _ = run_agent_schedule(store)
    finally:
        store.close()
    assert alert is not None, "the 0.3 GB/day leak was never reported"
    fired_h = (alert.fired_at - START) / HOUR
    assert fired_h - 12 <= 12, f"fired {fired_h:.1f} h into the story, {fired_h - 12:.1f} h after the leak began"
    true_ttf = story.time_to_full(alert.fired_at - START)
    ttf = finding.evidence["ttf_seconds"]
    assert abs(ttf / true_ttf - 1) <= 0.20, (ttf / 86400, true_ttf / 86400)
    assert alert.labels == {"hostname": "h", "gpu": "0", "uuid": "GPU-leak"} and alert.severity == "warning"
    assert "GB/day" in alert.description and "full in" in alert.description
    print(f"GpuMemoryLeak fired at hour {fired_h:.2f}; slope {finding.evidence['slope']} "
          f"(interval {finding.evidence['interval']}, confidence {finding.evidence['confidence']}); "
          f"time to full {ttf / 86400:.0f} days vs true {true_ttf / 86400:.0f} days ({(ttf / true_ttf - 1) * 100:+.1f} %)")


def test_same_72_hours_without_the_leak_stay_silent(db_url):
    store = _store(db_url, MemoryStory(leak_per_day=0.0))
    try:
        alert, _, seen = run_agent_schedule(store)
    finally:
        store.close()
    assert alert is None
    # the model load and the restart are steps, never a trend: no evaluation even goes pending
    assert all(f.state != "firing" for _, f in seen)
    # and right after a step the rule says it cannot judge yet (unknown), not "healthy"
    after_load = next(f for t, f in seen if t == START + 3 * HOUR)
    assert after_load.state == "unknown" and "since a level step" in after_load.reason


# -- the Prometheus twin, fed the same series at 15 s through promtool 2.42 ------------------------

import shutil  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

import yaml  # noqa: E402

from vgpumon.testing.memory import humanize, promql_avg, scrape  # noqa: E402

RULE_FILE = ROOT / "rules" / "gpu-memory.rules.yml"
SCRAPE = 15
SERIES = 'vgpumon_gpu_memory_used_bytes{hostname="h", gpu="0", uuid="GPU-leak", job="vgpumon", instance="h:9400"}'
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed")


@pytest.fixture(scope="module")
def native_fired_at(tmp_path_factory) -> float:
    """Seconds into the story at which the native engine first fired (SQLite)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('leak') / 'x.db'}"
    store = _store(url, MemoryStory())
    try:
        alert, _, _ = run_agent_schedule(store)
    finally:
        store.close()
    assert alert is not None
    return alert.fired_at - START


def _window(values: list[float], end: float, length: float) -> list[float]:
    # Prometheus 2.42 range selectors include both ends: samples with end - length <= t <= end
    return [v for k, v in enumerate(values) if end - length <= k * SCRAPE <= end]


def _twin_value(values: list[float], at: float) -> float:
    part = 3 * HOUR
    c = promql_avg(_window(values, at, part))
    a = promql_avg(_window(values, at - 2 * part, part))
    return (c - a) * (86400 / (2 * part))


def _promtool_case(values: list[float], checks: list[dict]) -> dict:
    return {
        "interval": f"{SCRAPE}s",
        "input_series": [{"series": SERIES, "values": " ".join(f"{v:.0f}" for v in values)}],
        "alert_rule_test": checks,
    }


def _run_promtool(tmp_path: Path, tests: list[dict]) -> subprocess.CompletedProcess:
    doc = {"rule_files": [str(RULE_FILE)], "evaluation_interval": "1m", "tests": tests}
    path = tmp_path / "leak.test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=600)


@needs_promtool
def test_prometheus_twin_fires_within_2_hours_of_native_and_stays_silent_without_leak(tmp_path, native_fired_at):
    leak = [float(round(v)) for v in scrape(MemoryStory(), SCRAPE)]
    flat = [float(round(v)) for v in scrape(MemoryStory(leak_per_day=0.0), SCRAPE)]
    check_at = (int(native_fired_at + 2 * HOUR) // 60 + 1) * 60  # the first rule evaluation after native + 2 h
    value = _twin_value(leak, check_at)
    desc = (f"Memory used on GPU 0 of h grows by {humanize(value)}B/day, sustained over the last 9h "
            "(three 3h means rising alike).")
    labels = {"severity": "warning", "hostname": "h", "gpu": "0", "uuid": "GPU-leak"}
    annotations = {"summary": LEAK.summary, "description": desc, "runbook_url": "docs/runbooks/GpuMemoryLeak.md"}
    fired = {"eval_time": f"{check_at}s", "alertname": "GpuMemoryLeak", "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}]}
    not_yet = {"eval_time": f"{int(15 * HOUR)}s", "alertname": "GpuMemoryLeak", "exp_alerts": []}  # 3 h into the leak
    silent = [{"eval_time": f"{h}h", "alertname": "GpuMemoryLeak", "exp_alerts": []} for h in range(1, 73)]
    out = _run_promtool(tmp_path, [_promtool_case(leak, [not_yet, fired]), _promtool_case(flat, silent)])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    print(f"native fired at hour {native_fired_at / HOUR:.2f}; twin firing at hour {check_at / HOUR:.2f} "
          f"with {humanize(value)}B/day; silent at every hour of the story without the leak")


# -- what must not pass for a leak: a change of memory semantics, a sleeping vLLM server ----------

from vgpumon.model import InstanceIdentity, ServerSample, ServerState  # noqa: E402
from vgpumon.store.codec import ROLLUP_ROW_COLUMNS  # noqa: E402
from vgpumon.store.vllm_repository import VllmRepository  # noqa: E402

RESERVED = 645_922_816  # 616 MiB: what memory v1 "used" includes and v2 reports apart (FACTS §1)


def _evaluate_at(store, hours: float):
    (finding,) = Engine().evaluate(HostView(store, "h", START + hours * HOUR), [LEAK])
    return finding


def _semantics_change_at_hour_40(store, story: MemoryStory) -> None:
    """At hour 40 the NVML source falls back from memory v2 to v1: 'used' gains the 616 MiB the
    driver reserves (less than a step) and 'reserved' is no longer reported."""
    cols = {c: i for i, c in enumerate(ROLLUP_ROW_COLUMNS)}
    rows = []
    for r in rollup_rows(story, 1, START):
        r = list(r)
        if r[cols["ts"]] < (START + 40 * HOUR) * 1000:
            r[cols["memory_reserved_bytes_mean"]] = RESERVED
        else:
            for agg in ("min", "mean", "max", "p50", "p95", "p99"):
                r[cols[f"memory_used_bytes_{agg}"]] += RESERVED
        rows.append(tuple(r))
    assert store.register_gpus("h", [GPU]) == {GPU.uuid: 1}
    store.write_rollup_rows(rows)


@pytest.mark.parametrize("leak_per_day", [0.3e9, 0.0])
def test_a_change_of_memory_semantics_is_carried_across_not_a_restart(tmp_path, leak_per_day):
    """The 0.3 GB/day leak fires before the v2 → v1 fallback at hour 40 and keeps firing across it:
    the 616 MiB v1 adds to 'used' is the offset v2 reported as reserved, carried over, so the fit
    runs on, where it used to say "unknown: a trend needs 6 h" for six hours. Without a leak the
    same change is no leak either (the offset is not a rise)."""
    store = open_store(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        _semantics_change_at_hour_40(store, MemoryStory(leak_per_day=leak_per_day))
        before, after, later = (_evaluate_at(store, h) for h in (39.5, 41, 43))
    finally:
        store.close()
    want = "firing" if leak_per_day else "ok"
    assert (before.state, after.state, later.state) == (want, want, want), (before, after, later)
    if leak_per_day:
        # the slope across the change is the leak's, not the leak plus the offset
        assert 0.2 <= after.value / 1e9 <= 0.45, after.evidence


def _server_samples(sleep_from: float, sleep_to: float) -> list[ServerSample]:
    ident = InstanceIdentity(host="127.0.0.1", port=8000, url="http://127.0.0.1:8000", origin="discovered", pid=4242,
                             process_start=START, first_seen=START)
    out = []
    for minute in range(int(39 * 60), int(44 * 60), 5):
        t = START + minute * 60
        state = ServerState.SLEEPING if sleep_from * HOUR <= minute * 60 < sleep_to * HOUR else ServerState.IDLE
        out.append(ServerSample(instance=ident, ts=t, state=state, reason="test", ready_ts=START + 60,
                                gpu_uuids=(GPU.uuid,), telemetry="full"))
    return out


def test_a_sleeping_vllm_server_on_the_gpu_starts_the_fit_over(tmp_path):
    """A vLLM server on the GPU sleeps from hour 40 to 40.5, giving back 0.5 GB (less than a step)
    and taking it again on waking. The fit starts after its newest sleeping poll."""
    cols = {c: i for i, c in enumerate(ROLLUP_ROW_COLUMNS)}
    rows = []
    for r in rollup_rows(MemoryStory(leak_per_day=0.0), 1, START):
        r = list(r)
        if (START + 40 * HOUR) * 1000 <= r[cols["ts"]] < (START + 40.5 * HOUR) * 1000:
            for agg in ("min", "mean", "max", "p50", "p95", "p99"):
                r[cols[f"memory_used_bytes_{agg}"]] -= 500_000_000
        rows.append(tuple(r))
    store = open_store(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        store.register_gpus("h", [GPU])
        store.write_rollup_rows(rows)
        VllmRepository(store.engine).write("h", _server_samples(40, 40.5))
        finding = _evaluate_at(store, 43)
    finally:
        store.close()
    assert finding.state == "unknown" and "since a level step or a break" in finding.reason


# -- per process ------------------------------------------------------------------------------------


def _process_rows(host_id: int, gpu_id: int, pid: int, start_time: float, hours: tuple[float, float], leak_per_day: float) -> list[dict]:
    import random

    rng = random.Random(pid)
    rows = []
    for minute in range(int(hours[0] * 60), int(hours[1] * 60)):
        t = START + minute * 60.0
        used = 20e9 + leak_per_day * max(0.0, t - start_time) / 86400 + rng.gauss(0, 0.05e9)
        rows.append({"host_id": host_id, "gpu_id": gpu_id, "ts": t, "pid": pid, "start_time": start_time, "name": "vllm",
                     "cmdline": "vllm serve", "username": "svc", "container_id": None, "resolved": True,
                     "used_gpu_memory_bytes": int(used), "rss_bytes": None, "cpu_seconds_total": None})
    return rows


def test_a_leaking_process_fires_and_its_restart_starts_over(db_url):
    """Per process: one serving process leaks 0.3 GB/day (fires, labelled with its pid); after it is
    restarted (a new process, new pid) the new one is judged on its own series."""
    store = open_store(db_url)
    try:
        gpu_id = store.register_gpus("h", [GPU])[GPU.uuid]
        host_id = store.host_id("h")
        store.write_extra_rows([{"gpu_process_samples": _process_rows(host_id, gpu_id, 100, START, (0, 9), 0.3e9)}])
        store.write_extra_rows([{"gpu_process_samples": _process_rows(host_id, gpu_id, 200, START + 9 * HOUR, (9, 12), 0.3e9)}])
        engine = Engine()
        rule = BY_NAME["GpuProcessMemoryLeak"]
        book = AlertBook(engine.by_name, engine.thresholds)
        fired = []
        for minutes in range(6 * 60, 12 * 60, 5):
            t = START + minutes * 60
            findings = engine.evaluate(HostView(store, "h", t, active=book.active()), [rule])
            fired += [(t, a.state, dict(a.labels), a.description) for a in book.update(findings, [rule], t).notify]
        after = engine.evaluate(HostView(store, "h", START + 11 * HOUR), [rule])
    finally:
        store.close()
    (t, state, labels, description), *rest = fired
    assert state == "firing" and labels == {"hostname": "h", "gpu": "0", "uuid": "GPU-leak", "pid": "100"}
    assert 7 * HOUR <= t - START <= 8.5 * HOUR and "vllm (pid 100)" in description
    assert [(r[2]["pid"], r[1]) for r in rest] == [("100", "resolved")]  # gone with its process
    (new,) = after
    assert new.labels["pid"] == "200" and new.state == "unknown"  # 2 h of the new process: too short to judge
