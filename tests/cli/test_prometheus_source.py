"""``diagnose --prometheus`` and ``capacity --prometheus`` against a real Prometheus and a real
VictoriaMetrics, both scraping (every second) one ``vgpumon agent`` replaying the 8-GPU incident
at 4 ticks a second into its own SQLite store. Each report built from each engine's HTTP API is
compared with the one built from the store, and every difference beyond the tolerances below is
printed; the differences the Prometheus source is known to have are listed with their reason and
must be said by the report's notes. The error paths (unreachable, not a Prometheus API, garbage
JSON, a refused token, an unknown host, --db with --prometheus) need no engine.
"""

from __future__ import annotations

import http.server
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
import yaml
from conftest import DATA, vgpumon
from prometheus_support import serving, tool
from prometheus_support import wait_ready as _wait

from vgpumon.store import Store
from vgpumon.store.retention import Retention
from vgpumon.testing import incident
from vgpumon.testing.vllm import free_port

pytestmark = pytest.mark.slow  # starts processes and servers: not in the quick subset (docs/testing.md)

TICK_S = 0.25
#: Tolerances of the comparison. The engines hold one scrape a second, the store every 0.25 s
#: tick: a mean over a quarter of the ticks of a workload whose phases last seconds moves by up
#: to a fifth; a maximum of a plateau a few seconds long hardly moves.
MEAN_TOLERANCE = 0.20
MAX_TOLERANCE = 0.05
#: What only the store knows, by finding (alert, GPU index), and the note that must say why.
STORE_ONLY = {("GpuLost", 5): "NVML reason a GPU was unreadable is not exported"}




def _query(base: str, expr: str) -> list:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310  the test's own engine on loopback
        return json.load(r)["data"]["result"]


def _vgpumon(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return vgpumon(*args, env=env, timeout=300)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """The store and both engines after the replay: ``{"store": sqlite URL, "rolled": URL of a
    rolled-up copy, "prometheus": base URL, "victoriametrics": base URL}``."""
    prometheus, victoria = tool("prometheus"), tool("victoria-metrics")
    tmp = tmp_path_factory.mktemp("promsrc")
    capture = incident.write(DATA, tmp / "incident.jsonl.gz", tick_seconds=TICK_S)
    sysfs = incident.sysfs_tree(DATA, tmp / "sys")
    agent_port, prom_port, vm_port = free_port(), free_port(), free_port()
    scrape = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
              "scrape_configs": [{"job_name": "vgpumon", "static_configs": [{"targets": [f"127.0.0.1:{agent_port}"]}]}]}
    (tmp / "scrape.yml").write_text(yaml.safe_dump(scrape))
    procs = [
        subprocess.Popen([prometheus, f"--config.file={tmp / 'scrape.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                          f"--web.listen-address=127.0.0.1:{prom_port}"],
                         stdout=subprocess.DEVNULL, stderr=open(tmp / "prometheus.log", "w")),  # noqa: SIM115  the child owns it
        # -search.latencyOffset=0s: by default VictoriaMetrics hides the newest 30 s of samples
        subprocess.Popen([victoria, f"-httpListenAddr=127.0.0.1:{vm_port}", f"-storageDataPath={tmp / 'vm'}", "-retentionPeriod=1d",
                          f"-promscrape.config={tmp / 'scrape.yml'}", "-search.latencyOffset=0s"],
                         stdout=subprocess.DEVNULL, stderr=open(tmp / "victoria-metrics.log", "w")),  # noqa: SIM115  the child owns it
    ]
    bases = {"prometheus": f"http://127.0.0.1:{prom_port}", "victoriametrics": f"http://127.0.0.1:{vm_port}"}
    try:
        _wait("Prometheus ready", lambda: urllib.request.urlopen(f"{bases['prometheus']}/-/ready", timeout=2).status == 200, 60)  # noqa: S310
        _wait("VictoriaMetrics ready", lambda: urllib.request.urlopen(f"{bases['victoriametrics']}/health", timeout=2).status == 200, 60)  # noqa: S310
        store = f"sqlite:///{tmp / 'store.db'}"
        agent = _vgpumon("agent", "--replay", str(capture), "--pace", "recorded", "--interval", str(TICK_S),
                         "--listen", f"127.0.0.1:{agent_port}", "--sysfs", str(sysfs), "--hostname", "gpu-host-17", "--db", store)
        assert agent.returncode == 0, agent.stderr
        for name, base in bases.items():  # a failed scrape after the agent's end: every scrape of it is in
            _wait(f"{name} to see the agent gone", lambda b=base: bool(_query(b, 'up{job="vgpumon"} == 0')), 60)
            _wait(f"{name} to hold the replay", lambda b=base: bool(_query(b, 'count_over_time(vgpumon_gpu_up{hostname="gpu-host-17"}[10m]) > 5')), 30)
        shutil.copy(tmp / "store.db", tmp / "rolled.db")
        rolled = f"sqlite:///{tmp / 'rolled.db'}"
        # the replay's last minute closes once its GPUs have been silent 10 minutes of wall clock:
        # rolled up as of an hour on, as the Prometheus source rolls up what it read
        copy = Store(rolled)
        try:
            Retention(copy, clock=lambda: time.time() + 3600).run()
        finally:
            copy.close()
        yield {"store": store, "rolled": rolled, **bases}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)


