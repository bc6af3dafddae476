"""``vgpumon capacity``, the PCIe headroom review before cards are added: a 16-card host whose two
switch groups carry 13 GB/s each over Gen3 x16 uplinks is saturated with no headroom; half the
load leaves room for seven more cards per switch; the recorded 8-GPU incident's copy phase
saturates its Gen5 switches; the review's HTML has its plots, or says which extra it needs."""

from __future__ import annotations

import json

import pytest
from conftest import DATA, KEEP_ALL, vgpumon
from shape_support import mismatches

from vgpumon.capacity import review
from vgpumon.capacity.schema import Review
from vgpumon.store import Store, open_store
from vgpumon.testing import capacity, incident, scenarios

pytestmark = pytest.mark.slow  # starts processes or servers: not in the quick subset (docs/testing.md)

GEN3_X16 = 8e9 * 128 / 130 * 16 / 8  # FACTS §3: 15.75 GB/s per direction (128b/130b at 8 GT/s, 16 lanes)


run = vgpumon


def _host(url: str, name: str = "gpu-host-16", **kw) -> None:
    store = open_store(url)
    try:
        capacity.write_host(store, name, **kw)
    finally:
        store.close()


def test_two_switch_groups_at_13_gb_s_over_gen3_uplinks_are_saturated_without_headroom(db_url):
    """Acceptance: each switch's eight cards move 13 GB/s at p95 over a Gen3 x16 uplink
    (15.75 GB/s): 83 %, saturated; adding cards only makes it worse; no headroom."""
    _host(db_url)
    out = run("capacity", "gpu-host-16", "--db", db_url, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert mismatches(doc, Review) == []  # the keys and types vgpumon.capacity.schema declares
    (host,) = doc["hosts"]
    switches = {p["port"]: p for p in host["shared"] if p["kind"] == "bridge"}
    assert set(switches) == {"0000:10:00.0", "0000:20:00.0"}
    for p in switches.values():
        assert p["cards"] == 8 and p["link_max"] == {"generation": 3, "width": 16, "capacity_bytes_per_second": pytest.approx(GEN3_X16, rel=1e-3)}
        assert p["rx"]["p95_bytes_per_second"] == pytest.approx(13e9, rel=1e-6)
        assert p["p95_share"] == pytest.approx(13e9 / GEN3_X16, rel=1e-3) and p["saturated"]
        assert p["headroom_cards"] == 0
        assert [round(x["p95_share"], 3) for x in p["projections"]] == [round(13e9 * (8 + k) / 8 / GEN3_X16, 3) for k in (1, 2)]
    assert set(host["saturated"]) >= set(switches)
    g = host["gpus"][0]
    assert g["rx"]["p95_bytes_per_second"] == pytest.approx(13e9 / 8, rel=1e-6) and g["rx"]["p95_share_of_max_link"] < 0.11
    assert g["link_state"]["state"] == "at_max" and "slot Gen3 holds back a Gen5 card" in g["link_state"]["slot"]
    text = run("capacity", "gpu-host-16", "--db", db_url).stdout
    assert "SATURATED" in text and "82.5 % SATURATED" in text
    assert ("bridge 0000:10:00.0: adding 2 cards with the current per-card load brings the shared link to 103.1 % at p95 "
            "(saturated from 80.0 %; no headroom)") in text


def test_half_the_load_leaves_room_for_seven_cards_a_switch(tmp_path):
    url = f"sqlite:///{tmp_path / 'half.db'}"
    _host(url, rx_per_card=6.5e9 / 8)
    _host(url, "gpu-host-99", rx_per_card=6.5e9 / 8, cards=8)
    review = json.loads(run("capacity", "--db", url, "--json", "--add", "4").stdout)
    assert [h["host"] for h in review["hosts"]] == ["gpu-host-16", "gpu-host-99"]  # every host, with no argument
    (p, *_) = [p for p in review["hosts"][0]["shared"] if p["port"] == "0000:10:00.0"]
    assert not p["saturated"] and p["p95_share"] == pytest.approx(6.5e9 / GEN3_X16, rel=1e-3)
    assert p["headroom_cards"] == 7  # floor(0.8 × 15.75 / 0.8125) − 8
    assert p["projections"][-1] == {"add": 4, "p95_share": pytest.approx(6.5e9 * 12 / 8 / GEN3_X16, rel=1e-3)}
    missing = run("capacity", "nope", "--db", url)
    assert missing.returncode == 64 and "nope is not in the store" in missing.stderr  # a mistyped host is a usage error


def test_the_recorded_copy_phase_saturates_each_card_and_its_shared_switches_are_impossible(tmp_path):
    """The 8-GPU incident (four cards per Gen5 x16 switch, every card replaying the recorded H200
    copy at once), rolled up by `vgpumon db prune`. Each card alone is at 84 % of its own Gen5 x16
    link at p95: saturated, by GpuPcieSaturated's 80 %. Four of them below one Gen5 x16 switch
    make 337 % of its link: no link carries that, so the review calls it impossible and names
    the topology and link speed to check, not SATURATED (the incident's switches are derived,
    not measured)."""
    url = f"sqlite:///{tmp_path / 'incident.db'}"
    cap = tmp_path / "incident.jsonl.gz"
    scenarios.write(cap, *incident.build(DATA))
    assert run("agent", "--replay", str(cap), "--db", url, "--listen", "off", "--hostname", "h8",
               "--sysfs", str(incident.sysfs_tree(DATA, tmp_path / "sys"))).returncode == 0
    assert run("db", "prune", "--db", url, *KEEP_ALL).returncode == 0
    doc = json.loads(run("capacity", "h8", "--db", url, "--json").stdout)
    assert mismatches(doc, Review) == []
    (host,) = doc["hosts"]
    switches = [p for p in host["shared"] if p["kind"] == "bridge"]
    assert len(switches) == 2 and all(p["cards"] == 4 for p in switches)
    assert all(p["rx"]["max_bytes_per_second"] > 3 * p["link_max"]["capacity_bytes_per_second"] for p in switches)
    for p in switches:
        assert p["p95_share"] > 3.3 and not p["saturated"] and p["port"] in host["impossible"], p
        assert "topology" in p["impossible"] and "max_link_speed" in p["impossible"], p["impossible"]
    assert host["saturated"] == []  # nothing shared is merely saturated
    card = host["gpus"][0]
    assert card["rx"]["max_share_of_max_link"] > 0.9  # one card alone nearly fills its own Gen5 link
    assert 0.8 <= card["rx"]["p95_share_of_max_link"] < 1.0 and card["saturated"] and card["impossible"] is None
    assert host["saturated_gpus"] == list(range(8))
    text = run("capacity", "h8", "--db", url, env={"COLUMNS": "200"}).stdout
    assert "84.3 % SATURATED" in text and "337.4 % IMPOSSIBLE" in text and " SATURATED:" in text, text
    assert "bridge 0000:10:00.0: IMPOSSIBLE, p95 at 337 % of the Gen5 x16 link" in text, text
    assert "adding 2 cards" not in text  # no projection from an impossible figure


def test_html_review_has_its_plots(tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    _host(url)
    page = tmp_path / "review.html"
    out = run("capacity", "--db", url, "--html", str(page))
    assert out.returncode == 0, out.stderr
    text = page.read_text()
    assert "gpu-host-16" in text and "Plotly.newPlot" in text and "headroom" in text
    assert "<script src=" not in text and len(text) > 1_000_000  # plotly.js embedded: the file opens offline
    store = Store(url, read_only=True)
    try:  # what the plots are drawn from: the review with its series, as declared
        plotted = review(store, series=True)
    finally:
        store.close()
    assert plotted["hosts"][0]["gpus"][0]["series"]["rx"] and mismatches(plotted, Review) == []


def test_html_without_plotly_says_which_extra(tmp_path):
    """plotly is an optional extra: without it, --html is one line naming the extra (exit 69),
    and the terminal review still works."""
    blocker = tmp_path / "blocker"
    (blocker / "plotly").mkdir(parents=True)
    (blocker / "plotly" / "__init__.py").write_text("raise ImportError('plotly is not installed here')\n")
    url = f"sqlite:///{tmp_path / 'c.db'}"
    _host(url)
    env = {"PYTHONPATH": str(blocker)}
    out = run("capacity", "--db", url, "--html", str(tmp_path / "x.html"), env=env)
    assert out.returncode == 69 and out.stderr.strip() == (
        "vgpumon: --html needs plotly: pip install 'vgpumon[html]' (the terminal and --json reviews need nothing more)")
    assert not (tmp_path / "x.html").exists()
    assert run("capacity", "--db", url, env=env).returncode == 0
