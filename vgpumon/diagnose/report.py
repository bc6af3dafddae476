"""``build_report``: the on-call report of one host from the store (pure data; no printing).

The report answers, in this order: the verdict and its top reasons (naming GPUs); the findings,
most severe first, each with its GPU, evidence, since when, meaning and next step (XIDs with our
table's meaning and action per code and every event time); per GPU the window's figures and
health per area; the vLLM servers and the GPUs they hold; the processes holding most GPU memory;
the trends (memory, PCIe p95); how fresh each source is. ``vgpumon.diagnose.render`` prints it; ``--json``
prints it as it is; the agent's ``/api/v1/diagnose`` serves it. Decisions: docs/diagnose.md.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from vgpumon.base.errors import ExitCode
from vgpumon.base.fmt import clock, duration, iso
from vgpumon.config import default_hostname
from vgpumon.diagnose.findings import (
    GPU_SUBJECTS,
    XID_RULES,
    from_alert,
    order,
    own,
    unreadable_now,
    verdict,
)
from vgpumon.diagnose.schema import (
    AlertEpisode,
    AlertRecord,
    Earlier,
    Evaluation,
    Finding,
    Report,
    RuleUnknown,
    Status,
    XidEntry,
    XidEventEntry,
)

if TYPE_CHECKING:
    from vgpumon.config.thresholds import Thresholds
    from vgpumon.model import Alert, HostEvent
    from vgpumon.store import Store, StoredGpu

SEVERITY_EXIT: dict[Status, ExitCode] = {"ok": ExitCode.OK, "warning": ExitCode.WARNING, "critical": ExitCode.CRITICAL, "unknown": ExitCode.UNKNOWN}
_DEVICE_SET_EVENTS = ("gpu_unidentified", "gpu_appeared")
#: A stored episode of an alert counts as the same episode when it resolved at most this long
#: before the report's end (the agent evaluates every 5–60 s of data time, behind the newest tick).
_EPISODE_SLACK_S = 120.0


def resolve_host(host: str, local: str | None = None) -> str:
    """Map the ``host`` argument to a stored host name: ``localhost`` → the name this machine's
    agent stores under (``local``: the ``agent.hostname`` setting; ``None``: the system host
    name)."""
    return (local or default_hostname()) if host in {"localhost", "127.0.0.1", "::1"} else host


def parse_since(text: str) -> tuple[float | None, float | None]:
    """``--since``: a duration back from the host's newest sample (``2h``, ``3d``) or a moment
    (ISO 8601, ``2026-11-30T01:00``, UTC unless it says otherwise).

    Returns:
        ``(lookback_seconds, None)`` or ``(None, epoch_seconds)``.

    Raises:
        ValueError: neither (the message gives examples).
    """
    import datetime as dt

    from vgpumon.config import parse_duration

    try:
        return parse_duration(text), None
    except ValueError:
        pass
    try:
        moment = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is neither a duration nor a time (e.g. 6h, 3d, 2026-11-30T01:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return None, moment.timestamp()


def unknown_report(host: str, message: str | None = None) -> Report:
    """A report with status ``unknown`` (no data, store or agent unreachable), optionally with a
    finding that says why."""
    findings = [own("unknown", message, kind="no_data")] if message else []
    return {
        "host": host, "status": "unknown", "verdict": verdict(findings), "window": None, "gpus": [],
        "findings": findings, "vllm": [], "processes": [], "trends": None, "freshness": None, "alerts": [],
        "alert_history": [], "xids": [], "rules_unknown": [],
    }


def exit_code(report: Report) -> ExitCode:
    """Exit code for a report's status (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN)."""
    return SEVERITY_EXIT[report["status"]]


def _finish(report: Report, window: tuple[float, float] | None = None) -> Report:
    """Order the findings and judge them; ``window`` (start, end): the stored episodes that
    overlapped it go into the verdict too."""
    report["findings"] = order(report["findings"])
    report["verdict"] = verdict(report["findings"])
    report["status"] = report["verdict"]["status"]
    report["verdict"]["earlier"] = [] if window is None else _earlier_in_window(report, *window)
    return report