def _diagnose(*args: str) -> dict:
    out = _vgpumon("diagnose", "gpu-host-17", "--json", "--window", "15m", *args)
    assert out.returncode in (0, 1, 2), out.stdout[-2000:] + out.stderr
    return json.loads(out.stdout)


def _findings(rep: dict) -> set[tuple[str, int | None]]:
    return {(f.get("alert") or f.get("kind"), (f.get("gpu") or {}).get("index"))
            for f in rep["findings"] if f["severity"] in ("critical", "warning")}


def _at(gpu: dict, key: str) -> dict:
    for part in key.split("."):
        gpu = gpu.get(part) or {}
    return gpu


def _differences(store: dict, other: dict) -> list[str]:
    """Every difference beyond the tolerances between two reports, as lines."""
    out = []
    if store["status"] != other["status"]:
        out.append(f"status: store {store['status']}, prometheus {other['status']}")
    ours, theirs = _findings(store), _findings(other)
    for f in sorted(ours - theirs, key=str):
        out.append(f"finding only from the store: {f}")
    for f in sorted(theirs - ours, key=str):
        out.append(f"finding only from prometheus: {f}")
    gpus = {g["uuid"]: g for g in other["gpus"]}
    if set(gpus) != {g["uuid"] for g in store["gpus"]}:
        out.append(f"GPUs: store {sorted(g['uuid'] for g in store['gpus'])}, prometheus {sorted(gpus)}")
    for g in store["gpus"]:
        h = gpus.get(g["uuid"])
        if h is None:
            continue
        for key in ("sm_active", "utilization", "temperature", "power", "pcie.tx", "pcie.rx"):
            figures_a, figures_b = _at(g, key), _at(h, key)
            for stat in sorted(k for k in figures_a if k.startswith(("mean_", "max_"))):
                # a mean of n scrapes taken from the store's 4n ticks: its error grows as n shrinks
                # (a GPU lost early in the window has a few dozen), ~1/sqrt(n) of a phased workload
                scraped = max(int(h.get("samples") or 0), 1)
                tol = max(MEAN_TOLERANCE, 2.0 / scraped ** 0.5) if stat.startswith("mean_") else MAX_TOLERANCE
                a, b = figures_a.get(stat), figures_b.get(stat)
                if a is None or b is None:
                    if (a is None) != (b is None):
                        out.append(f"GPU {g['index']} {key} {stat}: store {a}, prometheus {b}")
                elif abs(a - b) > tol * max(abs(a), abs(b), 1e-9):
                    out.append(f"GPU {g['index']} {key} {stat}: store {a:.4g}, prometheus {b:.4g} (beyond {tol:.0%})")
        if g["memory"]["used_max_bytes"] != h["memory"]["used_max_bytes"]:
            out.append(f"GPU {g['index']} memory used max: store {g['memory']['used_max_bytes']}, prometheus {h['memory']['used_max_bytes']}")
        if g["xid_counts"] != h["xid_counts"]:
            out.append(f"GPU {g['index']} XIDs: store {g['xid_counts']}, prometheus {h['xid_counts']}")
        if g["ecc"] != h["ecc"]:
            out.append(f"GPU {g['index']} ECC: store {g['ecc']}, prometheus {h['ecc']}")
        health_a = {area: v["status"] for area, v in g["health"].items()}
        health_b = {area: v["status"] for area, v in h["health"].items()}
        if health_a != health_b:
            out.append(f"GPU {g['index']} health: store {health_a}, prometheus {health_b}")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["prometheus", "victoriametrics"])
