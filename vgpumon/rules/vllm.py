"""vLLM rules: a server dead, hung or with an engine lost; a start not ready in time, slower than
earlier starts, or sent traffic before warm-up; KV-cache fragmentation, KV usage stuck high with
nothing running, requests waiting while the batch runs far below capacity.

Subjects are servers (``hostname``, ``server`` = the base URL); each rule looks at the server's
current start (its newest ``vllm_instances`` row). States, prewarm and the KV estimate are the vLLM
source's (docs/vllm.md, FACTS §5).
"""

from __future__ import annotations

from statistics import median
from typing import Iterable

from vgpumon.config.thresholds import Thresholds
from vgpumon.model import ServerState
from vgpumon.model.vllm import latency_for_alerts
from vgpumon.rules.core import Finding, Rule, Runbook, Twin, by, duration, pct, prom, prom_duration
from vgpumon.rules.view import HostView, VllmInstanceRow, VllmRecord

V = "vllm_samples"
BY = by("vllm")
S = ServerState
ALIVE = frozenset({S.READY, S.BUSY, S.IDLE, S.HUNG, S.SLEEPING, S.TELEMETRY_DOWN})


def _state_sel(*states: ServerState) -> str:
    return prom(V, "state") + '{state=~"' + "|".join(s.value for s in states) + '"}'


def current_starts(view: HostView, lookback: float) -> list[VllmInstanceRow]:
    """The newest start of each server (by URL) seen within ``lookback`` of the evaluation time."""
    newest: dict[str, VllmInstanceRow] = {}
    for inst in view.vllm_instances:
        if inst["url"] not in newest or inst["first_seen"] >= newest[inst["url"]]["first_seen"]:
            newest[inst["url"]] = inst
    return [i for _, i in sorted(newest.items()) if i["last_seen"] >= view.at - lookback]


def _labels(view: HostView, inst: VllmInstanceRow) -> dict[str, str]:
    # as /metrics labels the server (vgpumon.exporter.collector), so native and Prometheus alerts match
    return {"hostname": view.hostname, "server": f"{inst['address']}:{inst['port']}"}


def _model(inst: VllmInstanceRow) -> str:
    return inst["model"] or "unknown model"


def _newest(view: HostView, inst: VllmInstanceRow, seconds: float) -> VllmRecord | None:
    rows = view.vllm_samples(inst["id"], seconds)
    return rows[-1] if rows else None


# -- dead, hung, engine lost ----------------------------------------------------------------------


def _why(row: VllmRecord, inst: VllmInstanceRow) -> str:
    if row["health_status"] in (500, 503):
        return f"/health answered {row['health_status']}"
    if inst["ended"] is not None:
        return "its process is gone"
    return "its port refuses connections"


