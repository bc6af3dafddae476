"""Findings of the on-call report: the rule engine's alerts and diagnose's own observations, each
with its GPU, evidence, since when, what it means and the next step, most severe first; and the
verdict made of them (pure data).

A finding is a ``Finding`` (``vgpumon.diagnose.schema``: a TypedDict, JSON as it is). Where it
comes from:

* **Rules** (``Engine.evaluate_window``): each pending or firing alert. Meaning and next step are
  the first sentence of its runbook's meaning and action (``<gpu>`` filled in); an XID alert
  carries, per code, our table's meaning and action (``vgpumon.catalogue.xid``) and every event
  time in the report's look-back.
* **Diagnose's own**: a GPU unreadable now that ``GpuLost`` does not (yet) cover, a device NVML
  counts but cannot name, a GPU without samples, values refused at the door (information), data
  older than ``--max-age``.

*Since when*: the evidence's own time where there is one (the first XID event, the first
unreadable tick); else the agent's stored episode of the same alert (its ``active_since``, when
the agent first found the condition); else the earliest evaluation of the report's own lifecycle
that found it — "at least since", ``since_exact`` false.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from vgpumon.base.fmt import clock, duration, iso
from vgpumon.catalogue.xid import describe as describe_xid
from vgpumon.diagnose.schema import Finding, FindingXid, GpuRef, Status, Verdict

if TYPE_CHECKING:
    from vgpumon.model import Alert, GpuIdentity
    from vgpumon.rules.core import Rule

#: Severities from the worst; ``unknown`` ranks under ``warning``: a known problem is reported even
#: when part of the data cannot be read (docs/diagnose.md, "Freshness").
SEVERITY_RANK = {"critical": 4, "warning": 3, "unknown": 2, "info": 1, "ok": 0}
#: The statuses a verdict can take above ``ok``, worst first.
_WORST_FIRST: tuple[Status, ...] = ("critical", "warning", "unknown")
#: Subjects whose alerts belong to one GPU.
GPU_SUBJECTS = ("gpu", "gpu_process")
XID_RULES = ("GpuXidCritical", "GpuXidWarning", "GpuXidOther")

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`])")


def first_sentence(text: str) -> str:
    """The first sentence of a runbook paragraph (a full stop inside backticks does not end it)."""
    return _SENTENCE_END.split(text.strip(), maxsplit=1)[0]


def gpu_ref(identity: GpuIdentity) -> GpuRef:
    """A finding's GPU: index, UUID, serial, bus id and name (``None`` where not reported)."""
    return {
        "index": identity.index,
        "uuid": identity.uuid,
        "serial": identity.serial,
        "pci_bus_id": identity.pci_bus_id,
        "name": identity.name,
    }


def _xid_table(codes: Mapping[int, list[float]]) -> list[FindingXid]:
    out: list[FindingXid] = []
    for code, times in sorted(codes.items()):
        x = describe_xid(code)
        out.append({
            "code": code, "mnemonic": x.mnemonic, "meaning": x.meaning, "bucket": x.bucket, "action": x.action,
            "by_application": x.by_application, "count": len(times), "times": [iso(t) for t in times],
            "first_ts": min(times), "last_ts": max(times),
        })
    return out