def test_diagnose_from_the_api_tells_the_stores_story(engines, engine):
    t0 = time.monotonic()
    store = _diagnose("--db", engines["store"])
    t1 = time.monotonic()
    other = _diagnose("--prometheus", engines[engine])
    t2 = time.monotonic()
    diffs = _differences(store, other)
    print(f"\n{engine}: diagnose --db {t1 - t0:.1f} s, --prometheus {t2 - t1:.1f} s ({other['prometheus']['requests']} requests), "
          "command start-up included")
    print(f"\n{engine}: {len(diffs)} differences beyond the tolerances (means {MEAN_TOLERANCE:.0%}, maxima {MAX_TOLERANCE:.0%}):")
    for line in diffs:
        print("  " + line)
    src = other["prometheus"]
    assert other["source"] == {"kind": "prometheus", "where": engines[engine]}
    assert src["step_seconds"] is None and "every scraped sample" in src["resolution"]
    notes = " ".join(src["notes"])
    assert "process lists are not read" in notes and "alert episodes come from its vgpumon_alerts series" in notes
    assert other["source_note"].startswith(f"from Prometheus at {engines[engine]}")
    # the differences the source has are its known ones, each said by a note
    known = {f"finding only from the store: {k}": why for k, why in STORE_ONLY.items()}
    unexplained = []
    for line in diffs:
        if line in known:
            assert known[line] in notes, f"{line}: the report does not say why"
        elif line == "finding only from prometheus: ('unreadable_now', 5)" or line.startswith("GPU 5 health"):
            continue  # the lost GPU reads unreadable until GpuLost's minute: the other face of STORE_ONLY
        else:
            unexplained.append(line)
    assert unexplained == []
    # the story: the same GPUs, the ECC and XID findings, the verdict
    assert other["status"] == store["status"] == "critical"
    assert {("GpuEccUncorrectable", 3), ("GpuXidCritical", 5), ("GpuXidWarning", 2)} <= _findings(other)
    assert other["evaluation"]["by"] == "agent" and other["evaluation"]["alert_rows"] > 0

    text = _vgpumon("diagnose", "gpu-host-17", "--prometheus", engines[engine])
    assert text.returncode == 2 and text.stdout.startswith("CRITICAL gpu-host-17")
    assert f"from prometheus {engines[engine]}" in text.stdout.splitlines()[0]
    assert "process lists are not read from Prometheus" in " ".join(text.stdout.split())


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["prometheus", "victoriametrics"])
def test_capacity_from_the_api_tells_the_stores_story(engines, engine):
    def review(*args: str) -> dict:
        out = _vgpumon("capacity", "gpu-host-17", "--json", "--window", "1h", *args)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    store, other = review("--db", engines["rolled"]), review("--prometheus", engines[engine])
    a, b = store["hosts"][0], other["hosts"][0]
    diffs = []
    for ga, gb in zip(a["gpus"], b["gpus"], strict=True):
        for d in ("tx", "rx"):
            for stat in ("p95_bytes_per_second", "max_bytes_per_second"):
                x, y = ga[d][stat], gb[d][stat]
                if abs(x - y) > MAX_TOLERANCE * max(x, y, 1.0):
                    diffs.append(f"GPU {ga['index']} {d} {stat}: store {x:.4g}, prometheus {y:.4g}")
    ports = {p["port"]: p for p in b["shared"]}
    if set(ports) != {p["port"] for p in a["shared"]}:
        diffs.append(f"shared ports: store {[p['port'] for p in a['shared']]}, prometheus {sorted(ports)}")
    for k in ("saturated", "saturated_gpus", "impossible"):
        if sorted(a[k]) != sorted(b[k]):
            diffs.append(f"{k}: store {a[k]}, prometheus {b[k]}")
    print(f"\n{engine}: {len(diffs)} capacity differences beyond {MAX_TOLERANCE:.0%}:")
    for line in diffs:
        print("  " + line)
    assert diffs == []
    assert other["source"]["kind"] == "prometheus" and "every scraped sample" in other["source"]["notes"][0]


