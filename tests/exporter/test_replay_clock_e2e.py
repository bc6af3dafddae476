"""A replay on one clock (issue 24, item 6): the recorded H200 capture, days old, replayed at its
recorded pace beside a live vLLM server, scraped by a real Prometheus (Debian's 2.42) with the
generated rule files. The capture's ticks used to carry the capture's time while the vLLM polls
carried the wall clock: the agent judged vLLM days before its polls (never firing), Prometheus
judged the same series on its own ``time()`` (``VgpumonSourceSilent{source="nvml"}``, the vLLM
alerts firing there only). Now the replay runs on the wall clock: Prometheus' ``ALERTS`` of the
twins and the agent's ``/api/v1/alerts`` name the same alerts, and none fires in one face only.

The server serves a real vLLM 0.32 server's scrape taken while it ran 97 requests, unchanged at
every poll: work queued with the token counters flat, the hung server of the issue's run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
import yaml
from conftest import DATA, ROOT
from prometheus_support import start_prometheus
from vllm_support import ServerThread, shared_dir

from vgpumon.testing import scenarios
from vgpumon.testing.vllm import FakeVllmServer, free_port

pytestmark = pytest.mark.slow  # starts processes or servers: not in the quick subset (docs/testing.md)

HOST = "replay-host"
#: what both faces must say once the server has been hung for the twins' minute
EXPECTED = "VllmServerHung"


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310  the test's own servers on loopback
        return r.read()


def _query(prom: str, expr: str) -> list[dict]:
    return json.loads(_get(f"{prom}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"))["data"]["result"]


def _key(name: str, labels: dict[str, str]) -> tuple[str, ...]:
    return (name, *(f"{k}={labels[k]}" for k in ("gpu", "server", "source", "port", "rule") if k in labels))


def _faces(agent: str, prom: str) -> dict[str, set[tuple[str, ...]]]:
    api = json.loads(_get(f"{agent}/api/v1/alerts"))["alerts"]
    twins = _query(prom, 'ALERTS{alertstate="firing"}')
    return {
        "/api/v1/alerts": {_key(a["name"], a["labels"]) for a in api if a["state"] == "firing"},
        "Prometheus ALERTS": {_key(s["metric"]["alertname"], s["metric"]) for s in twins},
    }


def test_a_replay_beside_a_live_vllm_server_raises_the_same_alerts_in_the_agent_and_in_prometheus(tmp_path):
    header, ticks = scenarios.load(DATA / "h200-workload.jsonl.gz")  # 76 ticks, 1 s apart, days old
    header, ticks = scenarios.repeat(header, ticks, 2)  # 150 s: the twins' 1-min `for` and a margin
    capture = tmp_path / "workload.jsonl.gz"
    scenarios.write(capture, header, ticks)
    assert next(t["ts"] for t in ticks if t["ts"] is not None) < time.time() - 86_400  # a capture of another day
    busy = (shared_dir("fixtures", "vllm-real") / "vllm-0.32.0-cpu__busy.txt").read_text()
    servers = ServerThread()
    vllm = servers.start(FakeVllmServer(metrics=busy, version="0.32.0", models=["tiny"]))
    agent_port, prom_port = free_port(), free_port()
    prom_url, agent_url = f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{agent_port}"
    prom = start_prometheus(tmp_path, prom_port, agent_port)
    agent = None
    seen: list[dict[str, set[tuple[str, ...]]]] = []
    started = time.time()
    try:
        agent = subprocess.Popen(
            [sys.executable, "-m", "vgpumon", "agent", "--replay", str(capture), "--pace", "recorded", "--hostname", HOST,
             "--vllm-url", vllm.url, "--vllm-interval", "1", "--listen", f"127.0.0.1:{agent_port}",
             "--db", f"sqlite:///{tmp_path / 'store.db'}"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "agent.log", "w"),
        )
        # read both faces until they agree with the hung server firing, or the replay ends (the
        # condition, not a fixed wait: each round is one read of each face)
        while agent.poll() is None:
            try:
                faces = _faces(agent_url, prom_url)
            except (OSError, ValueError, KeyError):  # not serving yet, or just stopped: ask again shortly
                time.sleep(0.2)
                continue
            seen.append(faces)
            api, twins = faces.values()
            if api == twins and any(k[0] == EXPECTED for k in api):
                break
            time.sleep(1.0)  # the next scrape, then ask again
        # over the whole run, Prometheus never saw a source silent: the replay's stamps are its clock
        silent = _query(prom_url, f'max_over_time(ALERTS{{alertname="VgpumonSourceSilent",hostname="{HOST}"}}[{int(time.time() - started) + 5}s])')
    finally:
        for p in (agent, prom):
            if p is not None and p.poll() is None:
                p.terminate()
                p.wait(30)
        servers.close()
    assert seen, "no face answered while the agent ran: " + (tmp_path / "agent.log").read_text()[-2000:]
    api, twins = seen[-1].values()
    print(f"after {len(seen)} reads: agent {sorted(api)}; Prometheus {sorted(twins)}")
    assert sorted(api - twins) == [] and sorted(twins - api) == [], f"only the agent: {sorted(api - twins)}; only Prometheus: {sorted(twins - api)}"
    assert (EXPECTED, f"server=127.0.0.1:{vllm.port}") in api
    assert silent == [], [s["metric"] for s in silent]


def test_the_compose_demo_is_the_replay_this_test_holds_to_one_clock():
    """The compose demo's agent replays the same capture in the same mode as the test above (at
    its recorded pace, so on the wall clock): what the test shows of the agent and Prometheus
    holds for the demo's Grafana and Prometheus too."""
    compose = yaml.safe_load((ROOT / "exporters" / "compose" / "docker-compose.yml").read_text())
    command = compose["services"]["vgpumon-demo"]["command"]
    assert command[0] == "agent"
    assert command[command.index("--replay") + 1] == "/data/h200-workload.jsonl.gz"  # tests/data, mounted at /data
    assert command[command.index("--pace") + 1] == "recorded"
