"""A source that stopped reporting is its own alert: the NVML source (no GPU row), the host source
(no host sample) or the vLLM source (no poll of a server it was watching).

"Now" is ``HostView.wall``: the wall clock in a live agent, so a wedged NVML thread that writes
nothing is seen; the evaluation time in ``diagnose`` and replays, where the sources are compared
with each other (GPU rows go on, vLLM polls stopped). An agent that is gone entirely cannot say
so itself: ``diagnose --max-age`` reports it UNKNOWN, and the twin's second rule fires while
Prometheus' ``up`` of its target is 0 (for as long as the target is configured: an agent that
never came up included, a host in no scrape configuration never).

``VgpumonRuleCannotJudge`` is here too: the agent's verdict on its own rules.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from vgpumon.config.thresholds import Thresholds
from vgpumon.rules.core import Finding, Rule, Runbook, Twin, by, duration, gpu_labels, prom, unknown_code
from vgpumon.rules.view import GpuEventRow, HostView, row_ts


def _silent(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    limit = th.silent_after_seconds
    now = view.wall

    def finding(source: str, newest: float | None, what: str) -> Finding:
        labels = {"hostname": view.hostname, "source": source}
        if newest is None:
            return Finding(rule.name, labels, "unknown", reason=f"no {what} stored")
        age = max(0.0, now - newest)
        return Finding(rule.name, labels, "firing" if age > limit else "ok", age,
                       {"source": source, "what": what, "age": duration(age), "limit": duration(limit)})

    newest = view.latest(("up",))
    yield finding("nvml", max((row_ts(r) for r in newest.values()), default=None), "GPU sample")
    host = view.newest_host_sample
    if host is not None:  # replays of another host's capture take no host samples: nothing to expect
        yield finding("host", host, "host sample")
    watched = [i for i in view.vllm_instances if i["ended"] is None and i["last_seen"] >= now - th.vllm_dead_window_seconds]
    if watched:
        yield finding("vllm", max(i["last_seen"] for i in watched), "vLLM poll of a server that is still running")


#: Prometheus' scrape health of the agents' targets: a scrape job whose name holds "vgpumon"
#: (the shipped configurations' ``vgpumon``; docs/rules.md).
AGENT_UP = 'up{job=~".*vgpumon.*"}'


def _silent_twin(th: Thresholds) -> list[Twin]:
    last = prom("agent", "source_last_success_timestamp_seconds")
    return [
        Twin(f"max by (hostname, source) (time() - {last}) > {th.silent_after_seconds:g}",
             "The {{ $labels.source }} source of {{ $labels.hostname }} last answered {{ $value | humanizeDuration }} ago."),
        # the agent down: Prometheus' own up of its target, for as long as the target is known
        # (never an absent(), which fires for every target that was never configured); the
        # host is the instance's host part, the agent being unable to say its own hostname then
        Twin(f'max by (hostname) (label_replace({AGENT_UP}, "hostname", "$1", "instance", "(.+):[0-9]+")) == 0',
             "The agent of {{ $labels.hostname }} does not answer Prometheus' scrapes: it is down or unreachable.",
             for_seconds=th.silent_after_seconds, labels={"source": "agent"}),
    ]


def _collector_fault(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    """A GPU whose collector found its own readings false (GPM PCIe at 0 while the throughput
    call reads a copy): its newest ``collector_fault`` event has no ``collector_fault_cleared``
    after it, and its newest row still has the figures withheld (a restarted agent that finds
    them agreeing again writes no all-clear, but stores them)."""
    open_: dict[int, GpuEventRow] = {}
    for event in view.events(th.missing_lookback_seconds):  # oldest first
        gid = event["gpu_id"]
        if gid is None:
            continue
        if event["kind"] == "collector_fault":
            open_[gid] = event
        elif event["kind"] == "collector_fault_cleared":
            open_.pop(gid, None)
    newest = view.latest(FAULT_FIELDS)
    for g in view.gpus:
        labels = gpu_labels(view.hostname, g.identity.index, g.identity.uuid)
        row, fault = newest.get(g.id), open_.get(g.id)
        withheld = row is not None and all(row[c] is None for c in FAULT_FIELDS)
        if fault is None or not withheld:
            yield Finding(rule.name, labels, "ok", 0.0)
            continue
        yield Finding(rule.name, labels, "firing", 1.0, {"gpu": g.identity.index, "since": duration(max(0.0, view.at - fault["ts"])),
                                                         "detail": fault["detail"]})


#: The readings a collector fault withholds (the GPM PCIe cross-check's).
FAULT_FIELDS = ("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second")


def _collector_fault_twin(th: Thresholds) -> list[Twin]:
    return [Twin(f"max {by('gpu')} ({prom('exporter', 'collector_fault')}) == 1",
                 "The collector of GPU {{ $labels.gpu }} of {{ $labels.hostname }} found its own readings false and "
                 "withholds them (diagnose and the agent's log say which).")]


#: The rule about the other rules: one that cannot judge a subject for a while says so.
CANNOT_JUDGE = "VgpumonRuleCannotJudge"
#: Reason codes that do not make a rule "cannot judge": inputs that come by waiting (a trend's
#: hours after a start, a step settling), and a rule that does not apply to the subject
#: (``not_applicable``: no GPM, no ECC on this board): nothing is missing there (docs/rules.md,
#: "Cannot judge, or not applicable"). ``vgpumon_rule_unknown`` serves both, with their code.
WAITING = ("warming_up", "not_applicable")


def _judged_elsewhere(view: HostView, th: Thresholds, rule: Rule) -> Iterable[Finding]:
    """The check of ``VgpumonRuleCannotJudge`` reads no data: ``Engine.evaluate`` judges it from
    the other rules' newest findings (``cannot_judge``)."""
    return ()


