"""End to end against a real Prometheus: every query of every panel of every dashboard returns data.

Debian's Prometheus (2.42) scrapes, every second, a ``vgpumon agent`` replaying the 8-GPU incident
derived from the recorded H200 captures (XIDs, ECC errors, a GPU lost after XID 79; the recorded
sysfs tree for the PCIe topology) at 4 ticks a second, while the agent polls a scripted vLLM
server serving a real vLLM 0.32 server's recorded scrapes (refusing, then busy, then its counters
moving on, then its engine dead) and a second one serving vLLM 0.33's KV-offload and
speculative-decoding families (tests/data/vllm-0.33-kv-offload) and LMCache's
(tests/data/vllm-0.32-lmcache), which then hangs. Then every panel's query goes through Prometheus's HTTP API
with Grafana's variables filled in. A query that errors fails the test; so does one that returns
no data, unless its panel is listed with its reason in ``dashboards/empty-panels.yml`` — and a
listed panel that does return data fails it too, so the list stays true. The generated rule
files (``rules/*.rules.yml``) are loaded into the same Prometheus when they exist; each must
evaluate without error against the agent's series.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import DATA, ROOT
from prometheus_support import tool
from prometheus_support import wait_ready as _wait
from vllm_support import shared_dir

from vgpumon import dashboards
from vgpumon.testing import incident
from vgpumon.testing.vllm import FakeVllmServer, free_port

pytestmark = pytest.mark.slow  # starts processes or servers: not in the quick subset (docs/testing.md)

EMPTY = ROOT / "dashboards" / "empty-panels.yml"
SCRAPE_S = 1
TICK_S = 0.25
#: Grafana's $__rate_interval for a 1 s scrape interval: max($__interval + scrape, 4 × scrape)
RATE_INTERVAL = f"{4 * SCRAPE_S}s"


def _get(base: str, path: str, **params: str) -> dict:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=30) as r:  # noqa: S310  the test's own Prometheus on loopback
            return json.load(r)
    except urllib.error.HTTPError as exc:  # a bad query: Prometheus answers 400 with the error
        return json.load(exc)




class ScriptedVllm:
    """A vLLM server on its own thread and event loop, following a script of recorded scrapes."""

    def __init__(self, fixtures: Path) -> None:
        self.port = free_port()
        self.fixtures = fixtures
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server = FakeVllmServer(port=self.port, version="0.32.0", models=["tiny"], load=3.0)
        self.url = f"http://127.0.0.1:{self.port}"

    def run(self, t0: float) -> threading.Thread:
        """Refuse until t0 + 3 s (starting), then serve the idle scrape; at + 7 s the busy one and
        at + 11 s the one taken while the engine was being killed (each step moves the counters
        and histograms on: token rates, latency percentiles); at + 15 s /health 503 (engine
        dead). The agent polls every 2 s, so each step lasts two polls and every sample is
        scraped."""
        self.thread.start()

        def script() -> None:
            def at(t: float, scrape: str) -> None:
                time.sleep(max(0.0, t0 + t - time.monotonic()))
                self.server.metrics = (self.fixtures / f"vllm-0.32.0-cpu__{scrape}.txt").read_text()

            at(3, "idle")
            asyncio.run_coroutine_threadsafe(self.server.start(self.port), self.loop).result(10)
            at(7, "busy")
            at(11, "engine-killed")
            time.sleep(max(0.0, t0 + 15 - time.monotonic()))
            self.server.health_status = 503

        t = threading.Thread(target=script, daemon=True)
        t.start()
        return t

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _lmcache_lines(scrape: str) -> str:
    """The ``lmcache:`` lines of one derived LMCache scrape (tests/data/vllm-0.32-lmcache)."""
    text = (DATA / "vllm-0.32-lmcache" / f"{scrape}.txt").read_text()
    return "".join(ln for ln in text.splitlines(keepends=True) if ln.startswith("lmcache:") or ln.startswith("# HELP lmcache:")
                   or ln.startswith("# TYPE lmcache:"))


class ScriptedKvOffloadVllm(ScriptedVllm):
    """A second server, vLLM 0.33 with KV offload and a draft model (the constructed expositions of
    tests/data/vllm-0.33-kv-offload) running LMCache's connector too (the ``lmcache:`` families of
    tests/data/vllm-0.32-lmcache): its counters move once, then it hangs."""

    def __init__(self, fixtures: Path) -> None:
        super().__init__(fixtures)
        self.server = FakeVllmServer(port=self.port, version="0.33.0", models=["tiny"])

    def run(self, t0: float) -> threading.Thread:
        """Serve ``t0`` from t0 + 3 s and ``t1`` (load +11.4 GB, store +2.4 GB, 600 of 1000
        draft tokens accepted) at + 7 s; at + 11 s its ``/health`` stops answering: hung (the
        gauges of a hung engine freeze and ``/health`` may still say 200; a timed-out one is
        the signal a static target gives)."""
        self.thread.start()

        def script() -> None:
            def at(t: float) -> None:
                time.sleep(max(0.0, t0 + t - time.monotonic()))

            at(3)
            self.server.metrics = (self.fixtures / "t0.txt").read_text() + _lmcache_lines("t0")
            asyncio.run_coroutine_threadsafe(self.server.start(self.port), self.loop).result(10)
            at(7)
            self.server.metrics = (self.fixtures / "t1.txt").read_text() + _lmcache_lines("t1")
            at(11)
            self.server.hang = {"/health"}

        t = threading.Thread(target=script, daemon=True)
        t.start()
        return t


def _substitute(expr: str, window_s: int) -> str:
    for var, value in (
        ("$__rate_interval", RATE_INTERVAL), ("$__interval", f"{SCRAPE_S}s"), ("$__range", f"{window_s}s"),
        ("$host", ".*"), ("$gpu", ".*"), ("$model", ".*"),
    ):
        expr = expr.replace(var, value)
    assert "$" not in expr, f"a variable the test does not fill: {expr}"
    return expr


def test_every_dashboard_query_returns_data_from_a_real_prometheus(tmp_path):
    prometheus = tool("prometheus")
    vllm_fixtures = shared_dir("fixtures", "vllm-real")
    # ticks 0.25 s apart in the capture too: the replay keeps that pace whether --pace recorded
    # follows --interval or the capture's own timestamps
    capture = incident.write(DATA, tmp_path / "incident.jsonl.gz", tick_seconds=TICK_S)
    sysfs = incident.sysfs_tree(DATA, tmp_path / "sys")
    agent_port, prom_port = free_port(), free_port()
    rules = sorted((ROOT / "rules").glob("*.rules.yml"))
    config = {
        "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
        "rule_files": [str(r) for r in rules],
        "scrape_configs": [{"job_name": "vgpumon", "static_configs": [{"targets": [f"127.0.0.1:{agent_port}"]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    base = f"http://127.0.0.1:{prom_port}"
    prom = subprocess.Popen(
        [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"),
    )
    vllm = ScriptedVllm(vllm_fixtures)
    offload = ScriptedKvOffloadVllm(DATA / "vllm-0.33-kv-offload")
    agent = None
    try:
        _wait("Prometheus ready", lambda: urllib.request.urlopen(f"{base}/-/ready", timeout=2).status == 200, 60)  # noqa: S310  the test's own Prometheus on loopback
        agent = subprocess.Popen(
            [sys.executable, "-m", "vgpumon", "agent", "--replay", str(capture), "--pace", "recorded",
             "--interval", str(TICK_S), "--listen", f"127.0.0.1:{agent_port}", "--sysfs", str(sysfs),
             "--vllm-url", vllm.url, "--vllm-url", offload.url, "--vllm-interval", "2", "--db", f"sqlite:///{tmp_path / 'store.db'}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        # the server's script starts once the agent serves (and so polls it): on a loaded machine
        # the agent's start-up can outlast the 3 s of "starting", and then no prewarm is measured
        _wait("the agent serving /metrics",
              lambda: urllib.request.urlopen(f"http://127.0.0.1:{agent_port}/metrics", timeout=2).status == 200, 60)  # noqa: S310  the test's own agent on loopback
        t0 = time.monotonic()
        scripts = [vllm.run(t0), offload.run(t0)]
        _, err = agent.communicate(timeout=120)
        assert agent.returncode == 0, err
        for script in scripts:
            script.join(10)
        time.sleep(2 * SCRAPE_S)  # the staleness marker of the agent's end is written
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
        vllm.close()
        offload.close()

    try:
        # the window in which the agent served: from its first to its last successful scrape
        now = time.time()
        up = _get(base, "/api/v1/query_range", query='up{job="vgpumon"} == 1', start=str(now - 300), end=str(now), step="1")
        points = [float(ts) for series in up["data"]["result"] for ts, _ in series["values"]]
        assert len(points) >= 10, f"Prometheus scraped the agent only {len(points)} times"
        start, end = min(points), max(points)
        window = int(end - start) + 1

        entries = yaml.safe_load(EMPTY.read_text())
        allowed = {(e["dashboard"], e["panel"]): e["reason"] for e in entries}
        racing = {(e["dashboard"], e["panel"]) for e in entries if e.get("may_have_data")}
        failures, empty_panels, seen = [], set(), set()
        for path in sorted((ROOT / "dashboards").glob("*.json")):
            doc = json.loads(path.read_text())
            for panel, target in dashboards.queries(doc):
                key = (doc["uid"], panel["title"])
                seen.add(key)
                # Over the whole window, instant targets too: a table of what is "now" (the GPU
                # processes) may rightly be empty at the capture's end and full in its middle,
                # as the user sees it when moving the time range back.
                expr = _substitute(target["expr"], window)
                answer = _get(base, "/api/v1/query_range", query=expr, start=str(start), end=str(end), step=str(SCRAPE_S))
                if answer.get("status") != "success":
                    failures.append(f"{key} {target['refId']}: error {answer.get('error')}: {expr}")
                elif not answer["data"]["result"]:
                    empty_panels.add(key)
                    if key not in allowed:
                        failures.append(f"{key} {target['refId']}: no data: {expr}")
        stale = [k for k in allowed if k not in seen]
        assert stale == [], f"empty-panels.yml lists panels no dashboard has: {stale}"
        alive = [k for k in allowed if k not in empty_panels and k not in racing]
        assert failures == [] and alive == [], "\n".join(failures + [f"{k}: listed as empty but returns data" for k in alive])

        if rules:  # the rule files of the rules engine, evaluated on the agent's own series
            groups = _get(base, "/api/v1/rules")["data"]["groups"]
            broken = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r.get("health") == "err"]
            assert groups and broken == [], broken
    finally:
        prom.terminate()
        prom.wait(30)
