"""Runbooks (``docs/runbooks/<Alert>.md``) generated from the rule catalogue: what the alert means,
how to confirm it, what to do — with its severity, subject, inputs and twin. ``vgpumon rules
build`` writes them beside the Prometheus files; a test keeps the committed ones equal."""

from __future__ import annotations

from vgpumon.config.thresholds import Thresholds
from vgpumon.rules.catalogue import RULES
from vgpumon.rules.core import SUBJECT_LABELS, Rule, duration
from vgpumon.rules.prometheus import alerting_rules, file_name


def _group_of(rule: Rule) -> str:
    from vgpumon.rules.catalogue import GROUPS

    return next(g for g, rules in GROUPS.items() if rule in rules)


def runbook(rule: Rule, th: Thresholds | None = None) -> str:
    """One runbook as Markdown."""
    th = th or Thresholds()
    wait, keep = rule.for_(th), rule.keep_firing_seconds
    lines = [
        f"# {rule.name}",
        "",
        f"**Severity:** {rule.severity} · **Subject:** {rule.subject} (labels "
        + ", ".join(f"`{label}`" for label in SUBJECT_LABELS[rule.subject])
        + ")"
        + (f" · **for:** {duration(wait)}" if wait else "")
        + (f" · **keep firing for:** {duration(keep)}" if keep else ""),
        "",
        f"> {rule.summary}",
        "",
        "## What it means",
        "",
        rule.runbook.meaning,
        "",
        "## How to confirm",
        "",
        rule.runbook.confirm,
        "",
        "## What to do",
        "",
        rule.runbook.action,
        "",
        "## How vgpumon decides",
        "",
        "Native (`vgpumon agent`, `vgpumon diagnose`): `vgpumon/rules/`, description:",
        "",
        f"    {rule.description}",
        "",
        "Inputs: " + ", ".join(f"`{i}`" for i in rule.inputs) + ". A rule whose inputs are absent says unknown, never healthy.",
        "",
        f"Prometheus twin (`rules/{file_name(_group_of(rule))}`):",
        "",
        "```promql",
    ]
    for item in alerting_rules(rule, th):
        lines += [item["expr"], ""]
    lines[-1] = "```"
    lines += ["", "Thresholds: docs/rules.md.", ""]
    return "\n".join(lines)


def render(th: Thresholds | None = None) -> dict[str, str]:
    """Every runbook: file name → Markdown."""
    return {f"{r.name}.md": runbook(r, th) for r in RULES}