def test_an_unknown_host_is_one_line_naming_the_hosts_there(engines):
    out = _vgpumon("diagnose", "gpu-host-99", "--prometheus", engines["prometheus"])
    assert out.returncode == 3, out.stderr
    assert out.stdout.count("\n") == 1 and "gpu-host-99" in out.stdout and "gpu-host-17" in out.stdout
    cap = _vgpumon("capacity", "gpu-host-99", "--prometheus", engines["victoriametrics"])
    assert cap.returncode == 64 and "gpu-host-99 is not in Prometheus" in cap.stderr and "Traceback" not in cap.stderr
    assert "not in the store" not in cap.stdout + cap.stderr  # the source is named as it is


# -- error paths: no engine needed ---------------------------------------------------------------


class _Fake(http.server.BaseHTTPRequestHandler):
    body = b""
    status = 200
    location = ""
    seen: list[str] = []

    reason = ""
    dribble = False

    def do_GET(self) -> None:  # noqa: N802  the standard library's name
        type(self).seen.append(self.headers.get("Authorization") or "")
        self.send_response(self.status, self.reason or None)
        if self.location:
            self.send_header("Location", self.location)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        if self.dribble:  # an answer that never ends: a byte every 0.3 s, until the client goes
            for _ in range(400):
                try:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.3)
            return
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake():
    """A web server that answers every request with ``_Fake.body`` and ``_Fake.status``."""
    with serving(_Fake) as url:
        yield url


def _one_line(out: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr + out.stdout
    text = out.stdout if code == 3 else out.stderr
    assert text.count("\n") == 1, text
    for n in needles:
        assert n in text, text


def test_an_unreachable_url_is_one_line_and_unknown():
    url = f"http://127.0.0.1:{free_port()}"
    _one_line(_vgpumon("diagnose", "gpu-host-17", "--prometheus", url), 3, "UNKNOWN gpu-host-17", f"Prometheus at {url} unreachable (connection refused)")
    _one_line(_vgpumon("capacity", "--prometheus", url), 75, f"Prometheus at {url} unreachable")


@pytest.mark.parametrize(("status", "body", "says"), [
    (200, b"<html><body>Grafana</body></html>", "not JSON"),
    (200, b'{"status": "success", "data": {"result": "nope"}', "not JSON"),
    (200, b'{"hello": "world"}', "not a Prometheus API answer"),
    (200, b'{"status": "success", "data": {"resultType": "scalar", "result": []}}', "shape the API does not have"),
    (404, b"not found", "HTTP 404"),
])
def test_an_answer_that_is_not_the_apis_is_one_line(fake, status, body, says):
    _Fake.status, _Fake.body = status, body
    _one_line(_vgpumon("diagnose", "gpu-host-17", "--prometheus", fake), 3, "UNKNOWN gpu-host-17", says)
    _one_line(_vgpumon("capacity", "--prometheus", fake), 69, says)


def test_the_token_goes_in_the_header_and_never_in_a_message(fake):
    _Fake.status, _Fake.body, _Fake.seen = 401, b"unauthorized", []
    env = {"VGPUMON_PROMETHEUS_TOKEN": "s3cr3t-t0ken"}
    out = _vgpumon("diagnose", "gpu-host-17", "--prometheus", fake, env=env)
    _one_line(out, 3, "HTTP 401", "VGPUMON_PROMETHEUS_TOKEN")
    assert "s3cr3t" not in out.stdout + out.stderr
    assert _Fake.seen and _Fake.seen[0] == "Bearer s3cr3t-t0ken"


def test_a_redirect_is_not_followed_and_the_token_is_sent_once(fake):
    """urllib follows a redirect by default and sends the request's headers, the token among
    them, to wherever it points: a redirect is an answer here, said in one line."""
    _Fake.status, _Fake.body, _Fake.seen, _Fake.location = 302, b"", [], f"{fake}/elsewhere"
    try:
        out = _vgpumon("diagnose", "gpu-host-17", "--prometheus", fake, env={"VGPUMON_PROMETHEUS_TOKEN": "s3cr3t-t0ken"})
    finally:
        _Fake.location = ""
    _one_line(out, 3, "HTTP 302", "not followed")
    assert _Fake.seen == ["Bearer s3cr3t-t0ken"]  # one request: the redirect's target got none
    assert "s3cr3t" not in out.stdout + out.stderr


def test_an_answer_that_never_ends_is_cut_at_the_timeout(fake):
    """urllib's timeout bounds each read, not the request: a server sending a byte every 0.3 s
    held diagnose for ever. The whole request now has --timeout (the subprocess's own bound, 60 s,
    is what the old code ran into)."""
    _Fake.status, _Fake.body, _Fake.seen, _Fake.dribble = 200, b"", [], True
    try:
        out = _vgpumon("diagnose", "gpu-host-17", "--prometheus", fake, "--timeout", "2s")
    finally:
        _Fake.dribble = False
    _one_line(out, 3, "UNKNOWN gpu-host-17", "did not answer within 2 s")


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/ x", "http://127.0.0.1:9/\x01x", "http://[::1", "http://127.0.0.1:9/?token=x",
                                 "http://127.0.0.1:9\nHost: evil"])
