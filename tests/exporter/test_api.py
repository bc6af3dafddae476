"""The agent's read-only API on its ``/metrics`` server, and ``vgpumon diagnose HOST`` reading it: a
real agent replaying the recorded H200 capture serves the report (the H200, its copy phase, its
allocation growth, OK); off loopback every ``/api/v1`` request needs the bearer token while
``/metrics`` and ``/healthz`` stay open; the stacks of a discovered vLLM process come from py-spy,
and each way py-spy can fail is one clear line."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from api_support import ServingAgent, get
from conftest import H200_CAPTURE, H200_PHASES, VGPUMON, phase
from shape_support import mismatches
from vllm_support import ServerThread, shared_dir

from vgpumon.diagnose import Report
from vgpumon.diagnose.stacks import dump
from vgpumon.exporter.api import ApiConfig, is_loopback
from vgpumon.sources.nvml.capture import ReplayBackend
from vgpumon.sources.vllm import VllmSource
from vgpumon.sources.vllm.discovery import VllmProcess
from vgpumon.testing import scenarios
from vgpumon.testing.vllm import FakeVllmServer

pytestmark = pytest.mark.slow  # starts processes or servers: not in the quick subset (docs/testing.md)

TOKEN = "k7Qw-3vZ9_secret"


def diagnose(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("VGPUMON_")}
    return subprocess.run(VGPUMON + ["diagnose", *args], capture_output=True, text=True, timeout=120, env={**clean, **(env or {})})


def test_diagnose_reads_an_agent_replaying_the_h200(tmp_path):
    """Acceptance: the report from the agent's API names the H200, finds its PCIe copy phase and
    shows its allocation growth in the memory sparkline, with the verdict OK (the memory was freed)."""
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    with ServingAgent(url, ReplayBackend(H200_CAPTURE)) as agent:
        out = diagnose(f"127.0.0.1:{agent.port}", "--json")
        text = diagnose(f"127.0.0.1:{agent.port}")
    assert out.returncode == 0, out.stdout + out.stderr
    rep = json.loads(out.stdout)
    assert rep["status"] == "ok" and rep["source"] == {"kind": "agent", "where": f"127.0.0.1:{agent.port}"}
    assert rep["host"] == "h200-agent" and rep["freshness"]["agent"]["last_tick_age_seconds"] is not None
    assert mismatches(rep, Report) == []  # the agent's additions (its clock, the source) are declared too
    (gpu,) = rep["gpus"]
    assert gpu["name"] == "NVIDIA H200"
    (trend,) = rep["trends"]["gpus"]
    copy, growth, end = phase("h2d_copy"), phase("growth"), phase("idle_end")
    peak = trend["pcie_peak"]
    assert peak["direction"] == "rx" and copy["start"] - 2 <= peak["at_ts"] <= copy["end"] and peak["share_of_max_link"] > 0.85
    t0, width = rep["trends"]["start_ts"], rep["trends"]["bucket_seconds"]
    mem = trend["memory_used_bytes"]
    during = [v for i, v in enumerate(mem) if growth["start"] + width <= t0 + (i + 0.5) * width <= growth["end"] - width]
    assert during == sorted(during) and during[-1] - during[0] > 0.4 * H200_PHASES["growth_total_bytes"]  # it grows
    top = mem.index(max(mem))
    assert growth["start"] <= t0 + top * width <= end["start"] + width and max(mem) >= H200_PHASES["growth_total_bytes"]
    assert mem[-1] < 1e9 and rep["gpus"][0]["memory"]["used_last_bytes"] < 1e9  # and is freed
    assert text.returncode == 0 and text.stdout.startswith("OK h200-agent")
    line = next(line for line in text.stdout.splitlines() if line.startswith("GPU 0") and "memory" in line)
    spark = line.split("memory", 1)[1].split()[0]
    assert "█" in spark and spark.index("█") > spark.index("▂") and spark.endswith("▁")  # rises, then freed
    assert "peak RX" in text.stdout


def test_off_loopback_every_api_request_needs_the_token(tmp_path, caplog):
    """Acceptance: bound to every interface, without the token the API refuses every request
    (401, as JSON); with it every endpoint works; /metrics and /healthz stay open; the token
    appears in no log line."""
    caplog.set_level(logging.DEBUG)
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    with ServingAgent(url, ReplayBackend(H200_CAPTURE), listen="0.0.0.0:0", api=ApiConfig(token=TOKEN)) as agent:
        base = agent.base
        paths = ["/api/v1", "/api/v1/snapshot", "/api/v1/alerts", "/api/v1/diagnose", "/api/v1/diagnose?window=5m", "/api/v1/nope"]
        for path in paths:
            for token in (None, "wrong", TOKEN[:-1]):
                status, headers, body = get(base + path, token)
                assert status == 401 and body["error"]["status"] == 401, (path, token, body)
                assert headers["WWW-Authenticate"].startswith("Bearer")
        assert get(base + "/api/v1/snapshot", method="POST")[0] == 401
        ok = {path: get(base + path, TOKEN) for path in paths}
        assert get(base + "/metrics")[0] == 200 and get(base + "/healthz")[0] in (200, 503)  # open for scrapers
        assert get(base + "/api/v1/snapshot", TOKEN, method="POST")[0] == 405  # read-only
        refused = diagnose(f"127.0.0.1:{agent.port}")
        answered = diagnose(f"127.0.0.1:{agent.port}", "--json", env={"VGPUMON_API_TOKEN": TOKEN})
    assert ok["/api/v1"][0] == 200 and set(ok["/api/v1"][2]["endpoints"]) == {"/api/v1/snapshot", "/api/v1/alerts", "/api/v1/diagnose"}
    status, _, snap = ok["/api/v1/snapshot"]
    assert status == 200 and snap["gpus"][0]["identity"]["name"] == "NVIDIA H200" and snap["gpus"][0]["sample"]["up"]
    status, _, alerts = ok["/api/v1/alerts"]
    assert status == 200 and alerts["evaluated_at"] is not None and isinstance(alerts["alerts"], list)
    status, _, rep = ok["/api/v1/diagnose"]
    assert status == 200 and rep["status"] == "ok" and rep["gpus"][0]["name"] == "NVIDIA H200"
    assert ok["/api/v1/diagnose?window=5m"][2]["window"]["seconds"] == 300
    assert ok["/api/v1/nope"][0] == 404 and ok["/api/v1/nope"][2]["error"]["status"] == 404
    # diagnose HOST: refused without the token (one UNKNOWN line saying why), answered with it
    assert refused.returncode == 3 and "refused: a bearer token is required" in refused.stdout
    assert len((refused.stdout + refused.stderr).strip().splitlines()) == 1
    assert answered.returncode == 0 and json.loads(answered.stdout)["source"]["kind"] == "agent"
    assert TOKEN not in caplog.text and TOKEN[:-1] not in caplog.text


def _raw_request(port: int, header: bytes) -> bytes:
    """One GET of ``/api/v1/alerts`` with ``header`` as sent, bytes for bytes (no client would
    send it: a NUL, a control character, bytes that are not UTF-8); the whole answer."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"GET /api/v1/alerts HTTP/1.1\r\nHost: agent\r\n" + header + b"\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