def alert_record(a: Alert) -> AlertRecord:
    """An alert as the report carries it: ``Alert.as_dict``'s keys, in its order (a test holds the
    two together)."""
    return {
        "name": a.name,
        "severity": a.severity,
        "state": a.state,
        "labels": dict(a.labels),
        "summary": a.summary,
        "description": a.description,
        "runbook_url": a.runbook_url,
        "value": a.value,
        "active_since": a.active_since,
        "fired_at": a.fired_at,
        "resolved_at": a.resolved_at,
        "fingerprint": a.fingerprint,
    }


def _stored_episodes(episodes: list[Alert], open_now: list[Alert], by_uuid: dict[str, StoredGpu], end: float) -> list[AlertEpisode]:
    """The agent's stored episodes that fired in the look-back and are not among the alerts open
    at the window's end: resolved ones, and ones still open at the agent's last evaluation (the
    agent stopped while they fired, or has not evaluated since); oldest first, each once.

    The stored lifecycle is what paged: a report must not forget an episode because its own
    evaluation at the window's end no longer sees it."""
    current = {a.fingerprint for a in open_now}
    seen: set[int | tuple[str, float]] = set()
    out: list[AlertEpisode] = []
    for a in sorted(episodes, key=lambda a: (a.active_since, a.id or 0)):
        key = a.id if a.id is not None else (a.fingerprint, a.active_since)
        if key in seen or a.fired_at is None or a.fired_at > end:
            continue
        seen.add(key)
        still_open = a.resolved_at is None
        if a.fingerprint in current and (a.resolved_at is None or a.resolved_at >= end - _EPISODE_SLACK_S):
            continue  # the same episode as an alert open now: a finding, not history
        gpu = by_uuid[a.labels["uuid"]].identity.index if a.labels.get("uuid") in by_uuid else None
        out.append({**alert_record(a), "gpu": gpu, "open_at_last_evaluation": still_open,
                    "last_evaluated_at": a.last_eval if still_open else None})
    return out


def _evaluation(rows: int, last_eval: float | None) -> Evaluation:
    """Whose verdicts these are (docs/diagnose.md, "Whose verdicts"): with the agent's alert rows
    the stored lifecycle gives the alerts their start and the episodes that paged; without any, no
    agent evaluated and diagnose's own evaluation of the stored window is all there is."""
    if rows:
        return {"by": "agent", "alert_rows": rows, "agent_last_evaluation": iso(last_eval) if last_eval is not None else None,
                "note": "the agent's stored alert lifecycle (episodes, their start, open at its last evaluation)"}
    return {"by": "diagnose", "alert_rows": 0, "agent_last_evaluation": None,
            "note": "diagnose's own evaluation of the stored window: no agent evaluated "
                    "(the store holds no alert rows for this host)"}


def _earlier_in_window(report: Report, start: float, end: float) -> list[Earlier]:
    """Episodes of the stored history that overlapped the window (not only the look-back): the
    headline names them, so that it never says "nothing to act on" about a window that held an
    alert. The status (and the exit code) keeps judging the window's end."""
    # every stored episode fired (``_stored_episodes`` keeps only those)
    return [
        {"name": a["name"], "severity": a["severity"], "gpu": a["gpu"], "fired_at": fired,
         "resolved_at": a["resolved_at"], "open_at_last_evaluation": a["open_at_last_evaluation"]}
        for a in report["alert_history"]
        if (fired := a["fired_at"]) is not None and fired <= end and (a["resolved_at"] is None or a["resolved_at"] >= start)
    ]


