"""What a rule is (``Rule``), what evaluating it says (``Finding``), and what its Prometheus twin
is (``Twin``). Pure data and small helpers; the checks live in ``vgpumon.rules.gpu``, ``gpu_usage``,
``pcie``, ``leak``, ``vllm`` and ``source``; the one list of rules is ``vgpumon.rules.catalogue.RULES``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from vgpumon import catalogue
from vgpumon.base.fmt import duration, gb, pct  # noqa: F401  the rules' texts use them through this module

if TYPE_CHECKING:
    from vgpumon.config.thresholds import Thresholds
    from vgpumon.rules.view import HostView

#: A finding's named values, for its description's ``str.format`` template: mostly texts already
#: formatted for people, some plain figures (counts, seconds), ``None`` where there is none.
Evidence = dict[str, str | float | None]

SEVERITIES = ("critical", "warning", "info")
#: What a finding says about its rule on one subject. ``unknown``: the inputs are absent (not
#: supported, not collected, no data in the window) — never taken as healthy.
STATES = ("firing", "ok", "unknown")

#: Identity labels of each kind of subject: the labels a native finding carries and the labels
#: its Prometheus twin aggregates ``by`` — the same set, so both name a subject alike. GPU labels
#: follow dcgm-exporter (lower case ``gpu``, ``uuid``, ``hostname``); identity otherwise lives in
#: ``vgpumon_gpu_info`` / ``vgpumon_vllm_server_info``.
SUBJECT_LABELS: dict[str, tuple[str, ...]] = {
    "gpu": ("hostname", "gpu", "uuid"),
    "gpu_process": ("hostname", "gpu", "uuid", "pid"),
    "pcie_port": ("hostname", "port"),
    "vllm": ("hostname", "server"),
    "source": ("hostname", "source"),
    "host": ("hostname",),
    "rule": ("hostname", "rule"),
}

#: Why a rule cannot judge a subject, as a bounded code (the ``reason`` label of
#: ``vgpumon_rule_unknown``; the finding's ``reason`` text says it in full). In the order
#: ``unknown_code`` tries them: the first whose words the text holds.
UNKNOWN_CODES: dict[str, tuple[str, ...]] = {
    # a check that raised (Engine.evaluate)
    "rule_failed": ("rule failed",),
    # the rule does not apply here: its input is optional data this host simply does not have
    # (no GPM on this GPU, no ECC or row remapping on this board, too few GPUs of a model to
    # compare): said as "not applicable", never as "cannot judge" (docs/rules.md)
    "not_applicable": ("not applicable",),
    # the inputs exist but not for long enough yet: a trend, a settling step, a first start
    # (a trend rule's history after a start: the minutes of its fit, its rollups, not stored yet)
    "warming_up": ("a trend needs", "settles", "not known yet", "not measured", "no earlier start", "covers less than",
                   "1-minute rollups", "minutes of the last"),
    # a reading the rule needs is not reported (None in the samples, no max link)
    "not_reported": ("not reported", "not known", "neither"),
    # too little or nothing stored in the rule's window
    "no_data": ("no samples", "stored", "fewer than", "less than", "no 1-minute rollups", "too few points",
                "not alive with telemetry", "no GPU of the host reported", "a rate needs two"),
}


#: The prefix of an unknown finding's reason when the rule does not apply to the subject.
NOT_APPLICABLE = "not applicable"


def not_applicable(reason: str) -> str:
    """The reason of a finding whose rule does not apply here (code ``not_applicable``)."""
    return f"{NOT_APPLICABLE}: {reason}"


def is_not_applicable(reason: str | None) -> bool:
    """True when an unknown finding's reason says its rule does not apply (``not_applicable``):
    no alert could ever fire there, by the host's make, not by a fault."""
    return unknown_code(reason) == "not_applicable"


def unknown_code(reason: str | None) -> str:
    """The bounded code of an unknown finding's reason (``UNKNOWN_CODES``); ``other`` for a text
    none matches (a test walks every reason the rules give on the recorded captures)."""
    text = reason or ""
    for code, words in UNKNOWN_CODES.items():
        if any(w in text for w in words):
            return code
    return "other"


@dataclass(frozen=True)
class Runbook:
    """The runbook of a rule (``docs/runbooks/<Alert>.md`` is generated from it).

    Attributes:
        meaning: what the alert means, and why it matters.
        confirm: how to confirm it (commands, what to look at).
        action: what to do.
    """

    meaning: str
    confirm: str
    action: str