MALFORMED = [
    b"Authorization: Bearer " + TOKEN[:6].encode() + b"\x00" + TOKEN[6:].encode(),
    b"Authorization: Bearer " + TOKEN.encode() + b"\x01",
    b"Authorization: Bearer \xff\xfe" + TOKEN.encode(),
    b"Authoriz\xffation: Bearer " + TOKEN.encode(),
]


@pytest.mark.parametrize("header", MALFORMED, ids=["nul", "control", "not-utf8-value", "not-utf8-name"])
def test_a_malformed_authorization_header_is_a_json_400_and_its_token_is_never_logged(tmp_path, caplog, header):
    """aiohttp's parser used to answer a NUL or a control character in plain text repeating the
    line, and log that line, token in clear, with a traceback per request; bytes that are not
    UTF-8 made a plain-text 500 and a traceback. Each is now a JSON 400 naming neither, any log
    line without the request's bytes, and the agent goes on answering."""
    caplog.set_level(logging.DEBUG)
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    with ServingAgent(url, ReplayBackend(H200_CAPTURE), listen="0.0.0.0:0", api=ApiConfig(token=TOKEN)) as agent:
        answer = _raw_request(agent.port, header)
        after = get(agent.base + "/api/v1/alerts", TOKEN)[0]
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].split()[1] == b"400", head
    assert b"content-type: application/json" in head.lower()
    error = json.loads(body)["error"]
    assert error["status"] == 400 and error["message"]
    assert TOKEN[6:].encode() not in answer and TOKEN[:6].encode() not in answer
    assert TOKEN[6:] not in caplog.text and TOKEN[:6] not in caplog.text
    assert "Traceback" not in caplog.text and not any(r.exc_info for r in caplog.records)
    assert after == 200