def build_report(
    store: Store,
    host: str,
    *,
    window_seconds: float = 900.0,
    now: float | None = None,
    max_age_seconds: float | None = None,
    local_hostname: str | None = None,
    thresholds: Thresholds | None = None,
    since: float | None = None,
    lookback_seconds: float | None = None,
) -> Report:
    """Build the diagnose report of one host from the store.

    Args:
        store: an open store.
        host: host name as stored; ``localhost`` means this machine.
        window_seconds: length of the window that ends at the host's newest stored sample: the
            per-GPU figures cover it.
        now: current time (epoch seconds) for the data's age; ``time.time()`` when ``None``.
        max_age_seconds: when set, a newest sample older than this is stale: the report says so
            and is UNKNOWN unless a WARNING or CRITICAL is known (the last known findings stay,
            with their age); ``None`` reports on whatever the store holds (replays, post-mortems).
        local_hostname: the name ``localhost`` stands for (``resolve_host``).
        thresholds: the rules' ``vgpumon.config.thresholds.Thresholds`` (defaults when ``None``).
        since: start of the look-back (epoch seconds): XID events, alerts that fired and
            resolved, and the trends reach back to it; ``None`` (or later than the window's start)
            looks back over the window.
        lookback_seconds: the same as a length back from the newest sample (``--since 6h``).

    Returns:
        The ``Report`` (``vgpumon.diagnose.schema``; JSON as it is; keys in docs/diagnose.md): ``host``, ``status`` (``ok``, ``warning``,
        ``critical``, ``unknown``), ``verdict`` (status, counts, top reasons), ``findings`` (most
        severe first), ``window``, ``lookback``, ``freshness``, ``gpus``, ``vllm``,
        ``processes``, ``trends``, ``xids``, ``alerts`` (pending and firing), ``alert_history``
        (fired and resolved in the look-back), ``rules_unknown``. Values in base units, ``None``
        where unknown with the reason beside it.

    Raises:
        StoreUnavailableError: the store cannot be read.
    """
    from vgpumon.config.thresholds import Thresholds
    from vgpumon.diagnose import context
    from vgpumon.diagnose.gpus import LAST_COLUMNS, WINDOW_COLUMNS, gpu_block, health
    from vgpumon.diagnose.windows import window_aggregates

    now = time.time() if now is None else now
    th = thresholds or Thresholds()
    hostname = resolve_host(host, local_hostname)
    report = unknown_report(hostname)
    known = store.hostnames()  # also checks that the store holds vgpumon tables
    gpus = store.gpus_of(hostname) if hostname in known else []
    if not gpus:
        hint = f"; hosts in the store: {', '.join(known)}" if known else "; the store is empty"
        report["findings"].append(own("unknown", f"host {hostname!r} not in the store{hint}", kind="no_data"))
        return _finish(report)
    ids = [g.id for g in gpus]
    end = store.newest_ts(ids)
    from_rollups = end is None
    if end is None:
        # the raw rows have expired (raw retention) but the 1-minute rollups are kept: the
        # window ends at the newest rollup's last moment, and its figures come from the rollups
        newest_minute = store.newest_rollup_ts(ids)
        if newest_minute is None:
            report["findings"].append(own("unknown", "no samples stored for this host", kind="no_data"))
            return _finish(report)
        end = newest_minute + ROLLUP_MINUTE_S - 0.001
    start = end - window_seconds
    look = min(start, since if since is not None else start, end - lookback_seconds if lookback_seconds else start)
    report["window"] = {"start": iso(start), "end": iso(end), "seconds": window_seconds}
    report["lookback"] = {"start": iso(look), "end": iso(end), "seconds": end - look}
    report["newest_sample_age_seconds"] = max(0.0, now - end)
    findings: list[Finding] = report["findings"]
    by_uuid = {g.identity.uuid: g for g in gpus}
    index_of = {g.identity.uuid: g.identity.index for g in gpus}

    # -- the rules, at the window's end, through the agent's lifecycle ---------------------------
    from vgpumon.rules.catalogue import BY_NAME
    from vgpumon.rules.core import is_not_applicable
    from vgpumon.rules.engine import Engine
    from vgpumon.rules.gpu import CRITICAL_XIDS, WARNING_XIDS, down_reasons
    from vgpumon.rules.source import CANNOT_JUDGE
    from vgpumon.rules.view import HostView
    from vgpumon.store.alerts import AlertRepository

    engine = Engine(th)
    at_end, book = engine.evaluate_window(store, hostname, end)
    view = HostView(store, hostname, end)
    down = view.down_since()
    reasons = down_reasons(view, th) if down else {}
    repo = AlertRepository(store.engine)
    # VgpumonRuleCannotJudge says what rules_unknown and each GPU's rules_unknown list in full
    # (which rule, which subject, why): as an alert it would only repeat them
    episodes = [a for a in (*repo.history(hostname, look, end), *repo.open_alerts(hostname)) if a.name != CANNOT_JUDGE]
    stored_since = {a.fingerprint: a.active_since for a in episodes
                    if a.active_since <= end and (a.resolved_at is None or a.resolved_at >= end - _EPISODE_SLACK_S)}
    xid_lookback = min(look, end - th.xid_window_seconds)
    xid_events = store.host_xid_events(hostname, xid_lookback, end)
    codes_of = {"GpuXidCritical": set(CRITICAL_XIDS), "GpuXidWarning": set(WARNING_XIDS)}

    def xid_times(rule: str, gpu_id: int) -> dict[int, list[float]]:
        out: dict[int, list[float]] = {}
        wanted = codes_of.get(rule)
        for ts, gid, code in xid_events:
            if gid != gpu_id:
                continue
            if (wanted is not None and code in wanted) or (wanted is None and code not in CRITICAL_XIDS + WARNING_XIDS):
                out.setdefault(code, []).append(ts)
        return out

    open_alerts = [a for a in book.open() if a.name != CANNOT_JUDGE]
    states: dict[str, dict[str, str]] = {u: {} for u in by_uuid}
    severities = {r.name: r.severity for r in engine.rules}
    unknown_reasons: dict[str, dict[str, str]] = {u: {} for u in by_uuid}
    # a rule whose input this host simply does not have (no GPM, no ECC) does not apply: said as
    # such, apart from the rules that cannot judge (docs/rules.md, "Cannot judge, or not applicable")
    not_applicable: dict[str, dict[str, str]] = {u: {} for u in by_uuid}
    report["rules_unknown"] = []
    host_not_applicable: list[RuleUnknown] = []
    for f in at_end:
        gpu = by_uuid.get(f.labels.get("uuid", "")) if BY_NAME[f.rule].subject in GPU_SUBJECTS else None
        na = f.state == "unknown" and is_not_applicable(f.reason)
        if gpu is not None:
            states[gpu.identity.uuid].setdefault(f.rule, "n/a" if na else "pending" if f.state == "firing" else f.state)
            if na:
                not_applicable[gpu.identity.uuid][f.rule] = f.reason or "not applicable"
            elif f.state == "unknown":
                unknown_reasons[gpu.identity.uuid][f.rule] = f.reason or "inputs absent"
        elif na:
            host_not_applicable.append({"rule": f.rule, "labels": f.labels, "reason": f.reason})
        elif f.state == "unknown":
            report["rules_unknown"].append({"rule": f.rule, "labels": f.labels, "reason": f.reason})
    if host_not_applicable:
        report["rules_not_applicable"] = host_not_applicable
    lost_firing: set[int] = set()
    for a in open_alerts:
        rule = BY_NAME[a.name]
        gpu = by_uuid.get(a.labels.get("uuid", "")) if rule.subject in GPU_SUBJECTS else None
        if gpu is not None:
            states[gpu.identity.uuid][a.name] = a.state
            if a.name == "GpuLost" and a.state == "firing":
                lost_firing.add(gpu.id)
        findings.append(from_alert(
            a, rule, gpu.identity if gpu is not None else None,
            stored_since=stored_since.get(a.fingerprint),
            xid_times=xid_times(a.name, gpu.id) if gpu is not None and a.name in XID_RULES else None,
            down_since=down.get(gpu.id) if gpu is not None else None,
        ))
    report["alerts"] = [alert_record(a) for a in open_alerts]
    report["alert_history"] = _stored_episodes(episodes, open_alerts, by_uuid, end)
    report["evaluation"] = _evaluation(*repo.evaluated(hostname))

    # -- diagnose's own observations ---------------------------------------------------------------
    for g in gpus:
        if g.id in down and g.id not in lost_firing:
            findings.append(unreadable_now(g.identity, down[g.id], reasons.get(g.id, "unreadable"), end))
    findings.extend(_unidentified(store.events(hostname, 0, end, kinds=_DEVICE_SET_EVENTS)))
    topology = store.topology(hostname)
    # one window query for all GPUs: a tick's rows share pages, so per-GPU queries would read
    # every page once per GPU (docs/benchmarks.md, store section)
    # a long window reads its whole minutes from the rollups (vgpumon.diagnose.windows)
    aggs = rollup_aggregates(store, ids, start, end, WINDOW_COLUMNS) if from_rollups else window_aggregates(store, ids, start, end, WINDOW_COLUMNS)
    if from_rollups:
        findings.append(own(
            "info", "the raw samples of this window have expired (raw retention); its figures are from the 1-minute rollups, "
            "and the rules that read raw samples could not judge it", since=start, kind="from_rollups",
        ))
    rejected = store.rejections(hostname, start, end)
    lasts = {g.id: view.last_values(g.id, LAST_COLUMNS) for g in gpus}
    blocks = []
    for g in gpus:
        u = g.identity.uuid
        xid_counts: dict[str, int] = {}
        for ts, gid, code in xid_events:
            if gid == g.id and ts >= start:
                xid_counts[str(code)] = xid_counts.get(str(code), 0) + 1
        st = states[u]
        if g.id in down and g.id not in lost_firing:
            st = {**st, "GpuLost": "pending"}  # unreadable now, not yet lost: WARN, not PASS
        block = gpu_block(store, g, start, end, aggs[g.id], topology=topology, index_of=index_of,
                          rejected=rejected.get(f"gpu:{u}"), down=(down[g.id], reasons.get(g.id, "unreadable")) if g.id in down else None,
                          last=lasts[g.id], xid_counts=xid_counts, rules_unknown=unknown_reasons[u],
                          rules_not_applicable=not_applicable[u],
                          areas=health(st, severities, {**not_applicable[u], **unknown_reasons[u]},
                                       down=None if g.id not in down else "GPU lost" if g.id in lost_firing else "GPU unreadable"))
        if not block["samples"]:
            findings.append(own("unknown", f"no samples in the window ({duration(window_seconds)})", gpu=g.identity, kind="no_samples"))
        for field, (count, reason) in sorted((rejected.get(f"gpu:{u}") or {}).items()):
            # information, never a verdict: the value was refused, so nothing was concluded from it
            findings.append(own("info", f"{field}: reported impossible values {count} times in the window ({reason})",
                                gpu=g.identity, kind="rejected_values"))
        blocks.append(block)
    report["gpus"] = blocks

    # -- around the GPUs ---------------------------------------------------------------------------
    report["vllm"] = context.servers(store, hostname, look, end, index_of, th)
    # the part of a PCIe finding's traffic that vLLM's KV offload moved (docs/vllm.md)
    from vgpumon.diagnose.signals import attribute_kv_offload
    from vgpumon.store import kv_offload

    attribute_kv_offload(findings, blocks, kv_offload.by_gpu(store.engine, hostname, start, end), topology.shared())
    report["processes"] = context.processes(store, gpus, start, end)
    report["trends"] = context.trends(store, gpus, look, end)
    report["xids"] = _xid_section(xid_events, {g.id: g.identity.index for g in gpus}, look)
    fresh = context.freshness(store, hostname, gpus, end, now, report["vllm"], max_age_seconds)
    report["freshness"] = fresh
    if fresh["stale"]:
        findings.append(own(
            "unknown",
            f"newest sample is {duration(fresh['age_seconds'])} old (more than {duration(max_age_seconds)}): is the agent running? "
            f"The findings are the last known, as of {clock(end)} UTC",
            since=end, kind="stale",
            next_step="Check the agent on the host (systemctl status vgpumon-agent, or its pod); the store keeps the last data it wrote.",
        ))
    _finish(report, (start, end))
    for b in blocks:
        b["findings"] = [f for f in report["findings"] if (ref := f["gpu"]) is not None and ref["uuid"] == b["uuid"]]
    return report


