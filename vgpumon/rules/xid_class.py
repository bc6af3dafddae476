"""XID classes over time: what the pattern of a code's events points at.

* **The hardware** (``GpuXidRepeated``): the same XID on one GPU in ``xid_repeat_windows`` (2)
  windows of ``xid_burst_seconds`` (3 min, NVIDIA NVSentinel's burst window) or more within ``xid_repeat_lookback_seconds`` (24 h),
  each time *alone* on the host. The GPU, not what runs on it, is the common factor: drain it and
  run the vendor's diagnostics.
* **The workload or the driver** (``HostXidSpread``): the same XID on ``xid_spread_gpus`` (2) GPUs
  of the host or more within one window, in the last ``xid_window_seconds`` (10 min). One job
  spread over the GPUs, or the driver, is the common factor, not one board; such windows do not
  count towards a GPU's repeats.

A burst (a driver logs the same code many times within seconds, a job restarted in a loop) is
counted once per window: windows are fixed, ``xid_burst_seconds`` long and aligned to multiples of
it in Unix time, as Prometheus aligns a subquery's steps, so that the twins count the same windows.
The native check also counts the window in progress; the twin sees it when it closes (at most
``xid_burst_seconds`` later). Decisions and figures: docs/rules.md, "XID classes".
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable

from vgpumon.base.fmt import clock
from vgpumon.config.thresholds import Thresholds
from vgpumon.rules.core import Finding, Rule, Runbook, Twin, by, duration, gpu_labels, prom, prom_duration
from vgpumon.rules.gpu import XID_MEANINGS
from vgpumon.rules.view import HostView

_Key = tuple[int, int]  # (xid, window end)


def _windows(view: HostView, th: Thresholds, lookback: float) -> tuple[dict[_Key, set[int]], dict[tuple[int, int, int], int]]:
    """The XID windows of the look-back: (xid, window end) → the GPUs (ids) it came from, and
    (xid, window end, gpu id) → how many events (the burst counted once)."""
    step = th.xid_burst_seconds
    gpus: dict[_Key, set[int]] = defaultdict(set)
    events: dict[tuple[int, int, int], int] = defaultdict(int)
    for ts, gpu_id, xid in view.xids(lookback):
        end = int(math.ceil(ts / step) * step)
        gpus[(xid, end)].add(gpu_id)
        events[(xid, end, gpu_id)] += 1
    return gpus, events


def _meaning(xid: int) -> str:
    return f"XID {xid} ({XID_MEANINGS.get(xid, 'see the Xid catalog')})"


def _repeated(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    lookback = th.xid_repeat_lookback_seconds
    windows, events = _windows(view, th, lookback)
    spread = int(th.xid_spread_gpus)
    lone: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))  # gpu → xid → window ends
    for (xid, end), ids in sorted(windows.items()):
        if len(ids) < spread:
            for gid in ids:
                lone[gid][xid].append(end)
    agg = view.window(lookback, ("up",), ("count",))
    need, step = int(th.xid_repeat_windows), th.xid_burst_seconds
    for g in view.gpus:
        labels = gpu_labels(view.hostname, g.identity.index, g.identity.uuid)
        found = {x: ends for x, ends in lone.get(g.id, {}).items() if len(ends) >= need}
        if found:
            words = "; ".join(
                f"{_meaning(x)} in {len(ends)} windows of {duration(step)}, alone on the host each time "
                f"({sum(events[(x, e, g.id)] for e in ends)} events; windows ending {', '.join(clock(e) for e in ends)} UTC)"
                for x, ends in sorted(found.items()))
            yield Finding(rule.name, labels, "firing", float(max(len(e) for e in found.values())),
                          {"xids": words, "lookback": duration(lookback)})
        elif not agg[g.id]["samples"]:
            yield Finding(rule.name, labels, "unknown", reason=f"no samples in the last {duration(lookback)}")
        else:
            yield Finding(rule.name, labels, "ok", float(max((len(e) for e in lone.get(g.id, {}).values()), default=0)),
                          {"lookback": duration(lookback)})


def _spread(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    window = th.xid_window_seconds
    windows, events = _windows(view, th, window)
    need, step = int(th.xid_spread_gpus), th.xid_burst_seconds
    index = {g.id: g.identity.index for g in view.gpus}
    found = sorted(((xid, end), ids) for (xid, end), ids in windows.items() if len(ids) >= need)
    labels = {"hostname": view.hostname}
    if found:
        words = "; ".join(
            f"{_meaning(xid)} on GPUs {', '.join(str(index.get(i, '?')) for i in sorted(ids, key=lambda i: index.get(i, -1)))} "
            f"within the {duration(step)} ending {clock(end)} UTC ({sum(events[(xid, end, i)] for i in ids)} events)"
            for (xid, end), ids in found)
        yield Finding(rule.name, labels, "firing", float(max(len(ids) for _, ids in found)),
                      {"xids": words, "window": duration(window)})
        return
    agg = view.window(window, ("up",), ("count",))
    if not any(agg[g.id]["samples"] for g in view.gpus):
        yield Finding(rule.name, labels, "unknown", reason=f"no GPU samples in the last {duration(window)}")
        return
    yield Finding(rule.name, labels, "ok", float(max((len(ids) for ids in windows.values()), default=0)),
                  {"window": duration(window)})


def _in_window(th: Thresholds) -> str:
    """Per GPU and code: 1 in a window in which the code's counter rose (a series born in the
    window, at its first event, counts too: ``increase`` misses that first event)."""
    x, w = prom("xid_events", "xid"), prom_duration(th.xid_burst_seconds)
    return f"((increase({x}[{w}]) > 0) or (({x} unless {x} offset {w}) > 0))"


def _repeated_twin(th: Thresholds) -> list[Twin]:
    a, w = _in_window(th), prom_duration(th.xid_burst_seconds)
    lone = f"({a} unless on (hostname, xid) (count by (hostname, xid) ({a}) >= {int(th.xid_spread_gpus)}))"
    expr = (f"max {by('gpu')} (count_over_time({lone}[{prom_duration(th.xid_repeat_lookback_seconds)}:{w}]))"
            f" >= {int(th.xid_repeat_windows)}")
    return [Twin(expr, "An XID repeated on GPU {{ $labels.gpu }} of {{ $labels.hostname }} in {{ $value }} windows of "
                 + w + " within " + prom_duration(th.xid_repeat_lookback_seconds)
                 + ", alone on the host each time: the hardware is suspect.")]


def _spread_twin(th: Thresholds) -> list[Twin]:
    a, w = _in_window(th), prom_duration(th.xid_burst_seconds)
    expr = (f"max by (hostname) (max_over_time((count by (hostname, xid) ({a}))[{prom_duration(th.xid_window_seconds)}:{w}]))"
            f" >= {int(th.xid_spread_gpus)}")
    return [Twin(expr, "The same XID on {{ $value }} GPUs of {{ $labels.hostname }} within " + w
                 + ": the workload or the driver, not one board.")]


RULES: tuple[Rule, ...] = (
    Rule(
        "GpuXidRepeated", "warning", "gpu",
        "The same XID keeps coming back on one GPU, and only on it: the hardware is suspect.",
        "{xids}, within the last {lookback}.",
        ("xid_events.xid",),
        _repeated,
        _repeated_twin,
        Runbook(
            "One GPU raised the same XID in two or more 3-minute windows within 24 h while no other GPU of the host raised "
            "it in those windows (a burst of the same code counts once per window). The board is the common factor, "
            "not the job (which moves between GPUs) nor the driver (which every GPU shares): NVIDIA's guidance for a code "
            "that repeats on one GPU is to take it out of service and run its diagnostics.",
            "`vgpumon diagnose <host>` lists each event with its time; `journalctl -k | grep -i xid` shows the driver's "
            "text and the process it blamed; check whether the same job ran on that GPU each time (if it only ever runs "
            "there, hand it to its owners first).",
            "Drain the GPU; run `dcgmi diag -r 3 -i <gpu>` (or the vendor's field diagnostics); if it fails or the XID "
            "repeats after a reset, open a hardware case with the diagnostics log.",
        ),
        every_seconds=60.0,
    ),
    Rule(
        "HostXidSpread", "warning", "host",
        "The same XID on several GPUs of a host within minutes: the workload or the driver, not one board.",
        "{xids}, in the last {window}.",
        ("xid_events.xid",),
        _spread,
        _spread_twin,
        Runbook(
            "Two or more GPUs of the host raised the same XID within one 3-minute window. A fault of one board does not "
            "spread to its siblings; a multi-GPU job with a bad kernel, a collective gone wrong, or a driver problem does. "
            "These windows do not count towards `GpuXidRepeated`.",
            "`vgpumon diagnose <host>` lists the events by GPU and time; `journalctl -k | grep -i xid` names the processes "
            "the driver blamed (one job across the GPUs: the workload); the driver version against NVIDIA's release notes.",
            "Hand the job to its owners with the XIDs and times; if no one job explains it, or it follows a driver update, "
            "roll the driver back or open a case with NVIDIA (`nvidia-bug-report.sh`). Do not drain the boards one by one.",
        ),
        every_seconds=60.0,
    ),
)
