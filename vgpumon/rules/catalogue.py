"""The one catalogue of rules: every rule vgpumon evaluates natively and generates a Prometheus twin
for (``rules/*.rules.yml``), in the order reports list them."""

from __future__ import annotations

from vgpumon.rules import gpu, leak, pcie, slo, source, straggler, vllm, xid_class
from vgpumon.rules.core import Rule

#: Prometheus rule groups: group name → the rules in it (one file per group).
GROUPS: dict[str, tuple[Rule, ...]] = {
    "vgpumon-gpu-health": gpu.RULES,
    "vgpumon-gpu-memory": leak.RULES,
    "vgpumon-pcie": pcie.RULES,
    "vgpumon-vllm": vllm.RULES + slo.RULES,
    "vgpumon-sources": source.RULES,
    "vgpumon-xid": xid_class.RULES,
    "vgpumon-stragglers": straggler.RULES,
}
RULES: tuple[Rule, ...] = tuple(r for rules in GROUPS.values() for r in rules)
BY_NAME: dict[str, Rule] = {r.name: r for r in RULES}
assert len(BY_NAME) == len(RULES), "a rule name is in the catalogue twice"


def get(name: str) -> Rule:
    """The rule of that name. Raises ``KeyError``."""
    return BY_NAME[name]


def rule_names() -> frozenset[str]:
    """The names ``[rules.thresholds]``'s ``for`` and ``disabled`` may use
    (``Thresholds.from_mapping(values, rule_names)``)."""
    return frozenset(r.name for r in RULES)