def test_a_malformed_url_is_a_usage_error(url):
    for command in ("diagnose", "capacity"):
        args = [command, "gpu-host-17"] if command == "diagnose" else [command]
        out = _vgpumon(*args, "--prometheus", url)
        assert out.returncode == 64 and "Traceback" not in out.stderr, (command, out.returncode, out.stderr[-500:])
        assert len(out.stderr.strip().splitlines()) <= 4 and "--prometheus" in out.stderr, out.stderr


def test_a_token_the_server_repeats_is_never_shown(fake):
    secret = "SEKRIT-tok-1234"
    env = {"VGPUMON_PROMETHEUS_TOKEN": secret}
    cases = [(400, "", json.dumps({"status": "error", "error": f"key {secret} unknown"}).encode(), ""),
             (500, f"Internal {secret}", b"", ""), (302, "", b"", f"http://elsewhere/?{secret}")]
    for status, reason, body, location in cases:
        _Fake.status, _Fake.reason, _Fake.body, _Fake.location, _Fake.seen = status, reason, body, location, []
        try:
            for command in (["diagnose", "gpu-host-17"], ["capacity"]):
                out = _vgpumon(*command, "--prometheus", fake, env=env)
                assert out.returncode in (3, 69, 75) and _Fake.seen, (status, out.stdout, out.stderr)
                assert secret not in out.stdout + out.stderr, (status, out.stdout, out.stderr)
        finally:
            _Fake.reason, _Fake.location = "", ""


def test_a_token_that_cannot_be_a_header_is_a_usage_error(fake):
    _Fake.seen = []
    out = _vgpumon("capacity", "--prometheus", fake, env={"VGPUMON_PROMETHEUS_TOKEN": "s3cr3t-val\n"})
    assert out.returncode == 64 and "VGPUMON_PROMETHEUS_TOKEN has a space, a newline" in out.stderr, out.stderr
    assert "s3cr3t" not in out.stderr and not _Fake.seen


def test_json_nested_too_deep_is_one_line(fake):
    _Fake.status, _Fake.body, _Fake.seen = 200, b"[" * 100_000 + b"]" * 100_000, []
    _one_line(_vgpumon("diagnose", "gpu-host-17", "--prometheus", fake), 3, "UNKNOWN gpu-host-17", "nested too deep")


def test_db_and_prometheus_together_are_a_usage_error(tmp_path):
    for command in ("diagnose", "capacity"):
        args = [command, "gpu-host-17"] if command == "diagnose" else [command]
        out = _vgpumon(*args, "--db", f"sqlite:///{tmp_path / 'x.db'}", "--prometheus", "http://127.0.0.1:9")
        assert out.returncode == 64 and "--db and --prometheus" in out.stderr, out.stderr
