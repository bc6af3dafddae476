"""One verdict everywhere, end to end: an agent replays the 8-GPU incident derived from the recorded
H200 captures (application XIDs on GPU 2, uncorrectable ECC on GPU 3, XID 79 and then the loss of
GPU 5) with its rules on, a real Prometheus (Debian's 2.42) scrapes it every second with the
generated rule files. While the agent runs, four faces are read until they agree or the replay
ends: ``vgpumon diagnose`` answered by the agent, the agent's ``/api/v1/alerts``, its ``/metrics``
(``vgpumon_alerts``) and Prometheus' ``ALERTS`` of the twins. Each says which of the four alert
kinds fire on which GPU; the test prints every difference and fails on one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from conftest import DATA
from exporter_support import Scrape
from prometheus_support import start_prometheus

from vgpumon.testing import incident, scenarios
from vgpumon.testing.vllm import free_port

pytestmark = pytest.mark.slow  # starts processes or servers: not in the quick subset (docs/testing.md)

#: The alert kinds the incident raises on its GPUs, and on which: what every face must say.
EXPECTED = {("GpuXidWarning", "2"), ("GpuEccUncorrectable", "3"), ("GpuXidCritical", "5"), ("GpuLost", "5")}
KINDS = {name for name, _ in EXPECTED}
TICK_S = 0.5


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310  the test's own servers on loopback
        return r.read()


def _capture(path):
    """The incident, then its last 10 ticks (GPU 5 lost, nothing new) again for 2 min of data time
    (240 ticks at ``TICK_S``): GpuLost's 1 min ``for``, the agent's 15 s rule cycle and its 10 s
    flushes all pass while the agent still runs, with a minute to spare."""
    header, ticks = incident.build(DATA)
    ticks = list(ticks)
    body = [t for t in ticks if t["tick"] >= 0]
    _, tail = scenarios.between(header, ticks, body[-10]["ts"], body[-1]["ts"] + 1)
    _, tail = scenarios.repeat(header, tail, 24)
    header, ticks = scenarios.then(header, ticks, tail)
    header, ticks = scenarios.retime(header, ticks, TICK_S / float(header.get("interval_s", 1.0)))
    # moved to start now: the store's retention judges raw rows' age on the wall clock, so a
    # capture days old has its raw rows deleted as soon as they are rolled up (GpuLost then
    # resolved in the agent mid-run while its GPU stayed lost); this test is about the faces
    ticks = list(ticks)
    header, ticks = scenarios.shift(header, ticks, time.time() - next(t["ts"] for t in ticks if t["ts"] is not None))
    scenarios.write(path, header, ticks)
    return path


def _faces(agent: str, prom: str) -> dict[str, set[tuple[str, str]]]:
    """(alert, GPU) firing, as each face says it; ``diagnose`` (a process of its own) only once
    the three others agree on the incident's alert kinds."""
    out: dict[str, set[tuple[str, str]]] = {}
    api = json.loads(_get(f"{agent}/api/v1/alerts"))["alerts"]
    out["/api/v1/alerts"] = {(a["name"], a["labels"].get("gpu", "")) for a in api if a["state"] == "firing"}
    served = Scrape(_get(f"{agent}/metrics").decode())
    out["/metrics"] = {(lab["alertname"], lab.get("gpu", "")) for lab, _ in served.series("vgpumon_alerts") if lab["state"] == "firing"}
    query = urllib.parse.urlencode({"query": 'ALERTS{alertstate="firing"}'})
    twins = json.loads(_get(f"{prom}/api/v1/query?{query}"))["data"]["result"]
    out["Prometheus ALERTS"] = {(s["metric"]["alertname"], s["metric"].get("gpu", "")) for s in twins}
    if any(_kinds(said) != EXPECTED for said in out.values()):
        return out
    host, port = agent.removeprefix("http://").split(":")
    rep = subprocess.run([sys.executable, "-m", "vgpumon", "diagnose", f"{host}:{port}", "--json"], capture_output=True, text=True, timeout=60)
    report = json.loads(rep.stdout)
    assert report.get("source", {}).get("kind") == "agent", report.get("source")
    out["diagnose"] = {(a["name"], a["labels"].get("gpu", "")) for a in report["alerts"] if a["state"] == "firing"}
    return out


def _kinds(said: set[tuple[str, str]]) -> set[tuple[str, str]]:
    return {x for x in said if x[0] in KINDS}


def test_eight_gpus_four_alert_kinds_agree_in_diagnose_the_api_metrics_and_prometheus(tmp_path):
    capture = _capture(tmp_path / "incident.jsonl.gz")
    sysfs = incident.sysfs_tree(DATA, tmp_path / "sys")
    agent_port, prom_port = free_port(), free_port()
    prom_url, agent_url = f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{agent_port}"
    prom = start_prometheus(tmp_path, prom_port, agent_port)
    agent = None
    seen: list[dict[str, set[tuple[str, str]]]] = []
    try:
        agent = subprocess.Popen(
            [sys.executable, "-m", "vgpumon", "agent", "--replay", str(capture), "--pace", "recorded",
             "--listen", f"127.0.0.1:{agent_port}", "--sysfs", str(sysfs), "--db", f"sqlite:///{tmp_path / 'store.db'}"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "agent.log", "w"),
        )
        # read the faces until all four say the incident's alerts, or the replay ends (the
        # condition, not a fixed wait: each round is one read of each face)
        while agent.poll() is None:
            try:
                faces = _faces(agent_url, prom_url)
            except (OSError, ValueError, KeyError):  # not serving yet, or just stopped: ask again shortly
                time.sleep(0.2)
                continue
            seen.append(faces)
            if len(faces) == 4 and all(_kinds(said) == EXPECTED for said in faces.values()):
                break
            time.sleep(TICK_S)  # the next tick, then ask again
    finally:
        for p in (agent, prom):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(30)
    assert seen, "no face answered while the agent ran: " + (tmp_path / "agent.log").read_text()[-2000:]
    last = seen[-1]
    diffs = [f"{face}: missing {sorted(EXPECTED - _kinds(said))}, extra {sorted(_kinds(said) - EXPECTED)}"
             for face, said in last.items() if _kinds(said) != EXPECTED]
    if len(last) < 4:
        diffs.append("diagnose: not read (the other faces never agreed)")
    print("\n".join(diffs) or f"all four faces agree after {len(seen)} reads: {sorted(EXPECTED)}")
    others = {face: sorted(said - EXPECTED) for face, said in last.items()}
    print(f"other alerts firing by face (not compared): {others}")
    assert diffs == [], "\n".join(diffs)
