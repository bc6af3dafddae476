"""PCIe rules on the recorded H200 copy phase: one card saturating its Gen5 x16 link, sixteen cards
each carrying a modest load that together saturate the switch and root ports they share, and the
copy phase that reads utilization 100 % with SMs at 0 but is busy, not stuck."""

from __future__ import annotations

import json

from conftest import DATA, H200_CAPTURE, phase
from rules_support import PCIE_GPM, at_end, copy_phase, firing, replay, stored_alerts

from vgpumon.config.thresholds import Thresholds
from vgpumon.diagnose import build_report
from vgpumon.diagnose.render import render_diagnose
from vgpumon.model import GpuIdentity
from vgpumon.store import Store
from vgpumon.testing import scenarios, sysfs

REAL_SYSFS = json.loads((DATA / "h200-sysfs.json").read_text())


def test_recorded_copy_phase_for_10_minutes_saturates_its_gen5_x16_link_and_is_not_stuck(db_url):
    header, ticks = copy_phase(minutes=10)
    agent = replay(db_url, header, ticks)
    assert agent.stats.ticks >= 600
    alerts = stored_alerts(db_url)
    (sat,) = firing(alerts, "GpuPcieSaturated")
    assert sat.labels == {"hostname": "h", "gpu": "0", "uuid": "GPU-00000000-0000-4000-8000-000000000000"}
    assert "of the Gen5 x16 max link (63.0 GB/s per direction" in sat.description
    assert 0.85 <= sat.value <= 1.0  # counters read 94-96 % of the ceiling under a pure copy (FACTS §1)
    assert sat.fired_at - sat.active_since >= 300  # pending for its 5 minutes first
    # utilization 99-100 % with every GPM engine at 0 — but ~59 GB/s over PCIe: busy, not stuck
    assert firing(alerts, "GpuStuck") == []
    by_rule, _ = at_end(db_url)
    (stuck,) = by_rule["GpuStuck"]
    assert stuck.state == "ok" and stuck.evidence["util"] in ("99 %", "100 %")
    store = Store(db_url)
    try:
        report = build_report(store, "h", window_seconds=600)
    finally:
        store.close()
    assert report["status"] == "warning"
    assert [f["alert"] for f in report["gpus"][0]["findings"] if f["severity"] == "warning"] == ["GpuPcieSaturated"]


def _sixteen(tmp_path, per_switch: int):
    # each card carries 12 % of the recorded copy (~7 GB/s of its 63 GB/s link)
    header, ticks = copy_phase(minutes=7, devices=16)
    header, ticks = scenarios.scale_gpm(header, ticks, PCIE_GPM, 0.12)
    gpus = [GpuIdentity(index=i, uuid=f"u{i}", pci_bus_id=f"00000000:{scenarios.bus_number(i, 16):02X}:00.0") for i in range(16)]
    root = sysfs.materialize(sysfs.switch_tree(REAL_SYSFS, gpus, per_switch=per_switch), tmp_path / "sys")
    return header, ticks, root