#: The length of a rollup row (``gpu_samples_1m``).
ROLLUP_MINUTE_S = 60.0


def rollup_aggregates(store: Store, ids: list[int], start: float, end: float, columns: tuple[str, ...]) -> dict[int, dict[str, Any]]:
    """``Store.window_aggregates_many``'s mean and max of ``columns`` over the window, from the
    1-minute rollups (for a window whose raw rows have expired): each minute's mean weighted by
    its samples, the largest minute maximum; ``samples`` and ``up_samples`` summed."""
    wanted = ["up_samples", *(f"{c}_{a}" for c in columns for a in ("mean", "max"))]
    rows = store.rollup_series_many(ids, start - ROLLUP_MINUTE_S, end, wanted)
    out: dict[int, dict[str, Any]] = {}
    for gid in ids:
        minutes = [r for r in rows.get(gid, []) if r["ts"] + ROLLUP_MINUTE_S > start]
        agg: dict[str, Any] = {"samples": sum(int(r["samples"] or 0) for r in minutes),
                               "up_samples": sum(int(r["up_samples"] or 0) for r in minutes)}
        for c in columns:
            means = [(r[f"{c}_mean"], int(r["samples"] or 0)) for r in minutes if r[f"{c}_mean"] is not None]
            weight = sum(n for _, n in means)
            agg[f"{c}_mean"] = sum(v * n for v, n in means) / weight if weight else None
            maxima = [r[f"{c}_max"] for r in minutes if r[f"{c}_max"] is not None]
            agg[f"{c}_max"] = max(maxima) if maxima else None
        out[gid] = agg
    return out