def cannot_judge(rule: Rule, hostname: str, newest: Mapping[str, Sequence[Finding]], rules: Iterable[str]) -> list[Finding]:
    """One finding per rule of ``rules``: firing while its newest evaluation left a subject
    unknown for a reason other than ``WAITING``, with how many subjects and the first reason.

    Args:
        rule: ``VgpumonRuleCannotJudge``.
        newest: rule name → its findings at its newest evaluation.
    """
    out = []
    for name in rules:
        if name == rule.name:
            continue
        blind = [f for f in newest.get(name, ()) if f.state == "unknown" and unknown_code(f.reason) not in WAITING]
        labels = {"hostname": hostname, "rule": name}
        if not blind:
            out.append(Finding(rule.name, labels, "ok", 0.0))
            continue
        first = blind[0]
        subject = ", ".join(f"{k} {v}" for k, v in first.labels.items() if k != "hostname" and v) or "the host"
        out.append(Finding(rule.name, labels, "firing", float(len(blind)),
                           {"rule": name, "count": float(len(blind)), "subject": subject, "code": unknown_code(first.reason),
                            "reason": first.reason}))
    return out


def _cannot_judge_twin(th: Thresholds) -> list[Twin]:
    unknown = prom("exporter", "rule_unknown")
    waiting = "|".join(WAITING)
    assert "{" not in unknown, unknown  # a plain name: the matcher below is its only one
    return [Twin(f'count by (hostname, rule) ({unknown}{{reason!~"{waiting}"}}) > 0',
                 "{{ $labels.rule }} cannot judge {{ $value }} subject(s) of {{ $labels.hostname }} "
                 "(vgpumon_rule_unknown says why): its alert could not fire there.")]


RULES: tuple[Rule, ...] = (
    Rule(
        "VgpumonSourceSilent", "warning", "source",
        "A vgpumon source stopped reporting.",
        "The {source} source's newest {what} is {age} old (limit {limit}).",
        ("gpu_samples.ts", "host_samples.ts", "vllm_instances.last_seen"),
        _silent,
        _silent_twin,
        Runbook(
            "One of the agent's sources stopped delivering while it should: NVML (a wedged call, the driver gone), the "
            "host sampler, or the vLLM poller. Everything the other alerts say about that source is now unknown, not healthy.",
            "`systemctl status vgpumon-agent` (or the DaemonSet's pod) and its log; `vgpumon diagnose <host> --max-age 2m`; "
            "`nvidia-smi` on the host for NVML.",
            "Restart the agent; if NVML is wedged, `nvidia-smi` hangs too: the GPU or driver needs a reset.",
        ),
        every_seconds=15.0,
    ),
    Rule(
        "VgpumonCollectorFault", "warning", "gpu",
        "The collector found a GPU's readings false and withholds them.",
        "GPU {gpu}: {detail}, for {since}; those figures are withheld, not zero.",
        ("gpu_events", "gpu_samples.pcie_tx_bytes_per_second", "gpu_samples.pcie_rx_bytes_per_second"),
        _collector_fault,
        _collector_fault_twin,
        Runbook(
            "The agent's cross-check caught NVML's GPM reporting PCIe traffic that the throughput call contradicts (GPM "
            "at 0 during a 56 GB/s copy is the known case). Those figures are withheld, so PCIe saturation and stuck "
            "GPUs cannot be judged from them on this GPU until the two agree again.",
            "`vgpumon diagnose <host>` (the finding, with both figures); `nvidia-smi dmon -s t -i <gpu>` beside "
            "`nvidia-smi -q -d PERFORMANCE`; the agent's log line \"collector fault\".",
            "Update the driver if the GPM figures stay wrong; meanwhile the throughput call's own figure is the truth "
            "for the link. The alert clears when a cross-check agrees again.",
        ),
        every_seconds=15.0,
    ),
    Rule(
        CANNOT_JUDGE, "info", "rule",
        "A rule cannot judge some of what it watches.",
        "{rule} cannot judge {count:.0f} subject(s) ({code}); first {subject}: {reason}.",
        ("the other rules' findings",),
        _judged_elsewhere,
        _cannot_judge_twin,
        Runbook(
            "A rule's inputs are absent for a subject (a reading the GPU does not support, a field not reported, nothing "
            "stored in its window, a check that failed): its alert cannot fire there, so silence from it means nothing. "
            "A trend still warming up after a start is not counted.",
            "`vgpumon diagnose <host>` lists each unknown rule with its reason; `/metrics` serves "
            "`vgpumon_rule_unknown{rule, reason, gpu, …}`; the fleet dashboard's \"Rules that cannot judge\" panel.",
            "Provide the input (enable GPM, a driver that reports the field, vLLM metrics) or disable the rule for that "
            "host (`[rules] disabled`) so that its silence is a decision, not an accident.",
        ),
        for_seconds=900.0,
        every_seconds=15.0,
    ),
)