def test_headers_past_the_parser_bounds_are_a_json_431_and_a_flood_of_bad_requests_is_a_few_log_lines(tmp_path, caplog):
    """aiohttp answers 400 for a header line past 8 190 bytes or more than 128 headers, where the
    status for it is 431 (docs/security.md); and every refused request wrote a warning: 2 000 bad
    requests, 2 000 lines. At most one line a second now, counting the others."""
    caplog.set_level(logging.WARNING, logger="vgpumon.exporter.server")
    with ServingAgent(f"sqlite:///{tmp_path / 'a.db'}", ReplayBackend(H200_CAPTURE)) as agent:
        answers = [_raw_request(agent.port, b"X-Big: " + b"a" * 100_000),
                   _raw_request(agent.port, b"\r\n".join(b"X-%d: 1" % i for i in range(500)))]
        flood = [_raw_request(agent.port, b"Authorization: Bearer x\x01") for _ in range(50)]
        after = get(agent.base + "/metrics")[0]
    for answer in answers:
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.split(b"\r\n")[0].split()[1] == b"431", head
        assert json.loads(body)["error"] == {"status": 431, "message": "request headers too large"}
    assert all(a.split(b"\r\n")[0].split()[1] == b"400" for a in flood)
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert 1 <= len(refused) < 20, len(refused)  # 52 refusals in a second or so: a few lines
    assert after == 200


def test_an_agent_off_loopback_without_a_token_keeps_its_api_closed(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="vgpumon.exporter.api"):
        with ServingAgent(f"sqlite:///{tmp_path / 'a.db'}", ReplayBackend(H200_CAPTURE), listen="0.0.0.0:0") as agent:
            status, _, body = get(agent.base + "/api/v1/snapshot", "anything")
            metrics = get(agent.base + "/metrics")[0]
    assert status == 401 and "no API token set" in body["error"]["message"]
    assert metrics == 200
    # said once at start too, not only to whoever asks
    assert [r.getMessage() for r in caplog.records].count(
        "the API on 0.0.0.0 is closed: this agent listens off loopback and has no API token ([api] token, "
        "VGPUMON_API_TOKEN); /metrics is served") == 1


def test_loopback_is_told_apart_from_every_other_address():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.5", "gpu-host-17", ""))


# -- vLLM servers, their processes and their stacks ---------------------------------------------------


def _python_for_py_spy() -> str:
    """An interpreter py-spy can read here. py-spy 0.4 finds the version of Debian's python3 but
    not of every build (a pyenv build with a shared libpython answers "Failed to find python
    version"): the stand-in server runs on the first that works."""
    return "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


class _Table:
    """The host's process table as the vLLM source sees it (a process edge): one vLLM server, the
    stand-in process, listening where the fake server serves the recorded vLLM 0.32 scrape."""

    def __init__(self, pid: int, port: int, started: float) -> None:
        self.proc = VllmProcess(pid=pid, create_time=started, host="127.0.0.1", port=port, pids=(pid,),
                                cmdline=("vllm", "serve", "tiny"))

    def scan(self) -> list[VllmProcess]:
        return [self.proc]

    def usage(self, pids):
        return None


def test_vllm_servers_their_gpus_processes_and_stacks(tmp_path):
    """A vLLM server found in the process table, whose process holds the H200 (the capture's
    process list names its pid: a documented rewrite of the recorded pid 451), answering the
    recorded vLLM 0.32 idle scrape: the report lists it with state, queue, KV usage and the GPU it
    holds; the process with its owner; and, asked for stacks, py-spy's dump under the server."""
    stand_in = subprocess.Popen([_python_for_py_spy(), "-c", "import time\nwhile True: time.sleep(0.5)"])
    servers = ServerThread()
    try:
        idle = (shared_dir("fixtures", "vllm-real") / "vllm-0.32.0-cpu__idle.txt").read_text()
        fake = servers.start(FakeVllmServer(metrics=idle, version="0.32.0", models=["tiny"]))
        header, ticks = scenarios.load(str(H200_CAPTURE))
        header, ticks = scenarios.edit_call(header, ticks, 0, "nvmlDeviceGetComputeRunningProcesses",
                                            lambda procs: [{**p, "pid": stand_in.pid} for p in procs], at=range(0, 200))
        ticks = list(ticks)
        first = min(t["ts"] for t in ticks if t["ts"] is not None)
        holder: dict = {}
        # the vLLM source dates its polls by the replay's own ticks, so that they fall in its window
        vllm = VllmSource(processes=_Table(stand_in.pid, fake.port, first - 40.0), interval=0.1, request_timeout=1.0,
                          clock=lambda: holder["a"].agent.latest.ts if holder["a"].agent and holder["a"].agent.latest else first)
        from vgpumon.sources.host import HostSource

        serving = ServingAgent(f"sqlite:///{tmp_path / 'v.db'}", scenarios.backend(header, ticks), api=ApiConfig(stacks=True),
                               vllm=vllm, host=HostSource(), host_every=1, paced=True, interval=0.05)
        holder["a"] = serving
        with serving as agent:
            status, _, rep = get(agent.base + "/api/v1/diagnose?stacks=1")
            text = diagnose(f"127.0.0.1:{agent.port}")
    finally:
        stand_in.kill()
        stand_in.wait()
        servers.close()
    assert status == 200
    (server,) = rep["vllm"]
    assert server["url"] == fake.url and server["state"] in ("idle", "ready") and server["gpus"] == [0]
    assert server["running"] == 0 and server["waiting"] == 0 and server["kv_cache_usage_ratio"] is not None
    (proc,) = rep["processes"]
    assert proc["pid"] == stand_in.pid and proc["gpu"] == 0 and proc["username"] and proc["used_gpu_memory_bytes"] > 0
    (stack,) = server["stacks"]
    assert stack["pid"] == stand_in.pid and "<module>" in stack.get("text", stack.get("error", "")), stack
    assert mismatches(rep, Report) == []  # stacks, owners: what only the agent adds is declared too
    assert "vLLM servers" in text.stdout and fake.url.split("//")[1] in text.stdout and "tiny" in text.stdout


