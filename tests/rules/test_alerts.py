"""The alert lifecycle and its sinks, as an operator meets them: an alert at its threshold does not
flap, an agent restart does not page twice, a failing sink is retried while the others deliver,
and a real Alertmanager (Debian's prometheus-alertmanager) receives firing and resolved alerts."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from typing import Sequence

import aiohttp
import pytest
from aiohttp import web
from rules_support import PCIE_GPM, copy_phase, firing, stored_alerts

from vgpumon.agent import Agent
from vgpumon.alerts.runner import RuleRunner
from vgpumon.alerts.sinks import AlertmanagerSink, Dispatcher, Sink, WebhookSink
from vgpumon.config.thresholds import Thresholds
from vgpumon.model import Alert
from vgpumon.rules.catalogue import rule_names
from vgpumon.rules.engine import Engine
from vgpumon.sources.nvml import NvmlSource
from vgpumon.store import open_store
from vgpumon.testing import scenarios
from vgpumon.testing.vllm import free_port


class RecordingSink(Sink):
    """A sink that keeps what it is sent (the test's receiver)."""

    name = "recording"

    def __init__(self) -> None:
        self.got: list[tuple[str, str, dict]] = []

    async def send(self, session: aiohttp.ClientSession, alerts: Sequence[Alert], now: float) -> None:
        self.got += [(a.name, a.state, dict(a.labels)) for a in alerts]


def _blocks(*blocks: tuple[float, float]) -> tuple[dict, list]:
    """The recorded copy phase (94-96 % of the link) scaled block by block: ``(share, minutes)``
    of the recorded traffic for that long, one block after the other in time."""
    header, ticks = None, []
    offset = 0.0
    for share, minutes in blocks:
        h, t = scenarios.scale_gpm(*copy_phase(minutes=minutes), PCIE_GPM, share)
        body = [x for x in t if x["tick"] >= 0]
        if header is None:
            header, ticks = h, [x for x in t if x["tick"] < 0]
            first = body[0]["ts"]
        shift = offset - (body[0]["ts"] - first)
        n = len([x for x in ticks if x["tick"] >= 0])
        ticks += [{**x, "tick": n + i, "ts": x["ts"] + shift} for i, x in enumerate(body)]
        offset = ticks[-1]["ts"] + 1.0 - first
    return header, ticks


def _run(url: str, header: dict, ticks: list, sink: Sink) -> None:
    store = open_store(url)
    runner = RuleRunner(Engine(), sinks=[sink], wall=None)
    try:
        asyncio.run(Agent(NvmlSource(scenarios.backend(header, ticks)), store, hostname="h", paced=False, rules=runner).run())
    finally:
        store.close()


def test_an_alert_at_its_threshold_fires_once_and_resolves_once(tmp_path):
    """PCIe at 83 % of the link for 12 min, 78 % for 12 min (below the 80 % that fires, above the
    75 % that clears), 83 % again, then 47 % for 20 min: one episode, fired once, resolved once —
    in the 47 % block, not the 78 % one."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    header, ticks = _blocks((0.88, 12), (0.83, 12), (0.88, 12), (0.5, 20))
    sink = RecordingSink()
    _run(url, header, ticks, sink)
    (episode,) = [a for a in stored_alerts(url) if a.name == "GpuPcieSaturated"]
    assert [(n, s) for n, s, _ in sink.got if n == "GpuPcieSaturated"] == [("GpuPcieSaturated", "firing"), ("GpuPcieSaturated", "resolved")]
    start = ticks[1]["ts"]
    assert episode.resolved_at - start > 36 * 60  # during the last block (from minute 36 on)


def test_an_agent_restart_keeps_its_firing_alert_and_does_not_page_again(tmp_path):
    """Run 1 replays 10 min of the copy phase (the alert fires); run 2, a restarted agent on the
    same store, replays the next 10 min: the alert is restored as firing and not sent again."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    header, ticks = copy_phase(minutes=20)
    init = [t for t in ticks if t["tick"] < 0]
    body = [t for t in ticks if t["tick"] >= 0]
    half = len(body) // 2
    first, second = RecordingSink(), RecordingSink()
    _run(url, header, init + body[:half], first)
    _run(url, header, init + [{**t, "tick": i} for i, t in enumerate(body[half:])], second)
    assert [(n, s) for n, s, _ in first.got] == [("GpuPcieSaturated", "firing")]
    # nothing the first run paged is paged again; the restarted agent only adds the rules that
    # could not judge the capture (a replay counter read once in 10 min) once their 15 min,
    # counted across the restart, have passed; row remapping, absent from this board's capture,
    # is not applicable, not a blind spot, and pages nothing
    assert {n for n, _, _ in second.got} == {"VgpumonRuleCannotJudge"}, second.got
    judged = [(lab["rule"], s) for _, s, lab in second.got]
    assert ("GpuPcieReplaysHigh", "firing") in judged and not any(r == "GpuRowRemapFailed" for r, _ in judged), judged
    (episode,) = firing(stored_alerts(url), "GpuPcieSaturated")
    assert episode.state == "firing" and episode.last_eval >= body[-1]["ts"] - 5


# -- sinks ------------------------------------------------------------------------------------------


def _alert(state: str = "firing") -> Alert:
    now = time.time()
    return Alert(name="GpuStuck", severity="critical", labels={"hostname": "h", "gpu": "0", "uuid": "GPU-1"}, state=state,
                 active_since=now - 300, last_eval=now, fired_at=now - 1, resolved_at=now if state == "resolved" else None,
                 summary="A GPU reads fully utilized while nothing on it works.", description="stuck for 5 min",
                 runbook_url="docs/runbooks/GpuStuck.md")


async def _receiver(routes: dict) -> tuple[web.AppRunner, int]:
    """A real HTTP receiver on loopback serving POSTs on ``routes``; returns it and its port."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_post(path, handler)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


def test_a_failing_webhook_is_retried_and_a_hanging_one_holds_nobody_up():
    """The webhook answers 503 twice, then 200; another sink's URL never answers. submit() returns
    at once, the first webhook gets the alert on the third try, and the hanging one is retried."""
    got: list[dict] = []
    calls = {"n": 0}

    async def handler(request: web.Request) -> web.Response:
        calls["n"] += 1
        if calls["n"] <= 2:
            return web.Response(status=503)
        got.append(await request.json())
        return web.Response(status=200)

    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(3600)
        return web.Response(status=200)

    async def go() -> Dispatcher:
        runner, port = await _receiver({"/hook": handler, "/hang": hang})
        d = Dispatcher([WebhookSink(f"http://127.0.0.1:{port}/hook"), WebhookSink(f"http://127.0.0.1:{port}/hang", timeout=0.3)],
                       sleep=lambda s: asyncio.sleep(0.01))
        await d.start()
        d.submit([_alert()])  # returns at once: nothing is sent on the caller's time
        for _ in range(300):
            if got and d.failures["webhook-2"] >= 2:
                break
            await asyncio.sleep(0.02)
        await d.close(timeout=0.2)
        await runner.cleanup()
        return d

    d = asyncio.run(go())
    (body,) = got
    assert body["status"] == "firing" and body["alerts"][0]["name"] == "GpuStuck" and body["alerts"][0]["labels"]["gpu"] == "0"
    assert d.failures["webhook"] == 2 and d.sent["webhook"] == 1
    assert d.failures["webhook-2"] >= 2 and d.sent["webhook-2"] == 0


def test_a_webhook_that_redirects_is_not_followed():
    """The receiver answers 307 to another URL (a hostile or misconfigured one): the alert is not
    posted there; the sink counts a failure and the log line says it was a redirect."""
    elsewhere: list[dict] = []

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect("/elsewhere")

    async def other(request: web.Request) -> web.Response:
        elsewhere.append(await request.json())
        return web.Response(status=200)

    async def go() -> Dispatcher:
        runner, port = await _receiver({"/hook": redirect, "/elsewhere": other})
        d = Dispatcher([WebhookSink(f"http://127.0.0.1:{port}/hook")], sleep=lambda s: asyncio.sleep(0.01))
        await d.start()
        d.submit([_alert()])
        for _ in range(300):
            if d.failures["webhook"] >= 1:
                break
            await asyncio.sleep(0.02)
        await d.close(timeout=0.2)
        await runner.cleanup()
        return d

    d = asyncio.run(go())
    assert d.failures["webhook"] >= 1 and d.sent["webhook"] == 0
    assert elsewhere == []


ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


@pytest.mark.skipif(ALERTMANAGER is None, reason="Alertmanager (Debian package prometheus-alertmanager) not installed")
def test_a_real_alertmanager_receives_firing_then_resolved(tmp_path):
    port = free_port()
    (tmp_path / "am.yml").write_text('route:\n  receiver: "null"\nreceivers:\n  - name: "null"\n')
    proc = subprocess.Popen(
        [ALERTMANAGER, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"

    async def go() -> tuple[list, list]:
        async with aiohttp.ClientSession() as s:
            for _ in range(200):  # wait for it to listen
                try:
                    async with s.get(f"{base}/-/ready") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
            sink = AlertmanagerSink(base)
            await sink.send(s, [_alert()], time.time())
            async with s.get(f"{base}/api/v2/alerts") as r:
                active = await r.json()
            await sink.send(s, [_alert("resolved")], time.time())
            async with s.get(f"{base}/api/v2/alerts?active=true") as r:
                after = await r.json()
        return active, after

    try:
        active, after = asyncio.run(go())
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    (a,) = active
    assert a["labels"] == {"alertname": "GpuStuck", "severity": "critical", "hostname": "h", "gpu": "0", "uuid": "GPU-1"}
    assert a["annotations"]["runbook_url"] == "docs/runbooks/GpuStuck.md" and a["status"]["state"] == "active"
    assert after == []  # resolved: its endsAt is its resolution


# -- thresholds from the settings file ------------------------------------------------------------


def test_thresholds_load_from_a_rules_section_and_refuse_unknown_keys():
    th = Thresholds.from_mapping({"pcie_saturation_ratio": 0.9, "stuck_window_seconds": "10m", "for": {"GpuMemoryLeak": "2h"},
                                  "disabled": ["GpuMemoryNearlyFull"]}, rule_names)
    assert th.pcie_saturation_ratio == 0.9 and th.stuck_window_seconds == 600.0
    engine = Engine(th)
    assert engine.by_name["GpuMemoryLeak"].for_(th) == 7200.0 and "GpuMemoryNearlyFull" not in engine.by_name
    for bad, message in (({"pcie_saturation": 0.9}, "unknown threshold"), ({"for": {"GpuLeak": "1h"}}, "unknown rule GpuLeak"),
                         ({"stuck_window_seconds": "soon"}, "not a duration"), ({"memory_full_ratio": "high"}, "not a number")):
        with pytest.raises(ValueError, match=message):
            Thresholds.from_mapping(bad, rule_names)


def test_thresholds_refuse_values_outside_their_kind_and_a_clearing_ratio_follows_a_lowered_one():
    """A ratio written as a percentage, a window of 0 s or a clearing ratio above the firing one
    would silence a rule: refused. A saturation ratio lowered alone takes the clearing ratio down
    with it (in the defaults' proportion), as a user who set only the first expects."""
    for bad, message in (({"pcie_saturation_ratio": 80}, "pcie_saturation_ratio: 80 is outside 0 ≤ x ≤ 1"),
                         ({"memory_full_ratio": -0.1}, "memory_full_ratio: -0.1 is outside"),
                         ({"xid_window_seconds": 0}, "xid_window_seconds: 0 s is not a duration above 0 s"),
                         ({"kv_window_seconds": float("inf")}, "kv_window_seconds: inf is not a duration"),
                         ({"vllm_engine_lost_polls": 0}, "vllm_engine_lost_polls: 0 is not a number of polls"),
                         ({"vllm_engine_lost_polls": float("nan")}, "vllm_engine_lost_polls: nan is not a finite number"),
                         ({"vllm_engine_lost_polls": 10**400}, "vllm_engine_lost_polls: 100000000000… .* is too large"),
                         ({"vllm_engine_lost_polls": 2.5}, "vllm_engine_lost_polls: 2.5 is not a whole number"),
                         ({"vllm_prewarm_slower_factor": 0.5}, "vllm_prewarm_slower_factor: 0.5 is outside 1 ≤ x"),
                         ({"for": {"GpuLost": -60}}, "for.GpuLost: -1 min is not a duration"),
                         ({"for": ["GpuLost"]}, "for: not a table of rule = duration"),
                         ({"disabled": "GpuLost"}, "disabled: not a list of rule names"),
                         ({"pcie_saturation_ratio": 0.7, "pcie_clear_ratio": 0.75}, "pcie_clear_ratio: 0.75 is above")):
        with pytest.raises(ValueError, match=message):
            Thresholds.from_mapping(bad, rule_names)
    lowered = Thresholds.from_mapping({"pcie_saturation_ratio": 0.6})
    assert lowered.pcie_clear_ratio == pytest.approx(0.6 * 0.75 / 0.8)
    assert Thresholds.from_mapping({"pcie_saturation_ratio": 0.95}).pcie_clear_ratio == 0.75
    assert Thresholds.from_mapping({"vllm_early_ttft_min_seconds": 0}).vllm_early_ttft_min_seconds == 0
    # settings that are unusual, not mistakes: "exactly idle", "any amount", a long lookback
    unusual = Thresholds.from_mapping({"stuck_engine_ratio": 0, "memory_idle_sm_ratio": 0, "memory_idle_min_bytes": 0,
                                       "missing_lookback_seconds": "45d", "vllm_engine_lost_polls": 5.0})
    assert unusual.stuck_engine_ratio == 0 and unusual.missing_lookback_seconds == 45 * 86400 and unusual.vllm_engine_lost_polls == 5
