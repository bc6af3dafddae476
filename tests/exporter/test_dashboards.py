"""The committed dashboards: generated from the catalogue (regenerating gives the same bytes), read
back by the Grafana SDK's own models, and free of the mistakes seen in the wild (FACTS §7) — a
metric the agent does not export, a counter graphed raw, a ratio dividing by zero, a stat summing
its range, a percentage summed across servers, MiB shown as SI megabytes, a query padded with
``or vector(0)``. That every query returns data is tests/exporter/test_prometheus_e2e.py's job."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT

from vgpumon import catalogue, dashboards
from vgpumon.dashboards import kit

DIR = ROOT / "dashboards"
DOCS = {name: json.loads((DIR / name).read_text()) for name in dashboards.DASHBOARDS}
FAMILIES = catalogue.families()
COUNTERS = {name for name, (typ, _) in FAMILIES.items() if typ == "counter"}
UNITS = {f.prometheus: f.unit for f in catalogue.FIELDS if f.prometheus}


def _all_queries():
    return [(name, p, t) for name, doc in DOCS.items() for p, t in dashboards.queries(doc)]


def test_regenerating_gives_the_committed_files_byte_for_byte():
    rendered = dashboards.render()
    assert {p.name for p in DIR.glob("*.json")} == set(rendered)
    for name, text in rendered.items():
        assert (DIR / name).read_text() == text, f"run: vgpumon dashboards build ({name} differs)"


def test_build_check_fails_on_a_hand_edited_dashboard(tmp_path):
    out = tmp_path / "d"
    run = [sys.executable, "-m", "vgpumon", "dashboards", "build", "--out", str(out)]
    assert subprocess.run(run, capture_output=True).returncode == 0
    assert subprocess.run([*run, "--check"], capture_output=True).returncode == 0
    (out / "gpu-fleet.json").write_text((out / "gpu-fleet.json").read_text().replace('"bytes"', '"decmbytes"'))
    res = subprocess.run([*run, "--check"], capture_output=True, text=True)
    assert res.returncode == 1 and "gpu-fleet.json differs" in res.stderr


def _subset(ours, theirs, where="$"):
    if isinstance(ours, dict):
        assert isinstance(theirs, dict), where
        for k, v in ours.items():
            assert k in theirs, f"{where}.{k} is lost when the SDK reads the dashboard"
            _subset(v, theirs[k], f"{where}.{k}")
    elif isinstance(ours, list):
        assert isinstance(theirs, list) and len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _subset(a, b, f"{where}[{i}]")
    else:
        assert ours == theirs, where


@pytest.mark.parametrize("name", list(DOCS))
def test_the_sdk_reads_back_every_field_we_wrote(name):
    """Grafana's own schema models (grafana-foundation-sdk 11.6) parse each dashboard without
    losing a field: panel types, options, targets and variables are ones Grafana 11.6 knows."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    back = json.loads(json.dumps(Dashboard.from_json(DOCS[name]), cls=JSONEncoder))
    _subset(DOCS[name], back)
    assert back["schemaVersion"] >= 39  # Grafana 11


def test_four_dashboards_with_their_variables():
    titles = {doc["title"] for doc in DOCS.values()}
    assert titles == {"GPU fleet", "GPU host detail", "vLLM serving", "PCIe capacity"}
    for name, doc in DOCS.items():
        variables = {v["name"]: v for v in doc["templating"]["list"]}
        assert set(variables) == {"datasource", "host", "gpu", "model"}, name
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        for v in ("host", "gpu", "model"):
            # All = .*: also matches a series without the label (a vLLM server whose model is not known yet)
            assert variables[v]["includeAll"] and variables[v]["allValue"] == ".*", (name, v)
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids)), name


def test_every_query_reads_only_metrics_the_catalogue_exports():
    for name, panel, target in _all_queries():
        names = dashboards.metric_names(target["expr"])
        assert names, (name, panel["title"], target["expr"])
        assert names <= set(FAMILIES), f"{name} / {panel['title']}: {sorted(names - set(FAMILIES))} not exported"


def test_metric_name_reader_sees_through_promql():
    expr = ('sum by (hostname, port) (rate(vgpumon_gpu_pcie_replays_total{hostname=~"$host", gpu!~"1e5"}[$__rate_interval]) '
            '* on (hostname, uuid) group_right vgpumon_pcie_upstream_gpu_info) / on (hostname, port) '
            '(vgpumon_pcie_upstream_link_capacity_bytes_per_second > 0) == bool 1')
    assert dashboards.metric_names(expr) == {
        "vgpumon_gpu_pcie_replays_total", "vgpumon_pcie_upstream_gpu_info", "vgpumon_pcie_upstream_link_capacity_bytes_per_second",
    }


def test_every_query_filters_by_host_and_has_a_ref_id_and_the_datasource_variable():
    for name, panel, target in _all_queries():
        assert '"$host"' in target["expr"], (name, panel["title"])
        assert re.fullmatch(r"[A-Z]", target["refId"])
        assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_counters_only_through_rate_or_increase_over_the_rate_interval():
    for name, panel, target in _all_queries():
        expr = target["expr"]
        for counter in dashboards.metric_names(expr) & COUNTERS:
            for m in re.finditer(re.escape(counter) + r"\b", expr):
                before, after = expr[: m.start()], expr[m.end():]
                assert re.search(r"\b(rate|increase|irate)\($", before), f"{name} / {panel['title']}: raw counter {counter}"
                assert re.match(r"(\{[^}]*\})?\[\$__rate_interval\]\)", after), f"{name} / {panel['title']}: {counter} window"