@dataclass(frozen=True)
class Twin:
    """One Prometheus alerting rule of a rule's twin (most rules have one; a rule may have two
    under the same alert name, e.g. a condition over two metrics).

    Attributes:
        expr: PromQL; its outermost operation aggregates ``by`` the subject's identity labels.
        description: the ``description`` annotation, a Go template (``$value``, ``$labels``).
        for_seconds: ``for``; ``None`` takes the rule's.
        keep_firing_seconds: ``keep_firing_for``; ``None`` takes the rule's.
        labels: static labels beside ``severity`` (e.g. ``source``).
    """

    expr: str
    description: str
    for_seconds: float | None = None
    keep_firing_seconds: float | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Finding:
    """What one rule says about one subject at one evaluation.

    Attributes:
        rule: the rule's name.
        labels: the subject's identity (``SUBJECT_LABELS`` of the rule's subject), strings.
        state: ``firing``, ``ok`` or ``unknown``.
        value: the rule's figure (a slope, a share of the link, a temperature …); ``None`` when
            the rule has none or the state is unknown.
        evidence: named values the description is filled with (already formatted for people).
        reason: for ``unknown``, which input is absent and why.
    """

    rule: str
    labels: dict[str, str]
    state: str
    value: float | None = None
    evidence: Evidence = field(default_factory=dict)
    reason: str | None = None


Check = Callable[["HostView", "Thresholds", "Rule"], Iterable[Finding]]


@dataclass(frozen=True)
class Rule:
    """One rule: a native check and its Prometheus twin, with the words people read.

    Attributes:
        name: CamelCase by subject, as Prometheus alerts are named (``GpuMemoryLeak``).
        severity: ``critical`` pages, ``warning`` tickets, ``info`` helps debugging.
        subject: a key of ``SUBJECT_LABELS``.
        summary: static one-liner.
        description: ``str.format`` template over a finding's evidence (values, window, slope).
        inputs: what the rule reads: catalogue fields as ``table.field``, or a stored input
            (``pcie_links``, ``vllm_engine_samples``, ``gpu_events``) — docs/rules.md lists them.
        check: the native check: yields one ``Finding`` per subject it can say something about.
        twin: the Prometheus twin, built from the thresholds (metric names from the catalogue).
        runbook: meaning, confirmation and action.
        for_seconds: pending → firing after the condition held this long (``for``).
        keep_firing_seconds: firing → resolved only after the condition stopped this long
            (hysteresis against flapping; Prometheus' ``keep_firing_for``).
        every_seconds: how often the agent evaluates it (trend rules need not run every tick).
    """

    name: str
    severity: str
    subject: str
    summary: str
    description: str
    inputs: tuple[str, ...]
    check: Check
    twin: Callable[["Thresholds"], list[Twin]]
    runbook: Runbook
    for_seconds: float = 0.0
    keep_firing_seconds: float = 0.0
    every_seconds: float = 15.0

    def runbook_url(self, base: str = "docs/runbooks/") -> str:
        return f"{base}{self.name}.md"

    def describe(self, finding: Finding) -> str:
        """The description filled in with a finding's evidence (a missing key shows as ``?``)."""
        return self.description.format_map(_Missing(finding.evidence))

    def for_(self, th: "Thresholds") -> float:
        """``for`` after the thresholds' per-rule override."""
        return th.for_seconds.get(self.name, self.for_seconds)


class _Missing(dict):
    def __missing__(self, key: str) -> str:
        return "?"


# -- helpers the checks share ---------------------------------------------------------------------


def gpu_labels(hostname: str, index: int, uuid: str) -> dict[str, str]:
    """Identity labels of a GPU (``SUBJECT_LABELS["gpu"]``)."""
    return {"hostname": hostname, "gpu": str(index), "uuid": uuid}


def fmt(table: str | None, name: str, value: float | str | None) -> str:
    """A value as reports print it (``vgpumon.catalogue.fmt``), ``N/A`` for ``None``."""
    return catalogue.fmt((table, name), value)








def prom(table: str | None, name: str, **match: str) -> str:
    """A metric selector from the catalogue: the entry's Prometheus name with its constant labels
    (``prom_labels``) and ``match`` as equality matchers.

    Raises:
        KeyError: no such field; ValueError: the field is not exported.
    """
    f = catalogue.get(table, name)
    if not f.prometheus:
        raise ValueError(f"{table}.{name} has no Prometheus metric")
    labels = {**f.prom_labels, **match}
    if not labels:
        return f.prometheus
    return f.prometheus + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def by(subject: str) -> str:
    """``by (…)`` clause of a subject's identity labels."""
    return "by (" + ", ".join(SUBJECT_LABELS[subject]) + ")"


def prom_duration(seconds: float) -> str:
    """Seconds as a PromQL duration (``600`` → ``10m``)."""
    s = int(round(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size and s % size == 0:
            return f"{s // size}{unit}"
    return f"{s}s"