def _xid_section(events: list[tuple[float, int, int]], index_of: dict[int, int], since: float) -> list[XidEntry]:
    """Every XID of the look-back, per code: our table's meaning and action, and each event (GPU,
    time), oldest first."""
    from vgpumon.catalogue.xid import describe

    by_code: dict[int, list[XidEventEntry]] = {}
    for ts, gid, code in events:
        if ts >= since:
            by_code.setdefault(code, []).append({"gpu": index_of.get(gid), "at": iso(ts), "ts": ts})
    out: list[XidEntry] = []
    for code, evs in sorted(by_code.items()):
        x = describe(code)
        out.append({"code": code, "mnemonic": x.mnemonic, "meaning": x.meaning, "bucket": x.bucket, "action": x.action,
                    "by_application": x.by_application, "events": evs})
    return out


def _unidentified(events: list[HostEvent]) -> list[Finding]:
    """A device NVML counts but cannot name (no UUID: it has no history, so no rule sees it) and
    that has not been named since: the host has a GPU it cannot report on. A GPU that was named
    and went is the GpuMissing rule's."""
    open_: dict[str, HostEvent] = {}
    for e in events:  # oldest first
        if e.kind == "gpu_appeared":
            index = e.detail.split(",", 1)[0].removeprefix("index ").strip()
            open_.pop(f"index:{index}", None)
        else:
            open_[e.subject] = e
    return [
        own("warning", f"{subject} cannot be identified since {iso(e.ts)} ({e.detail})", since=e.ts, kind="unidentified",
            next_step="Run `nvidia-smi -L` and `journalctl -k | grep -i NVRM` on the host; a GPU NVML cannot name is not monitored.")
        for subject, e in open_.items()
    ]
