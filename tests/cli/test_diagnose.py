"""``vgpumon diagnose`` as the on-call engineer meets it: the 8-GPU incident derived from the recorded
H200 captures (ECC on GPU 3, XID 79 and then lost on GPU 5, application XIDs on GPU 2) answers in
its first lines, keeps its CRITICAL when the agent died an hour ago, and says what each XID means
and what to do; a host nobody answers for is one line and exit 3."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from conftest import DATA, H200_CAPTURE, KEEP_ALL, vgpumon
from shape_support import mismatches

from vgpumon.catalogue.gpu import XID_NAMES
from vgpumon.catalogue.xid import XIDS
from vgpumon.diagnose import HEALTH_AREAS, NOT_HEALTH, Report, unknown_report
from vgpumon.diagnose.report import alert_record
from vgpumon.model import Alert
from vgpumon.rules.catalogue import RULES
from vgpumon.rules.gpu import CRITICAL_XIDS, WARNING_XIDS
from vgpumon.testing import incident, scenarios
from vgpumon.testing.vllm import free_port

pytestmark = pytest.mark.slow  # starts processes or servers: not in the quick subset (docs/testing.md)

HOST = "gpu-host-17"


run = vgpumon


def _replay(url: str, tmp_path: Path, header: dict, ticks, *, sysfs: bool = True) -> None:
    """The capture through ``vgpumon agent`` (rules on, as an operator runs it)."""
    cap = tmp_path / "capture.jsonl.gz"
    scenarios.write(cap, header, ticks)
    extra = ["--sysfs", str(incident.sysfs_tree(DATA, tmp_path / "sys"))] if sysfs else []
    out = run("agent", "--replay", str(cap), "--db", url, "--hostname", HOST, "--listen", "off", *extra)
    assert out.returncode == 0, out.stderr


@pytest.fixture(scope="module")
def incident_db(tmp_path_factory) -> str:
    """The incident replayed once into SQLite for the tests that only read it."""
    tmp = tmp_path_factory.mktemp("incident")
    url = f"sqlite:///{tmp / 'incident.db'}"
    _replay(url, tmp, *incident.build(DATA))
    return url


def test_the_incident_answers_in_its_first_five_lines_and_exits_2(db_url, tmp_path):
    """Acceptance: CRITICAL, the lost GPU and the XID 79 GPU with its meaning and action are in the
    first five lines (they were the last line of 13-line blocks, 110 lines down)."""
    _replay(db_url, tmp_path, *incident.build(DATA))
    out = run("diagnose", HOST, "--db", db_url)
    assert out.returncode == 2, out.stdout + out.stderr
    head = out.stdout.splitlines()[:5]
    assert head[0].startswith(f"CRITICAL {HOST}"), head
    lost = [line for line in head if f"GPU {incident.LOST_GPU}:" in line and "lost now" in line]
    assert lost and "GPU is lost" in lost[0], head  # with NVML's reason, not "11 of 76 ticks"
    xid = [line for line in head if f"GPU {incident.LOST_GPU}:" in line and "XID 79" in line]
    assert xid and "fallen off the bus" in xid[0] and "reboot the node" in xid[0], head  # meaning and action
    assert any(f"GPU {incident.ECC_GPU}:" in line and "uncorrectable ECC" in line for line in head), head
    # the health table: the lost GPU's thermal and power are not PASS from its last readings
    (row,) = [line for line in out.stdout.splitlines() if line.split()[:2] == [str(incident.LOST_GPU), "FAIL"]]
    assert row.count("UNKNOWN (GPU lost)") >= 3 and "PASS" not in row, row


def test_each_finding_names_its_gpu_evidence_start_meaning_and_next_step(incident_db):
    rep = json.loads(run("diagnose", HOST, "--db", incident_db, "--json").stdout)
    assert rep["status"] == "critical" and rep["verdict"]["status"] == "critical"
    severities = [f["severity"] for f in rep["findings"]]
    assert severities == sorted(severities, key=["critical", "warning", "unknown", "info"].index)  # most severe first
    (xid79,) = [f for f in rep["findings"] if f["alert"] == "GpuXidCritical"]
    gpu = xid79["gpu"]
    assert gpu["index"] == incident.LOST_GPU and gpu["uuid"].endswith("05") and gpu["serial"] and gpu["pci_bus_id"]
    (code,) = xid79["xids"]
    assert code["code"] == 79 and code["meaning"] == "GPU has fallen off the bus" and code["bucket"] == "RESTART_BM"
    ticks = {t["tick"]: t["ts"] for t in incident.build(DATA)[1] if t["tick"] >= 0}
    assert code["first_ts"] == pytest.approx(ticks[incident.LOST_AT], abs=0.01)  # the event's own time
    assert xid79["since_exact"] and xid79["since_ts"] == pytest.approx(ticks[incident.LOST_AT], abs=0.01)
    (lost,) = [f for f in rep["findings"] if f["alert"] == "GpuLost"]
    assert lost["severity"] == "critical" and "GPU is lost" in lost["message"]
    assert lost["since_ts"] == pytest.approx(ticks[incident.LOST_AT + 1], abs=0.01)
    (ecc,) = [f for f in rep["findings"] if f["alert"] == "GpuEccUncorrectable"]
    assert ecc["gpu"]["index"] == incident.ECC_GPU and "2 volatile uncorrectable" in ecc["message"]
    assert "Drain the GPU" in ecc["next_step"] and f"-i {incident.ECC_GPU}" in ecc["next_step"] and ecc["meaning"]
    # the per-GPU table and health: SM activity beside utilization, areas failing where the findings are
    g5 = rep["gpus"][incident.LOST_GPU]
    assert g5["readable"]["now"] is False and g5["readable"]["reason"] == "GPU is lost"
    assert g5["health"]["readable"]["status"] == "FAIL" and g5["health"]["xid"]["status"] == "FAIL"
    # its other areas are not PASS from the readings before it fell off the bus
    for area in ("memory", "pcie", "thermal", "power"):
        assert (g5["health"][area]["status"], g5["health"][area]["reason"]) == ("UNKNOWN", "GPU lost"), (area, g5["health"])
    assert rep["gpus"][incident.ECC_GPU]["health"]["memory"]["status"] == "FAIL"
    assert rep["gpus"][0]["health"] == {a: {**h, "status": "PASS"} for a, h in rep["gpus"][0]["health"].items()}
    assert rep["gpus"][0]["sm_active"]["max_ratio"] > 0.9 and rep["gpus"][0]["utilization"]["max_ratio"] == 1.0
    # the application XIDs never page, and are explained as the application's
    (x31,) = [x for x in rep["xids"] if x["code"] == 31]
    assert x31["by_application"] and x31["events"][0]["gpu"] == incident.APP_XID_GPU


def test_an_hour_old_critical_stays_critical_and_says_its_age(tmp_path):
    """Acceptance: the agent died an hour ago; monitoring asks with --max-age 2m. The known
    CRITICAL stays (exit 2) and the report says the data is an hour old; the same age without
    anything wrong is UNKNOWN (exit 3): stale answers UNKNOWN only when nothing worse is known."""
    header, ticks = incident.build(DATA)
    ticks = list(ticks)
    last = max(t["ts"] for t in ticks if t["ts"] is not None)
    url = f"sqlite:///{tmp_path / 'old.db'}"
    _replay(url, tmp_path, *scenarios.shift(header, ticks, time.time() - 3600 - last))
    out = run("diagnose", HOST, "--db", url, "--max-age", "2m")
    assert out.returncode == 2, out.stdout
    first = out.stdout.splitlines()[0]
    # an hour, plus however long the replay and this report took (a minute or two when loaded)
    an_hour = re.compile(r"\b6[0-3] min (ago|old)")
    assert first.startswith(f"CRITICAL {HOST}") and an_hour.search(first) and "STALE" in first, first
    rep = json.loads(run("diagnose", HOST, "--db", url, "--max-age", "2m", "--json").stdout)
    assert rep["freshness"]["stale"] and 3590 < rep["freshness"]["age_seconds"] < 3600 + 240
    (stale,) = [f for f in rep["findings"] if f.get("kind") == "stale"]
    assert stale["severity"] == "unknown" and an_hour.search(stale["message"]), stale["message"]
    # nothing worse known: UNKNOWN
    quiet_header, quiet_ticks = scenarios.load(str(H200_CAPTURE))
    quiet_ticks = list(quiet_ticks)
    quiet_last = max(t["ts"] for t in quiet_ticks if t["ts"] is not None)
    quiet = f"sqlite:///{tmp_path / 'quiet.db'}"
    _replay(quiet, tmp_path, *scenarios.shift(quiet_header, quiet_ticks, time.time() - 3600 - quiet_last), sysfs=False)
    out = run("diagnose", HOST, "--db", quiet, "--max-age", "2m")
    assert out.returncode == 3 and out.stdout.startswith(f"UNKNOWN {HOST}"), out.stdout
    assert an_hour.search(out.stdout.splitlines()[1]), out.stdout
    assert run("diagnose", HOST, "--db", quiet).returncode == 0  # without --max-age: a post-mortem, OK


def test_since_looks_back_past_the_window(incident_db):
    """A 20 s window sees only GPU 5's end; --since 2m brings GPU 2's application XIDs (ticks 20,
    21) back into the XID table and stretches the trends over the whole run."""
    short = json.loads(run("diagnose", HOST, "--db", incident_db, "--window", "20s", "--json").stdout)
    assert {x["code"] for x in short["xids"]} <= {79}
    back = json.loads(run("diagnose", HOST, "--db", incident_db, "--window", "20s", "--since", "2m", "--json").stdout)
    assert {x["code"] for x in back["xids"]} == {13, 31, 79}
    assert back["lookback"]["seconds"] == pytest.approx(120)
    assert len(back["trends"]["gpus"][0]["memory_used_bytes"]) == 40
    bad = run("diagnose", HOST, "--db", incident_db, "--since", "yesterday")
    assert bad.returncode == 64 and "neither a duration nor a time" in bad.stderr


def test_json_carries_what_the_terminal_shows(incident_db):
    text = run("diagnose", HOST, "--db", incident_db).stdout
    rep = json.loads(run("diagnose", HOST, "--db", incident_db, "--json").stdout)
    for key in ("verdict", "findings", "gpus", "vllm", "processes", "trends", "xids", "freshness", "alert_history"):
        assert key in rep
    for section in ("Findings, most severe first", "SM act.", "util.", "Health (DCGM-style)", "vLLM servers",
                    "GPU processes", "Trends", "XIDs in the look-back", "Data freshness"):
        assert section in text, section
    peak = rep["trends"]["gpus"][0]["pcie_peak"]
    assert peak["direction"] == "rx" and peak["share_of_max_link"] > 0.9  # the recorded 55 GB/s copies


def test_the_json_is_the_report_its_schema_declares(incident_db):
    """``--json`` as monitoring and scripts read it: every key ``vgpumon.diagnose.schema.Report``
    declares, of its type, and no other — the incident, its look-back, stale, an unknown host and
    a report from the store asked for stacks."""
    for args in ((), ("--window", "20s", "--since", "2m"), ("--max-age", "1s"), ("--stacks",)):
        rep = json.loads(run("diagnose", HOST, "--db", incident_db, "--json", *args).stdout)
        assert rep["gpus"] and mismatches(rep, Report) == [], args
    nobody = json.loads(run("diagnose", "nobody", "--db", incident_db, "--json").stdout)
    assert nobody["window"] is None and mismatches(nobody, Report) == []
    assert mismatches(unknown_report(HOST, "the agent refused"), Report) == []


def test_the_reports_alerts_are_the_alerts_own_json():
    """The report's ``alerts`` carry what ``Alert.as_dict`` writes for the webhook sink, key for
    key and in its order (the report builds them typed; this holds the two together)."""
    a = Alert(name="GpuPcieSaturated", severity="warning", labels={"hostname": HOST, "gpu": "0", "uuid": "GPU-0"},
              state="firing", active_since=10.0, last_eval=70.0, summary="s", description="d", runbook_url="u",
              value=0.9, fired_at=40.0, resolved_at=None, id=3)
    assert list(alert_record(a).items()) == list(a.as_dict().items())


def test_every_gpu_rule_has_a_health_area_or_is_usage():
    gpu_rules = {r.name for r in RULES if r.subject in ("gpu", "gpu_process")}
    placed = {r for rules in HEALTH_AREAS.values() for r in rules} | set(NOT_HEALTH)
    assert gpu_rules == placed


def test_every_xid_the_rules_or_metrics_name_has_a_meaning_and_an_action():
    for code in {*CRITICAL_XIDS, *WARNING_XIDS, *XID_NAMES}:
        x = XIDS[code]
        assert x.meaning and x.action and x.bucket and x.mnemonic, code


def test_an_unreachable_host_is_one_line_and_unknown(tmp_path):
    """Nothing listens at the agent's port and no store knows the host: exit 3, one line that says
    both, nothing else."""
    port = free_port()
    env = {"VGPUMON_DB": f"sqlite:///{tmp_path / 'none.db'}", "VGPUMON_CONFIG": str(tmp_path / "none.toml")}
    (tmp_path / "none.toml").write_text("")
    out = run("diagnose", f"127.0.0.1:{port}", env=env)
    assert out.returncode == 3
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    # (127.0.0.1 is this machine: its store name is the local host name, as for `localhost`)
    assert lines[0].startswith("UNKNOWN ") and f"agent at 127.0.0.1:{port} unreachable (connection refused)" in lines[0]
    assert "no store at" in lines[0]
    assert "Traceback" not in out.stderr


def test_an_unreachable_agent_falls_back_to_the_store_with_a_note(incident_db):
    port = free_port()
    out = run("diagnose", f"{HOST}:{port}", env={"VGPUMON_DB": incident_db})
    # the host name does not resolve here: the agent is unreachable, the shared store answers
    assert out.returncode == 2
    assert out.stdout.startswith(f"CRITICAL {HOST}")
    assert f"agent at {HOST}:{port} unreachable" in out.stdout and "reported from the store" in out.stdout


def test_counters_read_before_the_last_two_minutes_come_from_the_rollups(tmp_path):
    """A GPU's newest ECC count is read from the newest raw rows when they hold one, else from
    the 1-minute rollups (a post-mortem an hour after the agent died still shows GPU 3's two
    uncorrectable errors, with the minute they were read in)."""
    from vgpumon.store import Store

    url = f"sqlite:///{tmp_path / 'incident.db'}"
    _replay(url, tmp_path, *incident.build(DATA), sysfs=False)
    assert run("db", "prune", "--db", url, *KEEP_ALL).returncode == 0  # rolls every minute up; raw rows stay
    store = Store(url, read_only=True)
    try:
        gpus = {g.identity.index: g.id for g in store.gpus_of(HOST)}
        end = store.newest_ts(list(gpus.values()))
        col = "ecc_uncorrected_volatile_total"
        recent = store.last_values_many(list(gpus.values()), end, [col])
        later = store.last_values_many(list(gpus.values()), end + 3600, [col])
    finally:
        store.close()
    ts, value = recent[gpus[incident.ECC_GPU]][col]
    assert value == 2 and end - ts < 10  # the slow set's newest read
    minute_ts, minute_value = later[gpus[incident.ECC_GPU]][col]
    assert minute_value == 2 and minute_ts <= ts and ts - minute_ts < 60  # its minute's rollup
    assert later[gpus[0]][col][1] == 0