def _dead(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    window = th.vllm_dead_window_seconds
    for inst in current_starts(view, window):
        row = _newest(view, inst, window)
        if row is None:
            continue
        state = row["state"]
        on = state in (S.DEAD, S.FAILED_TO_START)
        ready = inst["ready"]
        yield Finding(rule.name, _labels(view, inst), "firing" if on else "ok", None,
                      {"server": inst["url"], "model": _model(inst), "state": state.value, "why": _why(row, inst),
                       "ago": duration(view.at - row["ts"]),
                       "served": "never became ready" if ready is None else f"was ready for {duration(row['ts'] - ready)}"})


def _hung(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    window = th.vllm_hung_for_seconds
    for inst in current_starts(view, th.kv_window_seconds):
        rows = view.vllm_samples(inst["id"], window)
        if len(rows) < 2:
            yield Finding(rule.name, _labels(view, inst), "unknown", reason=f"fewer than two polls in the last {duration(window)}")
            continue
        covered = rows[0]["ts"] <= view.at - 0.8 * window
        on = covered and all(r["state"] is S.HUNG for r in rows)
        last = rows[-1]
        yield Finding(rule.name, _labels(view, inst), "firing" if on else "ok", None,
                      {"server": inst["url"], "model": _model(inst), "window": duration(window), "why": last.get("reason") or "no reason stored",
                       "running": f"{last['running']:.0f}" if last["running"] is not None else "N/A",
                       "waiting": f"{last['waiting']:.0f}" if last["waiting"] is not None else "N/A"})


def _engine_lost(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    window = th.kv_window_seconds
    k = th.vllm_engine_lost_polls
    for inst in current_starts(view, window):
        polls = view.vllm_samples(inst["id"], window)
        if len(polls) <= k:
            yield Finding(rule.name, _labels(view, inst), "unknown", reason=f"fewer than {k + 1} polls in the last {duration(window)}")
            continue
        recent = polls[-k:]
        if not all(r["state"] in ALIVE and r["telemetry_up"] for r in recent):
            # a dead server is VllmServerDead's; without telemetry no engine is seen at all
            yield Finding(rule.name, _labels(view, inst), "unknown", reason="the server is not alive with telemetry in its newest polls")
            continue
        rows = view.vllm_engine_samples(inst["id"], window)
        since = recent[0]["ts"]
        before = {(r["model_name"], r["engine"]): r["ts"] for r in rows if r["ts"] < since}
        now = {(r["model_name"], r["engine"]) for r in rows if r["ts"] >= since}
        lost = {e: ts for e, ts in before.items() if e not in now}
        names = ", ".join(f"engine {e or '(unlabelled)'}" + (f" of {m}" if m else "") + f" (last seen {duration(view.at - ts)} ago)"
                          for (m, e), ts in sorted(lost.items()))
        yield Finding(rule.name, _labels(view, inst), "firing" if lost else "ok", float(len(lost)),
                      {"server": inst["url"], "engines": names, "left": len(now), "polls": k})


# -- prewarm --------------------------------------------------------------------------------------


def _not_ready(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    for inst in current_starts(view, th.kv_window_seconds):
        row = _newest(view, inst, th.kv_window_seconds)
        if row is None:
            continue
        began = inst["process_start"] if inst["process_start"] is not None else inst["first_seen"]
        waited = view.at - began
        on = row["state"] is S.STARTING and waited >= th.vllm_ready_limit_seconds
        yield Finding(rule.name, _labels(view, inst), "firing" if on else "ok", waited if row["state"] is S.STARTING else None,
                      {"server": inst["url"], "model": _model(inst), "waited": duration(waited),
                       "limit": duration(th.vllm_ready_limit_seconds),
                       "since": "process start" if inst["process_start"] is not None else "first seen"})


def _recent_ready(view: HostView, th: Thresholds) -> Iterable[tuple[VllmInstanceRow, float]]:
    """The starts that became ready lately, each with when it did."""
    for inst in current_starts(view, th.vllm_recent_start_seconds):
        ready = inst["ready"]
        if ready is not None and 0 <= view.at - ready <= th.vllm_recent_start_seconds:
            yield inst, ready


def _prewarm_slow(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    for inst, _ in _recent_ready(view, th):
        labels = _labels(view, inst)
        took = inst["prewarm_seconds"]
        if took is None:
            yield Finding(rule.name, labels, "unknown", reason="prewarm not measured (the start was not watched)")
            continue
        earlier = [i["prewarm_seconds"] for i in view.vllm_instances
                   if i["id"] != inst["id"] and i["model"] == inst["model"] and i["prewarm_seconds"] is not None
                   and i["first_seen"] < inst["first_seen"]]
        if not earlier:
            yield Finding(rule.name, labels, "unknown", reason=f"no earlier start of {_model(inst)} on this host to compare with")
            continue
        usual = median(earlier)
        on = took >= th.vllm_prewarm_slower_factor * usual and took - usual >= th.vllm_prewarm_slower_min_seconds
        gpu = inst["prewarm_gpu_active_ratio"]
        yield Finding(rule.name, labels, "firing" if on else "ok", took,
                      {"server": inst["url"], "model": _model(inst), "took": duration(took), "usual": duration(usual),
                       "starts": len(earlier), "gpu": "N/A" if gpu is None else pct(gpu)})


def _traffic_before_warm(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    for inst, ready in _recent_ready(view, th):
        labels = _labels(view, inst)
        rows = view.vllm_samples(inst["id"], view.at - ready)
        # a poll whose TTFT histogram was flagged unreliable gives nothing: its quantiles cannot be true
        ttft = [(r["ts"], latency_for_alerts(r, "ttft", 95)) for r in rows]
        early = [v for ts, v in ttft if ts <= ready + th.vllm_early_seconds and v is not None]
        steady = [v for ts, v in ttft if ts >= ready + th.vllm_steady_after_seconds and v is not None]
        if len(steady) < 3:
            yield Finding(rule.name, labels, "unknown", reason="TTFT of the steady state not known yet")
            continue
        base = median(steady)
        if not early:
            yield Finding(rule.name, labels, "ok", None, {"server": inst["url"]})
            continue
        worst = max(early)
        on = worst >= th.vllm_early_ttft_factor * base and worst >= th.vllm_early_ttft_min_seconds
        yield Finding(rule.name, labels, "firing" if on else "ok", worst,
                      {"server": inst["url"], "model": _model(inst), "early": f"{worst:.1f} s", "steady": f"{base:.2f} s",
                       "first": duration(th.vllm_early_seconds), "prewarm": duration(inst["prewarm_seconds"])})


# -- KV cache -------------------------------------------------------------------------------------


def _alive_polls(view: HostView, inst: VllmInstanceRow, window: float) -> list[VllmRecord]:
    return [r for r in view.vllm_samples(inst["id"], window) if r["state"] in ALIVE]


def _gauges(view: HostView, inst: VllmInstanceRow, window: float, *names: str) -> tuple[list[VllmRecord], list[list[float]] | None]:
    """The start's live polls over the window and, per gauge, its known values — ``None`` when a
    gauge has none or the polls do not cover the window (the rule then says unknown)."""
    polls = _alive_polls(view, inst, window)
    values = [[r[n] for r in polls if r[n] is not None] for n in names]
    if not polls or not all(values) or polls[0]["ts"] > view.at - 0.9 * window:
        return polls, None
    return polls, values


def _fragmented(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    window = th.kv_window_seconds
    for inst in current_starts(view, window):
        labels = _labels(view, inst)
        polls = _alive_polls(view, inst, window)
        if not polls or all(r["kv_block_size"] is None or r["kv_cache_usage_ratio"] is None for r in polls):
            yield Finding(rule.name, labels, "unknown", reason="KV block size or usage not reported (cache_config_info, kv_cache_usage_perc)")
            continue
        values = []
        for r in polls:
            if r["kv_fragmentation_ratio"] is not None:
                values.append(r["kv_fragmentation_ratio"])
            elif r["running"] == 0 and r["kv_block_size"] is not None:
                values.append(0.0)  # nothing running: no partly filled last block, no waste
        if len(values) < 0.5 * len(polls) or polls[0]["ts"] > view.at - 0.9 * window:
            yield Finding(rule.name, labels, "unknown", reason=f"the estimate covers less than the last {duration(window)}")
            continue
        mean = sum(values) / len(values)
        limit = th.kv_fragmentation_ratio * (0.8 if view.is_active(rule.name, labels) else 1.0)
        running = [r["running"] for r in polls if r["running"] is not None]
        used = [r["kv_blocks_used"] for r in polls if r["kv_blocks_used"] is not None]
        block = next(r["kv_block_size"] for r in reversed(polls) if r["kv_block_size"] is not None)
        r_mean = sum(running) / len(running) if running else None
        slots = (sum(used) / len(used)) * block / r_mean if used and r_mean else None
        rates = [(r["prompt_tokens_per_second"], r["generation_tokens_per_second"]) for r in polls
                 if r["prompt_tokens_per_second"] is not None and r["generation_tokens_per_second"] is not None]
        mix = (f"{sum(p for p, _ in rates) / len(rates):.0f} prompt and {sum(g for _, g in rates) / len(rates):.0f} generated tokens/s"
               if rates else "token rates not reported")
        approx = any(r["kv_estimate_approximate"] for r in polls)
        yield Finding(rule.name, labels, "firing" if mean >= limit else "ok", mean,
                      {"server": inst["url"], "model": _model(inst), "share": pct(mean), "window": duration(window), "block": block,
                       "running": "N/A" if r_mean is None else f"{r_mean:.0f}",
                       "slots": "N/A" if slots is None else f"{slots:.0f}", "mix": mix,
                       "approx": " (approximate: hybrid model or config incomplete)" if approx else ""})


def _stuck_high(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    window = th.kv_window_seconds
    for inst in current_starts(view, window):
        labels = _labels(view, inst)
        polls, values = _gauges(view, inst, window, "kv_cache_usage_ratio", "running")
        if values is None:
            yield Finding(rule.name, labels, "unknown", reason=f"KV usage or request gauges not reported over the last {duration(window)}")
            continue
        usage = values[0]
        work = [(r["running"] or 0) + (r["waiting"] or 0) for r in polls]
        on = min(usage) >= th.kv_stuck_usage_ratio and max(work) == 0 and len(usage) == len(polls)
        yield Finding(rule.name, labels, "firing" if on else "ok", min(usage),
                      {"server": inst["url"], "usage": pct(min(usage)), "window": duration(window)})


def _queued_underused(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    window = th.kv_window_seconds
    for inst in current_starts(view, window):
        labels = _labels(view, inst)
        polls, values = _gauges(view, inst, window, "waiting", "kv_cache_usage_ratio")
        if values is None:
            yield Finding(rule.name, labels, "unknown", reason=f"waiting requests or KV usage not reported over the last {duration(window)}")
            continue
        waiting, usage = values
        running = [r["running"] for r in polls if r["running"] is not None]
        on = min(waiting) >= 1 and max(usage) < th.queued_kv_usage_ratio and len(waiting) == len(polls)
        yield Finding(rule.name, labels, "firing" if on else "ok", min(waiting),
                      {"server": inst["url"], "waiting": f"{min(waiting):.0f}", "usage": pct(max(usage)),
                       "running": "N/A" if not running else f"{sum(running) / len(running):.0f}", "window": duration(window)})


# -- twins ----------------------------------------------------------------------------------------


def _dead_twin(th: Thresholds) -> list[Twin]:
    return [Twin(f"max {BY} ({_state_sel(S.DEAD, S.FAILED_TO_START)}) == 1",
                 "vLLM server {{ $labels.server }} on {{ $labels.hostname }} is dead (or failed to start).")]


def _hung_twin(th: Thresholds) -> list[Twin]:
    return [Twin(f"max {BY} ({_state_sel(S.HUNG)}) == 1",
                 "vLLM server {{ $labels.server }} on {{ $labels.hostname }} makes no progress (hung: see the agent's reason).",
                 for_seconds=th.vllm_hung_for_seconds)]


def _engine_lost_twin(th: Thresholds) -> list[Twin]:
    w = prom_duration(th.kv_window_seconds)
    eng = prom("vllm_engine_samples", "running")
    expr = (f"count {BY} (max_over_time({eng}[{w}]) unless {eng})\n"
            f"and on (hostname, server) max {BY} ({_state_sel(*sorted(ALIVE, key=lambda s: s.code))}) == 1")
    return [Twin(expr, "{{ $value }} data-parallel engine(s) of vLLM server {{ $labels.server }} on {{ $labels.hostname }} "
                 "stopped reporting while the server answers.")]


def _not_ready_twin(th: Thresholds) -> list[Twin]:
    return [Twin(f"max {BY} ({_state_sel(S.STARTING)}) == 1",
                 "vLLM server {{ $labels.server }} on {{ $labels.hostname }} is not ready after "
                 + prom_duration(th.vllm_ready_limit_seconds) + ".", for_seconds=th.vllm_ready_limit_seconds)]


def _recent(th: Thresholds) -> str:
    ready = prom("exporter", "vllm_ready_timestamp_seconds")
    return f"max {BY} (time() - {ready}) <= {th.vllm_recent_start_seconds:g}"


def _prewarm_twin(th: Thresholds) -> list[Twin]:
    p = prom("vllm_instances", "prewarm_seconds")
    # the server's earlier starts are its earlier prewarm values (one series per server URL):
    # their median over a week, up to the current start
    before = f"max {BY} (quantile_over_time(0.5, {p}[7d] offset {prom_duration(th.vllm_recent_start_seconds)}))"
    now = f"max {BY} ({p})"
    expr = (f"{now} >= {th.vllm_prewarm_slower_factor:g} * {before}\n"
            f"and ({now} - {before}) >= {th.vllm_prewarm_slower_min_seconds:g}\n"
            f"and on (hostname, server) {_recent(th)}")
    return [Twin(expr, "vLLM server {{ $labels.server }} on {{ $labels.hostname }} took {{ $value | humanizeDuration }} "
                 "to become ready, much longer than its earlier starts.")]


def _traffic_twin(th: Thresholds) -> list[Twin]:
    ttft = prom(V, "ttft_p95_seconds")
    ready = prom("exporter", "vllm_ready_timestamp_seconds")
    w = prom_duration(th.vllm_recent_start_seconds)
    steady = prom_duration(th.vllm_recent_start_seconds - th.vllm_steady_after_seconds)
    expr = (f"max {BY} (max_over_time({ttft}[{w}])) >= {th.vllm_early_ttft_factor:g} * max {BY} (quantile_over_time(0.5, {ttft}[{steady}]))\n"
            f"and max {BY} (max_over_time({ttft}[{w}])) >= {th.vllm_early_ttft_min_seconds:g}\n"
            f"and on (hostname, server) max {BY} (time() - {ready}) >= {th.vllm_steady_after_seconds:g}\n"
            f"and on (hostname, server) {_recent(th)}")
    return [Twin(expr, "vLLM server {{ $labels.server }} on {{ $labels.hostname }} served a TTFT p95 of {{ $value | humanize }}s "
                 "just after it became ready, far above its steady state: traffic arrived before warm-up finished.")]


def _fragmented_twin(th: Thresholds) -> list[Twin]:
    w = prom_duration(th.kv_window_seconds)
    frag = prom(V, "kv_fragmentation_ratio")
    # as the native check, only over a window the estimates cover (from 90 % of it): a server
    # seen for a minute has no 15-minute mean (a replay beside a live server fired it at once)
    covered = f"max {BY} (time() - min_over_time(timestamp({frag})[{w}:15s])) >= {0.9 * th.kv_window_seconds:g}"
    return [Twin(f"max {BY} (avg_over_time({frag}[{w}])) >= {th.kv_fragmentation_ratio}\nand on (hostname, server) {covered}",
                 "An estimated {{ $value | humanizePercentage }} of the KV-cache slots in use on vLLM server {{ $labels.server }} "
                 "({{ $labels.hostname }}) hold no token (mean over " + w + ").")]


def _stuck_high_twin(th: Thresholds) -> list[Twin]:
    w = prom_duration(th.kv_window_seconds)
    expr = (f"max {BY} ({prom(V, 'kv_cache_usage_ratio')}) >= {th.kv_stuck_usage_ratio}\n"
            f"and max {BY} ({prom(V, 'running')}) == 0\n"
            f"and max {BY} ({prom(V, 'waiting')}) == 0")
    return [Twin(expr, "KV cache of vLLM server {{ $labels.server }} on {{ $labels.hostname }} stayed at "
                 "{{ $value | humanizePercentage }} or more for " + w + " with no request running or waiting.",
                 for_seconds=th.kv_window_seconds)]


def _queued_twin(th: Thresholds) -> list[Twin]:
    w = prom_duration(th.kv_window_seconds)
    expr = (f"max {BY} ({prom(V, 'waiting')}) >= 1\n"
            f"and max {BY} ({prom(V, 'kv_cache_usage_ratio')}) < {th.queued_kv_usage_ratio}")
    return [Twin(expr, "Requests waited on vLLM server {{ $labels.server }} ({{ $labels.hostname }}) for " + w
                 + " while its KV cache stayed below " + f"{th.queued_kv_usage_ratio:.0%}" + " in use.",
                 for_seconds=th.kv_window_seconds)]


RULES: tuple[Rule, ...] = (
    Rule(
        "VllmServerDead", "critical", "vllm",
        "A vLLM server died (or failed to start).",
        "{server} ({model}) is {state}: {why}, {ago} ago; it {served}.",
        (f"{V}.state", f"{V}.health_status", "vllm_instances.final_state"),
        _dead,
        _dead_twin,
        Runbook(
            "After it was ready, the server's /health answered 500/503, its port refused connections or its process "
            "went away — whatever its exit status (vLLM exits 0 after its engine dies; FACTS §5); or an engine process "
            "of its tree died while the API process lives. 'failed to start': the process went away before it was ever ready.",
            "`vgpumon diagnose <host>`; the server's log (look for the engine core's traceback, CUDA OOM, NCCL errors); "
            "`journalctl -k | grep -i xid` for a GPU fault at the same time.",
            "Restart the server (its supervisor should); if it dies again, read the first error of its log.",
        ),
    ),
    Rule(
        "VllmServerHung", "critical", "vllm",
        "A vLLM server makes no progress: work or a probe waits, or its engine is stopped.",
        "{server} ({model}) has been hung for {window}: {why} ({running} running, {waiting} waiting).",
        (f"{V}.state", f"{V}.running", f"{V}.waiting"),
        _hung,
        _hung_twin,
        Runbook(
            "The engine no longer steps: requests run or wait while the prompt and generation token counters stay flat "
            "and the engine uses no CPU (or /health times out); or an engine process has been stopped (T) or in "
            "uninterruptible sleep (D) for 3 polls; or the one-token generation probe, sent while the server read idle "
            "with clients connected, got no answer by its deadline. A hung engine still answers /health 200 and its "
            "gauges freeze with it, often at 0 running, 0 waiting (FACTS §5; docs/vllm.md, \"Hung, not slow\").",
            "The alert's reason says which. `ps -o pid,stat,wchan:32,cmd --ppid <server pid>` (T: stopped, D: "
            "uninterruptible); `curl <server>/metrics | grep -e num_requests -e tokens_total` twice; the server's "
            "log (requests `vgpumon-probe-…` are the probe's); `GpuStuck` on its GPUs.",
            "A stopped engine: find who stopped it (a debugger, a job controller, a cgroup freezer) and `kill -CONT` it. "
            "Otherwise capture `py-spy dump` of the engine core, then restart the server (take it out of rotation first).",
        ),
        every_seconds=15.0,
    ),
    Rule(
        "VllmEngineLost", "critical", "vllm",
        "A data-parallel engine of a vLLM server stopped reporting.",
        "{server}: {engines} — absent from the newest {polls} polls while the server answers ({left} engine series left).",
        ("vllm_engine_samples.running", f"{V}.state", f"{V}.telemetry_up"),
        _engine_lost,
        _engine_lost_twin,
        Runbook(
            "vLLM reports each data-parallel engine as its own series (label engine, 0.8+). An engine that reported in "
            "this start and no longer does while the API server answers has died or lost its connection: its share of "
            "capacity is gone, and requests routed to it may fail.",
            "`curl <server>/metrics | grep num_requests_running` lists the engines left; the server's log for the engine's error.",
            "Restart the server; check the GPUs of the lost engine (`GpuLost`, XIDs).",
        ),
        every_seconds=15.0,
    ),
    Rule(
        "VllmNotReady", "warning", "vllm",
        "A vLLM server is not ready long after its process started.",
        "{server} ({model}) has been starting for {waited} since its {since} (limit {limit}).",
        (f"{V}.state", "vllm_instances.process_start"),
        _not_ready,
        _not_ready_twin,
        Runbook(
            "Until ready, vLLM refuses connections: it loads weights, sizes the KV cache and captures CUDA graphs. Far "
            "longer than the limit means a stuck download, a cold compile cache, a GPU held by another process, or a crash loop.",
            "The server's log: the last of 'Model loading took', 'GPU KV cache size', 'Graph capturing finished' tells "
            "where it stands; `nvidia-smi` for memory held by others.",
            "Fix what the log shows; keep traffic away until it is ready.",
        ),
        every_seconds=30.0,
    ),
    Rule(
        "VllmPrewarmSlow", "warning", "vllm",
        "A vLLM start took much longer than earlier starts of the same model on this host.",
        "{server} ({model}) took {took} to become ready; its {starts} earlier start(s) took {usual} (median). "
        "GPU activity during prewarm: {gpu}.",
        ("vllm_instances.prewarm_seconds", "vllm_instances.prewarm_gpu_active_ratio", "vllm_instances.model"),
        _prewarm_slow,
        _prewarm_twin,
        Runbook(
            "Prewarm (process start → first /health 200) took far longer than before for the same model: the weights "
            "came from a slower place, the compile cache was cold, or the GPU was shared while it warmed up. Low GPU "
            "activity during prewarm points at loading, high at graph capture.",
            "The server's start-up log ('Model loading took', 'Graph capturing finished in', 'init engine … took'); "
            "`vgpumon diagnose <host>` for the prewarm figures.",
            "Warm the compile cache, keep weights on local disk; make the load balancer wait for /health.",
        ),
        every_seconds=60.0,
    ),
    Rule(
        "VllmTrafficBeforeWarm", "warning", "vllm",
        "Requests reached a vLLM server before it had warmed up.",
        "In the first {first} after {server} became ready, TTFT p95 reached {early}, against {steady} in its steady state "
        "(prewarm took {prewarm}).",
        (f"{V}.ttft_p95_seconds", "vllm_instances.ready"),
        _traffic_before_warm,
        _traffic_twin,
        Runbook(
            "The first requests after ready waited far longer than the server's steady state: traffic arrived while "
            "CUDA graphs or caches were still warming (47 s of graph capture in our story), so users paid for the warm-up.",
            "TTFT p95 of the server around its ready time (`vgpumon diagnose <host>`, the dashboard's latency panel).",
            "Gate traffic on /health and a warm-up request; give the load balancer a slow start.",
        ),
        every_seconds=60.0,
    ),
    Rule(
        "VllmKvCacheFragmented", "warning", "vllm",
        "Much of a vLLM server's KV cache in use holds no token.",
        "{server} ({model}): an estimated {share} of the KV slots in use were empty over {window}{approx} — block size "
        "{block}, {running} running requests, ≈ {slots} slots per running sequence, {mix}.",
        (f"{V}.kv_fragmentation_ratio", f"{V}.kv_block_size", f"{V}.running", f"{V}.kv_blocks_used",
         f"{V}.prompt_tokens_per_second", f"{V}.generation_tokens_per_second"),
        _fragmented,
        _fragmented_twin,
        Runbook(
            "vLLM gives each sequence whole KV blocks; the last one is partly empty, (B − 1)/2 slots on average. With "
            "many short sequences or a large block size that waste becomes a large share of the cache, and fewer "
            "requests fit (estimate: docs/vllm.md; approximate for hybrid models).",
            "`curl <server>/metrics | grep -e cache_config_info -e num_requests_running -e kv_cache_usage`.",
            "Use a smaller --block-size (16 is vLLM's default on GPUs); enable prefix caching for shared prompts.",
        ),
        every_seconds=60.0,
    ),
    Rule(
        "VllmKvCacheStuckHigh", "warning", "vllm",
        "A vLLM server's KV cache stays full with nothing running.",
        "KV usage of {server} stayed at {usage} or more for {window} with no request running or waiting.",
        (f"{V}.kv_cache_usage_ratio", f"{V}.running", f"{V}.waiting"),
        _stuck_high,
        _stuck_high_twin,
        Runbook(
            "Blocks stay allocated with no request to own them: leaked blocks (a scheduler bug, aborted requests not "
            "freed). New requests will be preempted or wait. (An idle engine's gauges freeze, FACTS §5: check the "
            "gauges_stale flag before acting.)",
            "`curl <server>/metrics | grep -e kv_cache_usage -e num_requests`; the server's log for aborted requests.",
            "Restart the server at a quiet moment; report it with the vLLM version.",
        ),
        every_seconds=60.0,
    ),
    Rule(
        "VllmRequestsQueuedUnderused", "warning", "vllm",
        "Requests wait on a vLLM server while its batch runs far below capacity.",
        "{server}: {waiting} or more requests waited throughout {window} while KV usage never exceeded {usage} "
        "({running} running on average).",
        (f"{V}.waiting", f"{V}.kv_cache_usage_ratio", f"{V}.running"),
        _queued_underused,
        _queued_twin,
        Runbook(
            "Requests queue although the KV cache has room: the batch is capped elsewhere — --max-num-seqs, "
            "--max-num-batched-tokens, a LoRA slot limit — or the scheduler is stuck. (From 0.20 'waiting' counts "
            "deferred requests too, FACTS §5.)",
            "The server's flags (max-num-seqs, max-num-batched-tokens); `curl <server>/metrics | grep num_requests`.",
            "Raise the cap that binds, or add replicas; if nothing binds, treat it as a hang.",
        ),
        every_seconds=60.0,
    ),
)