def from_alert(
    alert: Alert,
    rule: Rule,
    gpu: GpuIdentity | None,
    *,
    stored_since: float | None = None,
    xid_times: Mapping[int, list[float]] | None = None,
    down_since: float | None = None,
) -> Finding:
    """A report finding of one pending or firing alert.

    Args:
        alert: the ``Alert`` (diagnose's own lifecycle at the window's end).
        rule: its ``Rule`` (runbook, summary).
        gpu: the GPU's ``GpuIdentity`` for GPU subjects, else ``None``.
        stored_since: ``active_since`` of the agent's stored episode of the same alert.
        xid_times: for XID rules, code → event times of this GPU (in the look-back).
        down_since: for ``GpuLost``, when the GPU became unreadable.
    """
    firing = alert.state == "firing"
    index = str(gpu.index) if gpu is not None else "<gpu>"
    xids = None
    since, exact = alert.active_since, False
    if stored_since is not None:
        since, exact = stored_since, True
    # the evidence's own time beats any evaluation's (the agent evaluates every 5-60 s, behind)
    if rule.name in XID_RULES and xid_times:
        xids = _xid_table(xid_times)
        since, exact = min(x["first_ts"] for x in xids), True
    if rule.name == "GpuLost" and down_since is not None:
        since, exact = down_since, True
    meaning = first_sentence(rule.runbook.meaning)
    next_step = first_sentence(rule.runbook.action).replace("<gpu>", index)
    headline = alert.description
    if xids:
        # the codes speak for themselves: meaning and action per code, from the XID table
        worst = xids[0] if len(xids) == 1 else next((x for x in xids if not x["by_application"]), xids[0])
        headline = "; ".join(f"XID {x['code']} ({x['meaning']}) at {clock(x['last_ts'])}" + (f" ×{x['count']}" if x["count"] > 1 else "")
                             for x in xids)
        meaning = "; ".join(f"XID {x['code']}: {x['meaning']}" for x in xids)
        next_step = worst["action"].replace("<gpu>", index)
    return {
        "severity": alert.severity if firing else "info",
        "state": alert.state,
        "alert": alert.name,
        "gpu": gpu_ref(gpu) if gpu is not None else None,
        "subject": {k: v for k, v in alert.labels.items() if k != "hostname"},
        "summary": alert.summary,
        "message": alert.description if firing else f"pending: {alert.description}",
        "headline": headline,
        "since": iso(since),
        "since_ts": since,
        "since_exact": exact,
        "meaning": meaning,
        "next_step": next_step,
        "runbook_url": alert.runbook_url,
        "xids": xids,
    }


def own(severity: str, message: str, *, gpu: GpuIdentity | None = None, since: float | None = None, meaning: str | None = None,
        next_step: str | None = None, kind: str) -> Finding:
    """A finding diagnose makes itself (not a rule's alert); ``kind`` names it in JSON."""
    return {
        "severity": severity,
        "state": None,
        "alert": None,
        "kind": kind,
        "gpu": gpu_ref(gpu) if gpu is not None else None,
        "subject": {"gpu": str(gpu.index), "uuid": gpu.uuid} if gpu is not None else {},
        "summary": message,
        "message": message,
        "headline": message,
        "since": iso(since),
        "since_ts": since,
        "since_exact": since is not None,
        "meaning": meaning,
        "next_step": next_step,
        "runbook_url": None,
        "xids": None,
    }


def unreadable_now(gpu: GpuIdentity, since: float, reason: str, at: float) -> Finding:
    """A GPU unreadable at the window's end that ``GpuLost`` does not cover yet (a wedged call, a
    reset under way): a warning, with the NVML source's reason."""
    return own(
        "warning",
        f"unreadable now: no read answered since {clock(since)} ({duration(at - since)}; NVML: {reason})",
        gpu=gpu, since=since, kind="unreadable_now",
        meaning="Every read of this GPU fails now; if it stays so for a minute it is lost (GpuLost).",
        next_step="Check `nvidia-smi` and `journalctl -k | grep -i -e xid -e NVRM` on the host; drain the GPU if it does not answer again.",
    )


def order(findings: Iterable[Finding]) -> list[Finding]:
    """Most severe first; firing before pending; then by GPU index, then by alert name."""

    def key(f: Finding) -> tuple[int, bool, int, str, str]:
        gpu = f.get("gpu")
        return (-SEVERITY_RANK[f["severity"]], f.get("state") != "firing", 10**6 if gpu is None else gpu["index"],
                f.get("alert") or "", f["message"])

    return sorted(findings, key=key)


def verdict(findings: Sequence[Finding], *, top: int = 3) -> Verdict:
    """The report's verdict: OK, WARNING, CRITICAL or UNKNOWN, and the top reasons.

    The worst severity of the findings decides, ranked critical > warning > unknown > ok: a known
    problem is never hidden by data that is stale or partly missing (UNKNOWN only when nothing
    worse is known). Pending alerts and information never change it.

    Returns:
        ``{"status": ..., "counts": {severity: n}, "reasons": [finding, ...]}`` with at most
        ``top`` reasons, most severe first: critical and warning findings (unknown ones when
        the verdict is UNKNOWN).
    """
    counts: dict[str, int] = {}
    for f in findings:
        counts[f["severity"]] = counts.get(f["severity"], 0) + 1
    status: Status = next((s for s in _WORST_FIRST if counts.get(s)), "ok")
    floor = SEVERITY_RANK["warning"] if status in ("critical", "warning") else SEVERITY_RANK[status]
    reasons = [f for f in order(findings) if SEVERITY_RANK[f["severity"]] >= floor][:top] if status != "ok" else []
    return {"status": status, "counts": counts, "reasons": reasons}
