"""GPU health rules: ECC, row remapping, XIDs, a GPU lost, unreadable or missing; and the group's
catalogue (``RULES``), which ends with the usage rules of ``vgpumon.rules.gpu_usage`` (stuck,
thermal and power-brake slowdown, memory nearly full or held by idle SMs).

Each check reads the host's stored data as of the evaluation time (``HostView``) and yields one
``Finding`` per GPU: firing, ok, or unknown when its inputs are absent (a board without ECC, a
GPU without GPM) — never ok for lack of data. Thresholds: ``vgpumon.config.thresholds``.
"""

from __future__ import annotations

from typing import Callable, Iterable

from vgpumon import catalogue
from vgpumon.catalogue.xid import XIDS
from vgpumon.config.thresholds import Thresholds
from vgpumon.model.gpu import GPU_LOST_REASON
from vgpumon.rules import gpu_usage
from vgpumon.rules.core import (
    Check,
    Finding,
    Rule,
    Runbook,
    Twin,
    by,
    duration,
    gpu_labels,
    not_applicable,
    prom,
    prom_duration,
)
from vgpumon.rules.view import GpuEventRow, HostView, row_ts
from vgpumon.store import StoredGpu

G = "gpu_samples"
BY = by("gpu")

#: XIDs that page: NVIDIA's DCGM health watches (FACTS §4) and nvidia_gpu_exporter's allowlist
#: (FACTS §7) — 48, 62, 64, 74, 79, 95, 119, 120 and 140.
CRITICAL_XIDS = (48, 62, 64, 74, 79, 95, 119, 120, 140)
#: XIDs worth a ticket that never page alone: 94 (contained ECC error; DCGM: warning) and the
#: memory-class 31, 32, 43, 63 (FACTS §4) — 31 and 43 are mostly raised by application faults.
WARNING_XIDS = (94, 31, 32, 43, 63)
#: What an XID means, for descriptions: our table of NVIDIA's Xid catalog (``vgpumon.catalogue.xid``).
XID_MEANINGS: dict[int, str] = {code: x.meaning for code, x in XIDS.items()}


#: Row remapping is a datacenter board's (NVML has it from Ampere on): one that never reported it
#: has none to judge.
_NO_REMAP = not_applicable("this GPU reports no row remapping (NVML has it from Ampere on; this GPU, driver or capture gave none)")


def _labels(view: HostView, g: StoredGpu) -> dict[str, str]:
    return gpu_labels(view.hostname, g.identity.index, g.identity.uuid)


def _unknown(rule: Rule, view: HostView, g: StoredGpu, reason: str) -> Finding:
    return Finding(rule.name, _labels(view, g), "unknown", reason=reason)


def _meanings(codes: dict[int, int]) -> str:
    return "; ".join(f"XID {c} × {n} ({XID_MEANINGS.get(c, 'see the Xid catalog')})" for c, n in sorted(codes.items()))


# -- cumulative counters and latched flags (slow set) ---------------------------------------------