def test_stacks_need_the_agents_permission(tmp_path):
    with ServingAgent(f"sqlite:///{tmp_path / 'a.db'}", ReplayBackend(H200_CAPTURE)) as agent:
        _, _, rep = get(agent.base + "/api/v1/diagnose?stacks=1")
        store_only = diagnose("localhost", "--db", f"sqlite:///{tmp_path / 'a.db'}", "--stacks", "--json")
        store_text = diagnose("h200-agent", "--db", f"sqlite:///{tmp_path / 'a.db'}", "--stacks")
    assert rep["stacks_note"] == "this agent's config does not allow stacks ([api] stacks = false)"
    assert "needs the host's agent" in json.loads(store_only.stdout)["stacks_note"]
    # the text report says so too, though it has no vLLM server to show
    assert "stacks: --stacks needs the host's agent; this report came from the store" in store_text.stdout


def _fake_py_spy(tmp_path: Path, message: str, code: int = 1) -> str:
    """A stand-in py-spy executable (a process edge) answering as py-spy does without ptrace rights."""
    exe = tmp_path / "py-spy"
    exe.write_text(f"#!/bin/sh\necho '{message}' >&2\nexit {code}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe)


def test_each_way_py_spy_fails_is_one_clear_line(tmp_path):
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    try:
        missing = dump(alive.pid, py_spy=str(tmp_path / "no-such-py-spy"))
        denied = dump(alive.pid, py_spy=_fake_py_spy(tmp_path, "Error: Permission Denied (os error 13)"))
        exited = dump(gone.pid, py_spy=shutil.which("py-spy") or _fake_py_spy(tmp_path, "unused"))
    finally:
        alive.kill()
        alive.wait()
    assert missing == {"pid": alive.pid, "error": "py-spy not installed on this host (pip install py-spy into vgpumon's environment)"}
    assert denied["error"].startswith(f"permission denied: py-spy needs ptrace rights over pid {alive.pid}") and "CAP_SYS_PTRACE" in denied["error"]
    assert exited == {"pid": gone.pid, "error": f"process {gone.pid} has exited"}
    for r in (missing, denied, exited):
        assert "\n" not in r["error"]


def test_diagnose_of_a_port_that_is_not_an_agent_says_so_once(tmp_path):
    """Something else answers on the port (a web server's 404): one UNKNOWN line that names its
    status once and asks whether that is an agent."""
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = diagnose(f"127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
    assert out.returncode == 3
    line = out.stdout.strip()
    assert "refused: HTTP 404 File not found (is that port a vgpumon agent?)" in line, line
    assert line.count("HTTP 404") == 1  # not "404": the random port may hold those digits (40415)


def test_diagnose_never_follows_a_redirect_with_its_token():
    """`diagnose HOST` with the API token: an answer redirecting elsewhere (a hostile process on
    the agent's port, a misconfigured proxy) is the agent refusing, said in one line; the token
    never travels to the host the redirect names."""
    import http.server
    import threading

    from vgpumon.diagnose.remote import AgentRefused, fetch_report

    seen: list[str | None] = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"status": "ok", "host": "h"}')

        def log_message(self, *a):
            pass

    elsewhere = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)

    class Redirects(Elsewhere):
        def do_GET(self):  # noqa: N802
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{elsewhere.server_port}/api/v1/diagnose")
            self.end_headers()

    agent = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirects)
    for server in (elsewhere, agent):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(AgentRefused) as refused:
            fetch_report("127.0.0.1", agent.server_port, token="s3cret-token", timeout=5.0)
    finally:
        agent.shutdown()
        elsewhere.shutdown()
    assert refused.value.status == 307 and "not followed" in str(refused.value)
    assert seen == []  # nothing, token or not, reached the other host