def _group_end(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise AssertionError(f"unbalanced: {text}")


def test_ratios_divide_by_a_denominator_that_is_above_zero():
    for name, panel, target in _all_queries():
        expr = target["expr"]
        for m in re.finditer(r"\s/\s*(on\s*\([^)]*\)\s*)?(group_left\s*\(\)\s*)?", expr):
            start = m.end()
            assert expr[start] == "(", f"{name} / {panel['title']}: {expr}"
            group = expr[start: _group_end(expr, start) + 1]
            assert group.endswith(" > 0)"), f"{name} / {panel['title']}: divides by {group}"


def test_stat_and_bar_panels_show_the_last_value_never_a_sum_over_the_range():
    for name, doc in DOCS.items():
        for p in dashboards.panels(doc):
            if p["type"] in ("stat", "bargauge"):
                assert p["options"]["reduceOptions"]["calcs"] == ["lastNotNull"], (name, p["title"])


def test_no_query_is_padded_to_look_alive_and_no_percentage_is_summed():
    for name, panel, target in _all_queries():
        expr = target["expr"]
        assert "vector(" not in expr, (name, panel["title"])
        for m in re.finditer(r"\bsum\s*(by\s*\([^)]*\)\s*)?\(", expr):
            inner = expr[m.end(): _group_end(expr, m.end() - 1)]
            ratios = [n for n in dashboards.metric_names(inner) if UNITS.get(n) == "ratio"]
            assert ratios == [], f"{name} / {panel['title']}: sums a percentage {ratios}"


def test_units_come_from_the_catalogue_and_bytes_are_iec():
    assert kit.GRAFANA_UNITS["bytes"] == "bytes"  # Grafana's IEC bytes; decbytes/decmbytes are SI
    assert kit.GRAFANA_UNITS["ratio"] == "percentunit" and kit.GRAFANA_UNITS["bytes_per_second"] == "Bps"
    checked = 0
    for name, doc in DOCS.items():
        for p in dashboards.panels(doc):
            u = p["fieldConfig"]["defaults"].get("unit")
            assert u, (name, p["title"])
            assert not u.startswith("dec") or not u.endswith("bytes"), (name, p["title"], u)
            exprs = [t["expr"] for t in p["targets"]]
            # a panel of plain selectors shows its families' own unit
            plain = all(re.fullmatch(r"[a-z_0-9]+\{[^}]*\}( == 1)?", e) for e in exprs)
            names = {n for e in exprs for n in dashboards.metric_names(e)}
            if plain and not any(m.get("type") for m in p["fieldConfig"]["defaults"].get("mappings", [])):
                assert {kit.unit(n) for n in names} == {u}, (name, p["title"], u, names)
                checked += 1
            if any(UNITS.get(n) == "bytes" for n in names) and "/" not in " ".join(exprs):
                assert u == "bytes", (name, p["title"], u)
    assert checked > 30


def test_every_panel_says_what_it_shows():
    for name, doc in DOCS.items():
        for p in dashboards.panels(doc):
            if p["type"] != "stat" or p["title"] not in {"Compute mode", "MIG mode", "Persistence mode"}:
                assert p.get("description"), (name, p["title"])


def test_empty_panel_list_names_real_panels_each_with_a_reason():
    entries = yaml.safe_load((DIR / "empty-panels.yml").read_text())
    panels = {(doc["uid"], p["title"]) for doc in DOCS.values() for p in dashboards.panels(doc)}
    for e in entries:
        assert set(e) - {"may_have_data"} == {"dashboard", "panel", "reason"} and len(e["reason"]) > 20, e
        assert e.get("may_have_data", True) is True, e
        assert (e["dashboard"], e["panel"]) in panels, e


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed")
def test_fleet_tiles_count_a_stopped_hosts_gpus_as_not_readable(tmp_path):
    """Two hosts of two GPUs; GPU 1 of host b is lost (up 0); host a's agent stops at 30 min and
    its series go stale. The fleet's "now" tiles, as committed, evaluated by Prometheus' own
    engine (promtool): before the stop 3 readable and 1 not; after it host a's GPUs are not
    readable (1 + 2), never still readable at their last value nor gone from both tiles."""
    panels = {p["title"]: p for p in dashboards.panels(DOCS["gpu-fleet.json"])}
    expr = {t: panels[t]["targets"][0]["expr"].replace("$host", ".*").replace("$gpu", ".*") for t in ("GPUs readable", "GPUs not readable")}
    assert all(panels[t]["targets"][0].get("instant") for t in expr)  # now, not the range's last non-null value
    series = []
    for host, gpu, up in (("a", "0", "1x30 stale"), ("a", "1", "1x30 stale"), ("b", "0", "1x60"), ("b", "1", "0x60")):
        labels = f'hostname="{host}", gpu="{gpu}", uuid="GPU-{host}{gpu}", job="vgpumon"'
        info = "1x30 stale" if host == "a" else "1x60"
        series += [{"series": f"vgpumon_gpu_up{{{labels}}}", "values": up}, {"series": f"vgpumon_gpu_info{{{labels}}}", "values": info}]

    def case(at: str, readable: int, not_readable: int) -> list[dict]:
        return [{"expr": expr["GPUs readable"], "eval_time": at, "exp_samples": [{"labels": "{}", "value": readable}]},
                {"expr": expr["GPUs not readable"], "eval_time": at, "exp_samples": [{"labels": "{}", "value": not_readable}]}]

    test = {"rule_files": [], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": case("10m", 3, 1) + case("45m", 1, 3)}]}
    path = tmp_path / "tiles.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    run = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