def _latched(column: str, absent: str, fires: Callable[[float], object]) -> Check:
    """A check on the newest value of a slow-set counter or flag (at or before the evaluation)."""

    def check(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
        sampled = view.latest(("up",))
        for g in view.gpus:
            item = view.last_values(g.id, (column,))[column]
            if item is None:
                # a GPU sampled that never reported the counter has none (``absent``); one with
                # no sample at all cannot be judged
                yield _unknown(rule, view, g, absent if g.id in sampled else "no samples stored")
                continue
            ts, value = item
            on = bool(fires(value))
            yield Finding(rule.name, _labels(view, g), "firing" if on else "ok", float(value),
                          {"value": int(value), "read": duration(view.at - ts) + " ago"})

    return check


def _latched_twin(column: str, condition: str, description: str) -> Callable[[Thresholds], list[Twin]]:
    """The twin of a ``_latched`` check: the newest value of ``column`` meets ``condition``."""

    def twin(th: Thresholds) -> list[Twin]:
        return [Twin(f"max {BY} ({prom(G, column)}) {condition}", description)]

    return twin


_ecc_twin = _latched_twin(
    "ecc_uncorrected_volatile_total", "> 0",
    "{{ $value }} volatile uncorrectable ECC errors on GPU {{ $labels.gpu }} of {{ $labels.hostname }}: drain and reset it.")
_remap_failure_twin = _latched_twin(
    "remapped_rows_failure", "== 1", "Row remapping failed on GPU {{ $labels.gpu }} of {{ $labels.hostname }}: the GPU needs replacing.")
_remap_pending_twin = _latched_twin(
    "remapped_rows_pending", "== 1", "A row remap waits for a reset on GPU {{ $labels.gpu }} of {{ $labels.hostname }}: drain it and reset.")
_remapped_high_twin = _latched_twin(
    "remapped_rows_uncorrectable_total", ">= 512",
    "{{ $value }} rows remapped after uncorrectable errors on GPU {{ $labels.gpu }} of {{ $labels.hostname }} (≥ 512).")


# -- XIDs -------------------------------------------------------------------------------------------


def _xid_check(codes: tuple[int, ...] | None, exclude: tuple[int, ...] = ()) -> Check:
    """XIDs of ``codes`` (``None``: any code not in ``exclude``) in the XID window, per GPU."""

    def check(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
        window = th.xid_window_seconds
        seen: dict[int, dict[int, int]] = {}
        for _, gpu_id, xid in view.xids(window):
            if (codes is None and xid not in exclude) or (codes is not None and xid in codes):
                seen.setdefault(gpu_id, {})
                seen[gpu_id][xid] = seen[gpu_id].get(xid, 0) + 1
        agg = view.window(window, ("up",), ("count",))
        for g in view.gpus:
            found = seen.get(g.id)
            if found:
                yield Finding(rule.name, _labels(view, g), "firing", float(sum(found.values())),
                              {"xids": _meanings(found), "window": duration(window)})
            elif not agg[g.id]["samples"]:
                # no tick in the window: nobody listened for XIDs there
                yield _unknown(rule, view, g, f"no samples in the last {duration(window)}")
            else:
                yield Finding(rule.name, _labels(view, g), "ok", 0.0, {"window": duration(window)})

    return check


def _xid_selector(codes: Iterable[int], negate: bool = False) -> str:
    regex = "|".join(str(c) for c in codes)
    metric = prom("xid_events", "xid")
    return f'{metric}{{xid{"!~" if negate else "=~"}"{regex}"}}'


def _xid_twin(codes: Iterable[int], negate: bool = False) -> Callable[[Thresholds], list[Twin]]:
    def twin(th: Thresholds) -> list[Twin]:
        sel, w = _xid_selector(codes, negate), prom_duration(th.xid_window_seconds)
        # a code's counter series starts at its first event (at 1): increase() misses that first
        # event, so a series that did not exist one window ago counts as well. "Did not exist" is
        # judged on the GPU and code alone: a counter whose target labels changed (the agent's
        # pod rescheduled, a new instance address) with its count unchanged is no new event
        expr = f"sum {BY} ((increase({sel}[{w}]) > 0) or ({sel} unless on (hostname, uuid, xid) {sel} offset {w})) > 0"
        return [Twin(expr, "XID events on GPU {{ $labels.gpu }} of {{ $labels.hostname }} in the last " + w
                     + "; their codes are the xid labels of " + prom("xid_events", "xid") + ".")]

    return twin


# -- readable, lost, missing --------------------------------------------------------------------


def down_reasons(view: HostView, th: Thresholds) -> dict[int, str]:
    """Per GPU unreadable at ``view.at``: the NVML source's newest word on why (``gpu_down`` or
    ``gpu_wedged`` detail since the GPU went down), or ``"unreadable"`` where it recorded none."""
    since = view.down_since()
    out = {gid: "unreadable" for gid in since}
    for e in view.events(th.missing_lookback_seconds):  # oldest first: the newest word wins
        gid = e["gpu_id"]
        if gid in since and e["kind"] in ("gpu_down", "gpu_wedged") and e["ts"] >= since[gid] - 1e-3:
            out[gid] = e["detail"] or e["kind"]
    return out


def _lost(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    """Unreadable now, and either for ``lost_for_seconds`` or with NVML's own "GPU is lost": that
    answer is the driver's verdict (the GPU fell off the bus or is otherwise inaccessible; only a
    reset or a reboot undoes it), so waiting a minute adds nothing but a minute."""
    window = th.lost_for_seconds
    newest = view.latest(("up",))
    since = view.down_since()
    reasons = down_reasons(view, th) if since else {}
    for g in view.gpus:
        last = newest.get(g.id)
        if last is None or view.at - row_ts(last) > th.missing_after_seconds:
            # no recent row: nothing says whether it is readable (GpuMissing's case)
            yield _unknown(rule, view, g, f"no samples in the last {duration(th.missing_after_seconds)}")
            continue
        began = since.get(g.id)
        if began is None:
            yield Finding(rule.name, _labels(view, g), "ok", 0.0, {"window": duration(window)})
            continue
        reason = reasons.get(g.id, "unreadable")
        down_for = view.at - began
        on = down_for >= window or reason == GPU_LOST_REASON
        yield Finding(rule.name, _labels(view, g), "firing" if on else "ok", down_for,
                      {"since": duration(down_for), "reason": reason, "window": duration(window)})


def _unreadable(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    window = th.unreadable_window_seconds
    agg = view.window(window, ("up",), ("count",))
    newest = view.latest(("up",))
    for g in view.gpus:
        a, last = agg[g.id], newest.get(g.id)
        n, up = a["samples"], a["up_samples"] or 0
        if not n or last is None:
            yield _unknown(rule, view, g, f"no samples in the last {duration(window)}")
            continue
        # down now is GpuLost's case; this one is a GPU that came back (or flaps)
        on = up < n and bool(last["up"])
        yield Finding(rule.name, _labels(view, g), "firing" if on else "ok", float(n - up),
                      {"down": n - up, "ticks": n, "window": duration(window)})


def _missing(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    """GPUs registered for the host (seen before) without a recent sample while another GPU of
    the host reports: a driver reload or a GPU off the bus removed it from NVML's list. A GPU the
    NVML source recorded as gone (``gpu_disappeared``, not appeared since) is missing at once,
    with the moment it went."""
    newest = view.latest(("up",))
    recent = {gid for gid, row in newest.items() if view.at - row_ts(row) <= th.missing_after_seconds}
    if not recent:
        for g in view.gpus:
            yield _unknown(rule, view, g, f"no GPU of the host reported in the last {duration(th.missing_after_seconds)}")
        return
    # the NVML source's own word, when it recorded one: the newest of "disappeared" / "appeared"
    last: dict[int, GpuEventRow] = {}
    for e in view.events(th.missing_lookback_seconds):  # oldest first
        if e["gpu_id"] is not None and e["kind"] in ("gpu_disappeared", "gpu_appeared"):
            last[e["gpu_id"]] = e
    gone = {gid: e for gid, e in last.items() if e["kind"] == "gpu_disappeared"}
    for g in view.gpus:
        row = newest.get(g.id)
        if g.id in recent and g.id not in gone:
            yield Finding(rule.name, _labels(view, g), "ok")
            continue
        if row is None or view.at - row_ts(row) > th.missing_lookback_seconds:
            continue  # not seen in the lookback: a card taken out long ago is no longer expected
        ev = gone.get(g.id)
        yield Finding(
            rule.name, _labels(view, g), "firing", view.at - row_ts(row),
            {"last_seen": duration(view.at - row_ts(row)) + " ago", "bus": g.identity.pci_bus_id or "?",
             "reporting": len(recent - set(gone)), "registered": len(view.gpus),
             "event": f"; the NVML source recorded it disappearing ({ev['detail'] or ev['kind']})" if ev else ""},
        )


def _unreadable_twin(th: Thresholds) -> list[Twin]:
    w = prom_duration(th.unreadable_window_seconds)
    up = prom(G, "up")
    return [Twin(f"max {BY} (min_over_time({up}[{w}])) == 0 and max {BY} ({up}) == 1",
                 "GPU {{ $labels.gpu }} of {{ $labels.hostname }} could not be read for part of the last " + w
                 + " and answers again.")]


def _lost_twin(th: Thresholds) -> list[Twin]:
    return [Twin(f"max {BY} ({prom(G, 'up')}) == 0",
                 "GPU {{ $labels.gpu }} of {{ $labels.hostname }} has not answered NVML for "
                 + prom_duration(th.lost_for_seconds) + ".", for_seconds=th.lost_for_seconds)]


def _missing_twin(th: Thresholds) -> list[Twin]:
    info = catalogue.INFO_METRICS["gpus"]
    look = prom_duration(th.missing_lookback_seconds)
    expr = (f"max {BY} ((max_over_time({info}[{look}]) unless on (hostname, uuid) {info})\n"
            f"  and on (hostname) max by (hostname) ({info}))")
    return [Twin(expr, "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) of {{ $labels.hostname }} reported in the last " + look
                 + " and is gone from NVML's list while the host's other GPUs report.",
                 for_seconds=th.missing_after_seconds)]


#: The group's rules in report order: the health rules, then the usage rules.
RULES: tuple[Rule, ...] = (
    Rule(
        "GpuEccUncorrectable", "critical", "gpu",
        "A GPU reported uncorrectable (double-bit) ECC errors.",
        "{value} volatile uncorrectable ECC errors since the driver loaded (read {read}): drain and reset the GPU.",
        (f"{G}.ecc_uncorrected_volatile_total",),
        _latched("ecc_uncorrected_volatile_total", not_applicable("this GPU reports no ECC counters (ECC disabled or not supported)"), lambda v: v > 0),
        _ecc_twin,
        Runbook(
            "The GPU's memory returned data that ECC could not correct since the driver was loaded. Results computed on "
            "it may be wrong, and NVIDIA's health watches (DCGM) fail a GPU on any volatile double-bit error.",
            "`nvidia-smi -q -d ECC -i <gpu>` shows the volatile and aggregate counts; `vgpumon diagnose <host>` shows "
            "them per GPU; the kernel log has XID 48 or 94/95 beside it.",
            "Drain the GPU (stop scheduling work on it), then reset it (`nvidia-smi -r -i <gpu>`) or reboot. If errors "
            "come back, or row remapping fails, open a hardware case with the serial number.",
        ),
    ),
    Rule(
        "GpuRowRemapFailed", "critical", "gpu",
        "Row remapping failed on a GPU: its memory can no longer be repaired.",
        "The GPU reports a failed row remap (read {read}): it needs replacing.",
        (f"{G}.remapped_rows_failure",),
        _latched("remapped_rows_failure", _NO_REMAP, bool),
        _remap_failure_twin,
        Runbook(
            "HBM rows with uncorrectable errors are remapped to spare rows; a failed remap means no spare was left or "
            "the remap could not be recorded. DCGM treats it as a failed GPU.",
            "`nvidia-smi -q -d ROW_REMAPPER -i <gpu>` shows 'Remapping Failure Occurred: Yes'.",
            "Take the GPU out of service and open a hardware case (RMA) with its serial number.",
        ),
    ),
    Rule(
        "GpuRowRemapPending", "warning", "gpu",
        "A row remap waits for a GPU reset.",
        "A row remap is pending (read {read}): the GPU runs without it until it is reset.",
        (f"{G}.remapped_rows_pending",),
        _latched("remapped_rows_pending", _NO_REMAP, bool),
        _remap_pending_twin,
        Runbook(
            "An uncorrectable error marked a memory row for remapping; the remap takes effect at the next GPU reset.",
            "`nvidia-smi -q -d ROW_REMAPPER -i <gpu>` shows 'Pending: Yes'; the kernel log has XID 63.",
            "Drain the GPU and reset it (`nvidia-smi -r -i <gpu>`) or reboot at the next window.",
        ),
    ),
    Rule(
        "GpuRemappedRowsHigh", "warning", "gpu",
        "A GPU has remapped many rows after uncorrectable errors.",
        "{value} rows remapped after uncorrectable errors (≥ 512, DCGM's warning level; read {read}).",
        (f"{G}.remapped_rows_uncorrectable_total",),
        _latched("remapped_rows_uncorrectable_total", _NO_REMAP, lambda v: v >= 512),
        _remapped_high_twin,
        Runbook(
            "Each uncorrectable memory error uses a spare row; at 512 DCGM warns that the spares are running out.",
            "`nvidia-smi -q -d ROW_REMAPPER -i <gpu>` and the Bank Remap Availability Histogram.",
            "Plan a replacement; watch for `GpuRowRemapFailed`.",
        ),
    ),
    Rule(
        "GpuXidCritical", "critical", "gpu",
        "A GPU raised an XID that takes it out of service.",
        "{xids} in the last {window}.",
        ("xid_events.xid",),
        _xid_check(CRITICAL_XIDS),
        _xid_twin(CRITICAL_XIDS),
        Runbook(
            "The driver reported an XID of the critical allowlist (48, 62, 64, 74, 79, 95, 119, 120, 140; FACTS §4 and "
            "§7): double-bit or uncontained ECC errors, a halted micro-controller or GSP, an NVLink error, or the GPU "
            "falling off the bus. Work on the GPU has failed or will.",
            "`journalctl -k | grep -i xid` (or `dmesg`) shows the XID with its text; `vgpumon diagnose <host>` lists "
            "every event with its time, repeats included.",
            "Drain the GPU. 79 and 119/120: reset or reboot, then check PCIe seating and power. 48/95/140: see "
            "`GpuEccUncorrectable`. Repeated after a reset: open a hardware case.",
        ),
    ),
    Rule(
        "GpuXidWarning", "warning", "gpu",
        "A GPU raised an XID worth a look (contained ECC error or a memory-class fault).",
        "{xids} in the last {window}.",
        ("xid_events.xid",),
        _xid_check(WARNING_XIDS),
        _xid_twin(WARNING_XIDS),
        Runbook(
            "94 is a contained ECC error (the application that touched the memory was stopped, the GPU lives on); 31, 32 "
            "and 43 are memory faults and channel resets, most often caused by the application; 63 records a row remap. "
            "None of them pages on its own.",
            "`journalctl -k | grep -i xid` shows the process (pid) the driver blamed; the application's own log says "
            "whether it crashed.",
            "If one application raises it, hand it to its owners. If several do, or it repeats on one GPU, check "
            "`GpuRowRemapPending` and the ECC counts, and drain the GPU.",
        ),
    ),
    Rule(
        "GpuXidOther", "info", "gpu",
        "A GPU raised an XID outside the allowlists (usually an application fault).",
        "{xids} in the last {window}.",
        ("xid_events.xid",),
        _xid_check(None, exclude=CRITICAL_XIDS + WARNING_XIDS),
        _xid_twin(CRITICAL_XIDS + WARNING_XIDS, negate=True),
        Runbook(
            "XIDs such as 13 (graphics engine exception) are raised by application faults and never page (FACTS §7).",
            "`journalctl -k | grep -i xid` names the process.",
            "Nothing on the GPU side; tell the application's owners if it repeats.",
        ),
    ),
    Rule(
        "GpuLost", "critical", "gpu",
        "A GPU stopped answering NVML.",
        "Unreadable for {since} (NVML: {reason}): it is lost now.",
        (f"{G}.up", "gpu_events"),
        _lost,
        _lost_twin,
        Runbook(
            "NVML answers 'GPU is lost' or similar for this GPU: it fell off the bus, was reset, or its driver state is "
            "broken. A GPU that falls off the bus may never deliver its XID 79, so this alert stands on its own. It fires "
            "once the GPU has been unreadable for a minute, or at once when NVML answers 'GPU is lost' (the driver's own "
            "verdict, which only a reset or a reboot undoes); the Prometheus twin cannot see NVML's answer and waits the minute.",
            "`nvidia-smi` on the host lists the GPU as lost or errors; `journalctl -k | grep -i -e xid -e NVRM` shows "
            "what the driver saw; `lspci | grep -i nvidia` shows whether the device is still on the bus.",
            "Drain the host's work from it; try `nvidia-smi -r -i <gpu>`, else reboot. If it recurs, reseat the card "
            "and check the slot's power and riser.",
        ),
        every_seconds=15.0,
    ),
    Rule(
        "GpuUnreadable", "warning", "gpu",
        "A GPU could not be read for part of the window and answers again.",
        "GPU unreadable for {down} of {ticks} ticks in the last {window}.",
        (f"{G}.up",),
        _unreadable,
        _unreadable_twin,
        Runbook(
            "Some ticks could not read the GPU (lost, reset required, a wedged call) but it answers now: a transient "
            "fault, a reset, or the first sign of a GPU about to be lost.",
            "`vgpumon diagnose <host>` shows the unreadable ticks; `journalctl -k` around those times.",
            "If it repeats, drain the GPU and check XIDs and the PCIe link (`GpuPcieReplaysHigh`).",
        ),
    ),
    Rule(
        "GpuMissing", "critical", "gpu",
        "A GPU that the host had is gone from NVML's list.",
        "GPU (bus {bus}) last reported {last_seen}; {reporting} of the host's {registered} registered GPUs report now{event}.",
        (f"{G}.up", "gpus.uuid", "gpu_events"),
        _missing,
        _missing_twin,
        Runbook(
            "The GPU was seen on this host before but NVML no longer lists it while the other GPUs report: a driver "
            "reload or re-initialisation came back without it, or it fell off the bus and was removed.",
            "`nvidia-smi -L` and `lspci | grep -i nvidia` on the host; `journalctl -k` for XID 79 and PCIe errors.",
            "If the card was removed on purpose, the alert clears a day after its last sample. Otherwise drain the host, "
            "reboot, and reseat or replace the card if it stays missing.",
        ),
    ),
) + gpu_usage.RULES