def test_sixteen_modest_cards_behind_two_switches_saturate_the_shared_uplinks_and_name_them(tmp_path):
    """The 16-card host of our story: two switches of eight cards, each switch on its own root
    port. No card is near its own link; each switch's uplink (and root port) carries eight."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    header, ticks, root = _sixteen(tmp_path, per_switch=8)
    replay(url, header, ticks, sysfs_root=root)
    alerts = stored_alerts(url)
    uplinks = firing(alerts, "PcieUplinkSaturated")
    assert sorted(a.labels["port"] for a in uplinks) == ["0000:00:01.0", "0000:00:03.0", "0000:10:00.0", "0000:20:00.0"]
    first = next(a for a in uplinks if a.labels["port"] == "0000:00:01.0")
    assert first.description.startswith("The 8 GPUs behind root port 0000:00:01.0 (0, 1, 2, 3, 4, 5, 6, 7) together moved")
    assert "Gen5 x16 link (63.0 GB/s per direction)" in first.description
    assert 0.8 <= first.value <= 1.0
    assert firing(alerts, "GpuPcieSaturated") == []  # each card alone is far from its link


def test_the_same_sixteen_cards_behind_four_switches_stay_below_the_uplinks(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    header, ticks, root = _sixteen(tmp_path, per_switch=4)
    replay(url, header, ticks, sysfs_root=root)
    assert firing(stored_alerts(url), "PcieUplinkSaturated") == []
    by_rule, _ = at_end(url)
    assert {f.state for f in by_rule["PcieUplinkSaturated"]} == {"ok"}
    assert len(by_rule["PcieUplinkSaturated"]) == 8  # four root ports and four switch uplinks, each judged


def test_an_alert_still_firing_when_the_agent_stopped_is_in_the_post_mortem(tmp_path):
    """The agent stopped while GpuPcieSaturated fired (7 min of the recorded copy, then 62 s of the
    recorded idle; PCIe window 60 s, as on the H200 run that found it): the stored episode has no
    end. Evaluated at the data's end the link is quiet again, so the report's own evaluation
    no longer sees it — the report still shows the episode the agent paged for, in its headline,
    its history and its JSON, and its status (the exit code) judges the end: OK."""
    th = Thresholds(pcie_window_seconds=60.0)
    idle = phase("idle")
    header, ticks = copy_phase(minutes=7)
    _, rest = scenarios.between(*scenarios.load(str(H200_CAPTURE)), idle["start"] + 1.2, idle["end"])
    _, rest = scenarios.repeat({}, rest, 10)
    header, ticks = scenarios.then(header, ticks, [t for t in rest if t["tick"] < 62])
    url = f"sqlite:///{tmp_path / 'x.db'}"
    replay(url, header, ticks, thresholds=th)
    (sat,) = firing(stored_alerts(url), "GpuPcieSaturated")
    assert sat.state == "firing" and sat.resolved_at is None  # open when the agent stopped
    store = Store(url)
    try:
        report = build_report(store, "h", window_seconds=600, thresholds=th)
    finally:
        store.close()
    assert report["status"] == "ok" and report["alerts"] == []  # at the end: quiet again
    (episode,) = report["alert_history"]
    assert (episode["name"], episode["gpu"], episode["open_at_last_evaluation"]) == ("GpuPcieSaturated", 0, True)
    assert episode["last_evaluated_at"] >= episode["fired_at"]
    (earlier,) = report["verdict"]["earlier"]
    assert (earlier["name"], earlier["severity"], earlier["resolved_at"]) == ("GpuPcieSaturated", "warning", None)
    text = render_diagnose(report, width=200)
    headline = text.splitlines()[0]
    assert "nothing to act on" not in text
    assert "nothing firing now; 1 warning earlier in the window: GpuPcieSaturated GPU 0 from " in headline, headline
    assert "open at the agent's last evaluation" in headline
    assert "still firing at the agent's last evaluation" in text
    # the stored lifecycle is what is shown, and the report says so
    assert report["evaluation"]["by"] == "agent" and report["evaluation"]["alert_rows"] >= 1
    assert report["evaluation"]["agent_last_evaluation"] is not None
    assert "Alert lifecycle: the agent's stored alert lifecycle" in text
    assert "diagnose's own evaluation" not in text


def test_without_alert_rows_the_report_says_its_verdicts_are_its_own_evaluation(tmp_path):
    """The recorded copy phase stored by an agent with its rules off: no alert rows. diagnose's
    own evaluation of the stored window fills in (GpuPcieSaturated at the end), and the text and
    the JSON say that these verdicts are diagnose's, not an agent's."""
    header, ticks = copy_phase(minutes=7)
    url = f"sqlite:///{tmp_path / 'x.db'}"
    replay(url, header, ticks, rules=False)
    assert stored_alerts(url) == []
    store = Store(url)
    try:
        report = build_report(store, "h", window_seconds=600)
    finally:
        store.close()
    assert [a["name"] for a in report["alerts"] if a["state"] == "firing"] == ["GpuPcieSaturated"]
    ev = report["evaluation"]
    assert (ev["by"], ev["alert_rows"], ev["agent_last_evaluation"]) == ("diagnose", 0, None)
    assert json.loads(json.dumps(report))["evaluation"] == ev
    headline = render_diagnose(report, width=300).splitlines()[0]
    assert "verdicts from diagnose's own evaluation of the stored window: no agent evaluated" in headline, headline
