"""The Prometheus twins: generated from the rule catalogue and committed as generated, one twin per
native alert with the same name, severity, labels and annotations, querying only metrics the
field catalogue names, each with a firing, a not-yet-firing and an absent-data promtool case — and
promtool 2.42 accepting and passing them all."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml
from conftest import ROOT

from vgpumon import catalogue
from vgpumon.rules import docs, prometheus
from vgpumon.rules.catalogue import BY_NAME, RULES
from vgpumon.rules.core import SUBJECT_LABELS

pytestmark = pytest.mark.slow  # starts processes or servers: not in the quick subset (docs/testing.md)

RULES_DIR = ROOT / "rules"
RUNBOOKS = ROOT / "docs" / "runbooks"
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed")


def _twins() -> list[dict]:
    out = []
    for path in sorted(RULES_DIR.glob("*.rules.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            out += group["rules"]
    return out


def _promtool_groups() -> list[dict]:
    out = []
    for path in sorted((RULES_DIR / "tests").glob("*.test.yml")):
        out += yaml.safe_load(path.read_text())["tests"]
    return out


def test_committed_rule_files_and_runbooks_are_what_the_catalogue_generates():
    wanted = {RULES_DIR / n: t for n, t in prometheus.render().items()} | {RUNBOOKS / n: t for n, t in docs.render().items()}
    for path, text in wanted.items():
        assert path.exists() and path.read_text() == text, f"{path.relative_to(ROOT)} is stale: run `vgpumon rules build`"
    on_disk = set(RULES_DIR.glob("*.rules.yml")) | set(RUNBOOKS.glob("*.md"))
    assert on_disk == set(wanted), "files left over from a rule that no longer exists"


def test_every_native_alert_has_a_twin_with_the_same_name_severity_and_annotations():
    twins = _twins()
    assert {t["alert"] for t in twins} == set(BY_NAME)
    for t in twins:
        rule = BY_NAME[t["alert"]]
        assert t["labels"]["severity"] == rule.severity
        assert set(t["annotations"]) == {"summary", "description", "runbook_url"}
        assert t["annotations"]["summary"] == rule.summary
        assert t["annotations"]["runbook_url"] == f"docs/runbooks/{rule.name}.md"
        assert (RUNBOOKS / f"{rule.name}.md").exists()


def test_twins_query_only_metrics_the_field_catalogue_names():
    known = set(catalogue.families())  # every series /metrics serves, info metrics included
    for t in _twins():
        used = set(re.findall(r"\bvgpumon_[a-z0-9_]+", t["expr"]))
        # or Prometheus' own up of the agents' targets (the agent-down twin: no agent series then)
        assert (used or t["expr"].startswith("max by (hostname) (label_replace(up{")) and used <= known, (t["alert"], sorted(used - known))


def test_every_alert_has_firing_not_yet_firing_and_absent_data_promtool_cases_with_the_native_labels():
    groups = _promtool_groups()
    for rule in RULES:
        # group names: "<Alert>: <case>" or "<Alert> (<variant>): <case>"
        cases = {g["name"]: g for g in groups if g["name"].split(":")[0].split(" (")[0] == rule.name}
        kinds = {k for k in ("firing", "not yet firing", "absent data") if any(n.split(": ", 1)[1].startswith(k) for n in cases)}
        assert kinds == {"firing", "not yet firing", "absent data"}, (rule.name, sorted(cases))
        for name, g in cases.items():
            checks = [c for c in g["alert_rule_test"] if c["alertname"] == rule.name]
            if name.split(": ", 1)[1].startswith("firing"):
                alerts = [a for c in checks for a in c["exp_alerts"]]
                assert alerts, (rule.name, name)
                for a in alerts:  # the twin's alert names its subject exactly as the native finding does
                    assert set(a["exp_labels"]) - {"severity"} == set(SUBJECT_LABELS[rule.subject]), (rule.name, name)
            else:
                assert any(c["exp_alerts"] == [] for c in checks), (rule.name, name)


@needs_promtool
def test_promtool_checks_and_passes_the_rule_files():
    files = [str(p) for p in sorted(RULES_DIR.glob("*.rules.yml"))]
    check = subprocess.run(["promtool", "check", "rules", *files], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("SUCCESS") == len(files)
    tests = [str(p) for p in sorted((RULES_DIR / "tests").glob("*.test.yml"))]
    run = subprocess.run(["promtool", "test", "rules", *tests], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


def test_docs_rules_md_names_every_rule_and_every_threshold():
    import dataclasses

    from vgpumon.config.thresholds import Thresholds

    text = (ROOT / "docs" / "rules.md").read_text()
    for rule in RULES:
        assert f"| {rule.name} | {rule.severity} | {rule.subject} |" in text, rule.name
    for f in dataclasses.fields(Thresholds):
        key = "for" if f.name == "for_seconds" else f.name
        assert f"`{key}`" in text, key
