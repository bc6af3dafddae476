"""``/metrics`` as a user reads it: the recorded H200 captures replayed tick by tick into the
exporter, scraped, parsed back as Prometheus parses them.

What a user would notice: the copy phase shows PCIe RX near the link's capacity while SM activity
is 0 and "GPU util" says 100 %; a lost GPU reads ``up 0`` with no stale readings and its XID 79
counted; slow fields (ECC) do not flicker between reads; an unsupported field (fan) has no
sample rather than 0; a stalled agent serves no readings; a pod's GPU is named by one info
series, so a pod move neither splits the GPU's series nor makes new XID counters.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from conftest import DATA, H200_CAPTURE, phase
from exporter_support import Scrape, fed, scrape, snapshots
from kubelet_support import sock_dir  # noqa: F401 - the fixture
from prometheus_client import CollectorRegistry, generate_latest

from vgpumon.alerts.feed import AlertSample, UnknownSample
from vgpumon.exporter import ExporterConfig
from vgpumon.exporter.collector import MetricsExporter
from vgpumon.exporter.server import MetricsServer
from vgpumon.model import HostSample, PodContainer, ProcessInfo
from vgpumon.model.kubernetes import DeviceAllocations
from vgpumon.sources.kubernetes import attach
from vgpumon.sources.nvml.capture import ReplayBackend
from vgpumon.testing import incident, scenarios
from vgpumon.testing.vllm import FakeClock

H200 = "GPU-00000000-0000-4000-8000-000000000000"
IDENTITY = {"hostname": "h200-replay", "gpu": "0", "uuid": H200}


def _gpu(i: int) -> dict[str, str]:
    return {"hostname": "h200-replay", "gpu": str(i), "uuid": f"GPU-00000000-0000-4000-8000-{i:012d}"}


@pytest.fixture(scope="module")
def workload() -> list:
    return snapshots(ReplayBackend(H200_CAPTURE))


@pytest.fixture(scope="module")
def eight() -> list:
    return snapshots(scenarios.backend(*incident.build(DATA)))


def test_copy_phase_reads_pcie_near_link_capacity_while_sms_idle(workload):
    p = phase("h2d_copy")
    upto = max(i for i, s in enumerate(workload) if p["start"] + 1.2 <= s.ts <= p["end"]) + 1
    m = scrape(fed(workload[:upto]))
    rx = m.value("vgpumon_gpu_pcie_rx_bytes_per_second", **IDENTITY)
    assert rx > 40e9
    assert m.value("vgpumon_gpu_pcie_link_capacity_bytes_per_second", **IDENTITY) == pytest.approx(63.0e9, rel=1e-3)
    assert m.value("vgpumon_gpu_pcie_rx_link_share_ratio", **IDENTITY) == pytest.approx(rx / 63.0e9, rel=1e-3)
    assert m.value("vgpumon_gpu_sm_active_ratio", **IDENTITY) < 0.05
    assert m.value("vgpumon_gpu_utilization_ratio", **IDENTITY) >= 0.9  # "util" says busy, no SM works
    # identity lives in the info gauge; a reading carries hostname, gpu, uuid (and what tells it
    # apart within its family: reason, xid; a process's pid — the capture's torch process)
    info = m.series("vgpumon_gpu_info")
    assert info == [({**IDENTITY, "name": "NVIDIA H200", "pci_bus_id": "00000000:00:06.0", "serial": "0000000000000",
                      "gpm_supported": "true"}, 1.0)]
    readings = [(n, lab) for n, lab, _ in m.samples if n.startswith("vgpumon_gpu_") and n != "vgpumon_gpu_info"]
    assert len(readings) > 40
    for n, lab in readings:
        assert set(lab) - {"reason", "xid", "pid"} == {"hostname", "gpu", "uuid"}, n


def test_unsupported_or_unrecorded_fields_have_no_sample_never_zero():
    m = scrape(fed(snapshots(ReplayBackend(DATA / "h200-idle-full.jsonl.gz"))))
    assert m.value("vgpumon_gpu_up", **IDENTITY) == 1.0
    assert m.value("vgpumon_gpu_fan_speed_ratio", **IDENTITY) is None  # passively cooled: NOT_SUPPORTED
    assert m.value("vgpumon_gpu_memory_temperature_celsius", **IDENTITY) is None  # not in that capture
    assert m.value("vgpumon_gpu_ecc_uncorrected_volatile_errors_total", **IDENTITY) == 0.0
    assert not any(n.startswith("vgpumon_vllm_") for n in m.names())  # no vLLM source: no vLLM series
    hbm = scrape(fed(snapshots(ReplayBackend(DATA / "h200-idle-hbm.jsonl.gz"))))
    assert hbm.value("vgpumon_gpu_memory_temperature_celsius", **IDENTITY) == 38.0  # nvidia-smi said 38


def test_slow_fields_keep_their_newest_read_between_reads():
    """The idle capture reads the slow set every 2 ticks; after a fast tick the ECC, energy and
    BAR1 series are still there, with the values of the newest slow read."""
    snaps = snapshots(ReplayBackend(DATA / "h200-idle-full.jsonl.gz"))
    slow_tick = max(i for i, s in enumerate(snaps[:-1]) if s.samples[0].energy_joules_total is not None)
    assert snaps[slow_tick + 1].samples[0].energy_joules_total is None  # the model leaves it out
    m = scrape(fed(snaps[: slow_tick + 2]))
    assert m.value("vgpumon_gpu_energy_joules_total", **IDENTITY) == snaps[slow_tick].samples[0].energy_joules_total
    assert m.value("vgpumon_gpu_bar1_total_bytes", **IDENTITY) == 274877906944.0
    assert m.types["vgpumon_gpu_energy_joules_total"] == "counter"


def test_lost_gpu_reads_down_without_readings_and_its_xid_79_is_counted(eight):
    """The 8-GPU incident: GPU 5 reports XID 79 at tick 45 and is lost from tick 46."""
    before = scrape(fed(eight[: incident.LOST_AT]))
    assert before.value("vgpumon_gpu_xid_events_total", **_gpu(5), xid="79") == 0.0  # served from 0
    m = scrape(fed(eight[: incident.LOST_AT + 5]))
    assert m.value("vgpumon_gpu_up", **_gpu(5)) == 0.0
    assert m.value("vgpumon_gpu_memory_used_bytes", **_gpu(5)) is None
    assert m.value("vgpumon_gpu_power_usage_watts", **_gpu(5)) is None
    assert m.value("vgpumon_gpu_xid_events_total", **_gpu(5), xid="79") == 1.0
    assert m.types["vgpumon_gpu_xid_events_total"] == "counter"
    assert m.value("vgpumon_gpu_xid_events_total", **_gpu(0), xid="79") == 0.0
    assert m.value("vgpumon_gpu_xid_events_total", **_gpu(2), xid="13") == 1.0
    assert m.value("vgpumon_gpu_info", **_gpu(5), name="NVIDIA H200", serial="0000000000005",
                   pci_bus_id="00000000:68:00.0", gpm_supported="true") == 1.0  # still known
    for i in set(range(8)) - {5}:
        assert m.value("vgpumon_gpu_up", **_gpu(i)) == 1.0
        assert m.value("vgpumon_gpu_power_usage_watts", **_gpu(i)) > 0
    assert m.value("vgpumon_gpu_ecc_uncorrected_volatile_errors_total", **_gpu(3)) == 1.0
    assert m.value("vgpumon_gpu_remapped_rows_pending", **_gpu(3)) == 1.0


def test_a_stalled_agent_serves_its_gpus_down_and_says_how_old_the_data_is(workload):
    clock = FakeClock(100.0)
    ex = fed(workload[:10], clock=clock, interval=1.0)
    assert scrape(ex).value("vgpumon_gpu_up", **IDENTITY) == 1.0
    clock.advance(3.5)  # more than three intervals without a tick: the NVML thread is stuck
    m = scrape(ex)
    assert m.value("vgpumon_gpu_up", **IDENTITY) == 0.0
    assert m.value("vgpumon_gpu_sample_age_seconds", **IDENTITY) == 3.5
    assert m.value("vgpumon_gpu_memory_used_bytes", **IDENTITY) is None
    assert m.value("vgpumon_agent_source_up", hostname="h200-replay", source="nvml") == 0.0
    ex.observe(workload[10])
    assert scrape(ex).value("vgpumon_gpu_memory_used_bytes", **IDENTITY) is not None


def test_kubernetes_owners_are_one_info_series_and_a_pod_move_keeps_the_gpus_series(eight):
    """GPU 0 is allocated to one container; GPU 1 is time-sliced between two. The holders are
    the info series (GPU 0's one, both of GPU 1's); no GPU reading, counter or up carries a pod,
    so when GPU 0's pod is rescheduled its readings and XID counters stay the same series and
    only the info series names the new pod. GPU processes keep their own owner's labels."""
    vllm = PodContainer("serving", "vllm-llama-0", "vllm")
    a, b = PodContainer("research", "nb-alice", "notebook"), PodContainer("research", "nb-bob", "notebook")
    snap = eight[30]
    g0, g1 = snap.gpus[0].uuid, snap.gpus[1].uuid
    pid = 4242
    samples = (dataclasses.replace(snap.samples[0], processes=((pid, 1 << 30),)), *snap.samples[1:])
    host = HostSample(ts=snap.ts, processes={pid: ProcessInfo(pid=pid, resolved=True, name="python3", container_id="c" * 64, rss_bytes=1 << 28, cpu_seconds_total=12.5)})
    snap = dataclasses.replace(snap, samples=samples, host=host)
    alloc = DeviceAllocations(ts=snap.ts, devices={g0: (vllm,), g1: (a, b)})
    m = scrape(fed([attach(snap, alloc)]))
    owner = {"namespace": "serving", "pod": "vllm-llama-0", "container": "vllm"}
    for name in ("vgpumon_gpu_memory_used_bytes", "vgpumon_gpu_up", "vgpumon_gpu_xid_events_total"):
        assert {tuple(sorted(lab)) for lab, _ in m.series(name)} <= {("gpu", "hostname", "uuid"), ("gpu", "hostname", "uuid", "xid")}, name
    assert ({**_gpu(0), **owner}, 1.0) in m.series("vgpumon_gpu_kubernetes_holder_info")
    assert m.value("vgpumon_gpu_kubernetes_holders", **_gpu(1)) == 2.0
    moved = PodContainer("serving", "vllm-llama-1", "vllm")  # rescheduled: a new pod on the same GPU
    after = scrape(fed([attach(snap, DeviceAllocations(ts=snap.ts, devices={g0: (moved,), g1: (a, b)}))]))
    for name in ("vgpumon_gpu_memory_used_bytes", "vgpumon_gpu_up", "vgpumon_gpu_xid_events_total"):
        assert [lab for lab, _ in after.series(name)] == [lab for lab, _ in m.series(name)], name  # the same series
    assert [lab["pod"] for lab, _ in after.series("vgpumon_gpu_kubernetes_holder_info") if lab["gpu"] == "0"] == ["vllm-llama-1"]
    assert sorted(lab["pod"] for lab, _ in m.series("vgpumon_gpu_kubernetes_holder_info") if lab["gpu"] == "1") == ["nb-alice", "nb-bob"]
    proc = {**_gpu(0), "pid": str(pid), "command": "python3", **owner}
    assert m.value("vgpumon_gpu_process_memory_used_bytes", **proc) == float(1 << 30)
    assert m.value("vgpumon_gpu_process_cpu_seconds_total", **proc) == 12.5
    assert m.types["vgpumon_gpu_process_cpu_seconds_total"] == "counter"


class _Rules:
    """The rules engine as the exporter sees it (the interface of vgpumon.alerts.feed)."""

    def alerts(self):
        return [
            AlertSample("GpuLost", "critical", "firing", {"gpu": "5", "uuid": "GPU-5", "value": "0"}),
            AlertSample("GpuMemoryLeak", "warning", "pending", {"gpu": "0", "uuid": H200}),
            AlertSample("VllmDead", "critical", "resolved", {"server": "127.0.0.1:8000"}),
        ]

    def unknown(self):
        return [
            UnknownSample("GpuStuck", "critical", "not_applicable", {"gpu": "0", "uuid": H200}),
            UnknownSample("GpuProcessMemoryLeak", "warning", "warming_up", {"gpu": "0", "uuid": H200, "pid": "11"}),
            UnknownSample("GpuProcessMemoryLeak", "warning", "warming_up", {"gpu": "0", "uuid": H200, "pid": "12"}),
        ]

    def memory_slopes(self):
        return {H200: 3472.2}


def test_rules_feed_alerts_and_leak_slope(workload):
    m = scrape(fed(workload[:3], rules=_Rules()))
    assert m.value("vgpumon_alerts", hostname="h200-replay", alertname="GpuLost", severity="critical", state="firing",
                   gpu="5", uuid="GPU-5") == 1.0  # what the alert is about; never its value
    assert m.value("vgpumon_alerts", hostname="h200-replay", alertname="GpuMemoryLeak", severity="warning",
                   state="pending", gpu="0", uuid=H200) == 1.0
    assert [lab for lab, _ in m.series("vgpumon_alerts") if lab["alertname"] == "VllmDead"] == []  # resolved: gone
    assert m.value("vgpumon_gpu_memory_used_slope_bytes_per_second", **IDENTITY) == 3472.2
    assert m.value("vgpumon_rule_unknown", hostname="h200-replay", rule="GpuStuck", severity="critical",
                   reason="not_applicable", gpu="0", uuid=H200) == 1.0
    # two processes of one GPU that cannot be judged yet: one series of that GPU, no pid label
    leaks = [lab for lab, _ in m.series("vgpumon_rule_unknown") if lab["rule"] == "GpuProcessMemoryLeak"]
    assert leaks == [{"hostname": "h200-replay", "rule": "GpuProcessMemoryLeak", "severity": "warning",
                      "reason": "warming_up", "gpu": "0", "uuid": H200}], leaks
    plain = scrape(fed(workload[:3]))
    assert plain.series("vgpumon_alerts") == [] and plain.series("vgpumon_gpu_memory_used_slope_bytes_per_second") == []


def test_agent_health_before_the_first_tick_and_after(workload):
    m = scrape(fed([]))
    assert m.value("vgpumon_agent_build_info", hostname="h200-replay", version=__import__("vgpumon").__version__) == 1.0
    assert not any(n.startswith("vgpumon_gpu_") for n in m.names())
    m = scrape(fed(workload[:2]))
    assert m.value("vgpumon_agent_source_up", hostname="h200-replay", source="nvml") == 1.0
    assert m.value("vgpumon_agent_source_last_success_timestamp_seconds", hostname="h200-replay", source="nvml") == workload[1].ts


def test_a_replay_serves_its_last_success_on_the_wall_clock_prometheus_compares_with(workload):
    """The recorded H200 capture replayed (its ticks carry their capture time, days before
    today): Prometheus compares vgpumon_agent_source_last_success_timestamp_seconds with its own
    time(), so a capture-time stamp made VgpumonSourceSilent{source="nvml"} fire for the whole
    replay while the agent, judging in data time, saw NVML answer every tick. A replay's stamp
    is moved to the wall clock the tick was taken in at; a live agent's is served as read."""
    clock = {"now": 1_900_000_000.0}  # the replay's wall clock, long after the capture
    ex = MetricsExporter(hostname="h200-replay", monotonic=FakeClock(0.0), wall=lambda: clock["now"])
    for k, snap in enumerate(workload[:5]):
        clock["now"] = 1_900_000_000.0 + k
        ex.observe(snap)
    served = scrape(ex).value("vgpumon_agent_source_last_success_timestamp_seconds", hostname="h200-replay", source="nvml")
    assert workload[4].ts < 1_800_000_000 and served == pytest.approx(1_900_000_004.0)  # the age Prometheus sees: 0 s
    live = scrape(fed(workload[:5])).value("vgpumon_agent_source_last_success_timestamp_seconds", hostname="h200-replay", source="nvml")
    assert live == workload[4].ts


def test_our_text_is_prometheus_clients_text_of_the_same_registry(eight):
    ex = fed(eight[: incident.LOST_AT + 3], rules=_Rules())
    registry = CollectorRegistry()
    registry.register(ex)
    assert ex.render() == generate_latest(registry)


def test_healthz_and_metrics_over_http_need_no_token(workload):
    async def go():
        clock = FakeClock(0.0)
        ex = MetricsExporter(hostname="h200-replay", monotonic=clock)
        server = MetricsServer(ex, "127.0.0.1", 0)
        await server.start()
        import aiohttp

        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(server.url + "/healthz") as r:
                    starting = (r.status, (await r.json())["status"])
                ex.observe(workload[0])
                async with http.get(server.url + "/healthz") as r:
                    ok = r.status
                async with http.get(server.url + "/metrics", headers={"Accept": "application/openmetrics-text"}) as r:
                    metrics = (r.status, r.headers["Content-Type"], await r.text())
                clock.advance(10)
                async with http.get(server.url + "/healthz") as r:
                    stale = (r.status, (await r.json())["status"])
        finally:
            await server.stop()
        return starting, ok, metrics, stale

    starting, ok, (status, ctype, body), stale = asyncio.run(go())
    assert starting == (503, "starting") and ok == 200 and stale == (503, "stale")
    assert status == 200 and ctype == "text/plain; version=0.0.4; charset=utf-8"
    assert Scrape(body).value("vgpumon_gpu_up", **IDENTITY) == 1.0


def test_shared_upstream_ports_and_their_capacity_from_the_recorded_sysfs_tree(tmp_path):
    """The 8-GPU incident with its sysfs tree (four GPUs per switch, Gen5 x16 everywhere): each
    switch and root port lists the four GPUs below it, with the port's own link capacity; the
    host bridge lists all eight and has no capacity (it has no link)."""
    from vgpumon.agent import Agent
    from vgpumon.sources.nvml import NvmlSource
    from vgpumon.store import open_store

    store = open_store(f"sqlite:///{tmp_path / 'x.db'}")
    agent = Agent(NvmlSource(scenarios.backend(*incident.build(DATA))), store, hostname="h200-replay", paced=False,
                  sysfs_root=str(incident.sysfs_tree(DATA, tmp_path / "sys")))
    ex = MetricsExporter.for_agent(agent)
    try:
        asyncio.run(agent.run())
    finally:
        store.close()
    m = scrape(ex)
    below = {}
    for lab, _ in m.series("vgpumon_pcie_upstream_gpu_info"):
        below.setdefault((lab["port"], lab["kind"]), []).append(int(lab["gpu"]))
    assert below == {
        ("0000:00:01.0", "root"): [0, 1, 2, 3], ("0000:10:00.0", "bridge"): [0, 1, 2, 3],
        ("0000:00:03.0", "root"): [4, 5, 6, 7], ("0000:20:00.0", "bridge"): [4, 5, 6, 7],
        ("pci0000:00", "host_bridge"): list(range(8)),
    }
    capacity = {lab["port"]: v for lab, v in m.series("vgpumon_pcie_upstream_link_capacity_bytes_per_second")}
    assert capacity == pytest.approx({p: 63.0e9 for p in ("0000:00:01.0", "0000:10:00.0", "0000:00:03.0", "0000:20:00.0")}, rel=1e-3)
    assert m.value("vgpumon_agent_ticks_total", hostname="h200-replay") == agent.stats.ticks
    assert m.value("vgpumon_agent_gpu_rows_written_total", hostname="h200-replay") == agent.stats.rows_written == 8 * agent.stats.ticks
    assert m.value("vgpumon_agent_backlog_rows", hostname="h200-replay", where="spool") == 0.0


def test_agent_attaches_the_kubelets_owners_to_each_tick_and_serves_them(sock_dir):
    """The agent runs the Kubernetes source against a kubelet (a real gRPC server on a unix
    socket) while it replays the H200 capture: the GPU's readings carry the pod's labels and the
    source's status is served beside NVML's."""
    from kubelet_support import answer, container, devices, fake_kubelet, pod

    from vgpumon.agent import Agent
    from vgpumon.sources.kubernetes import KubernetesSource, PodResourcesClient
    from vgpumon.sources.nvml import NvmlSource

    sock = sock_dir / "kubelet.sock"
    kubelet = answer(pod("serving", "vllm-llama-0", container("vllm", devices("nvidia.com/gpu", H200))))
    with fake_kubelet(sock, kubelet):
        agent = Agent(NvmlSource(ReplayBackend(H200_CAPTURE)), None, hostname="h200-replay", interval=0.02,
                      kubernetes=KubernetesSource(PodResourcesClient(sock), period=3600))
        # scraped after the run has ended: judge freshness on a scale the test cannot outlast
        ex = MetricsExporter.for_agent(agent, ExporterConfig(stale_after_intervals=1e6))
        asyncio.run(agent.run())
    owner = {"namespace": "serving", "pod": "vllm-llama-0", "container": "vllm"}
    assert agent.latest.kubernetes.gpus[H200].labels() == owner
    m = scrape(ex)
    assert m.value("vgpumon_gpu_up", **IDENTITY) is not None
    assert m.value("vgpumon_gpu_kubernetes_holder_info", **IDENTITY, **owner) == 1.0
    assert m.value("vgpumon_agent_source_up", hostname="h200-replay", source="kubernetes") == 1.0


def test_a_gpu_without_gpm_is_served_as_rules_that_do_not_apply_not_as_silence_nor_as_blind(tmp_path):
    """The recorded H200 copy without GPM (16 s): GpuStuck and GpuMemoryHeldIdle can never fire
    on it. /metrics says so with the agent's own verdict, one series per rule and GPU with the
    bounded reason ``not_applicable`` (the GPU has no GPM: nothing is missing), and
    VgpumonRuleCannotJudge is not on its way for them, nor for the leak rule that only waits for
    its hours of history (docs/rules.md, "Cannot judge, or not applicable")."""
    from vgpumon.agent import Agent
    from vgpumon.alerts.runner import RuleRunner
    from vgpumon.alerts.sinks import LogSink
    from vgpumon.rules.core import UNKNOWN_CODES
    from vgpumon.sources.nvml import NvmlSource
    from vgpumon.store import open_store
    store = open_store(f"sqlite:///{tmp_path / 'x.db'}")
    runner = RuleRunner(sinks=[LogSink()], wall=None)
    agent = Agent(NvmlSource(ReplayBackend(DATA / "h200-nogpm-copy.jsonl.gz")), store, hostname="h", paced=False, rules=runner)
    try:
        asyncio.run(agent.run())
    finally:
        store.close()
    m = Scrape(MetricsExporter.for_agent(agent, ExporterConfig(listen="off"), rules=runner).render().decode())
    unknown = {lab["rule"]: lab for lab, _ in m.series("vgpumon_rule_unknown")}
    assert unknown["GpuStuck"]["reason"] == unknown["GpuMemoryHeldIdle"]["reason"] == "not_applicable", unknown
    assert unknown["GpuStuck"]["gpu"] == "0" and unknown["GpuStuck"]["severity"] == "critical"
    assert unknown["GpuMemoryLeak"]["reason"] == "warming_up"
    assert "GpuXidCritical" not in unknown and "GpuLost" not in unknown  # judged: ok, not unknown
    assert {lab["reason"] for lab in unknown.values()} <= set(UNKNOWN_CODES), unknown  # never "other" here
    blind = {lab["rule"]: lab["state"] for lab, _ in m.series("vgpumon_alerts") if lab["alertname"] == "VgpumonRuleCannotJudge"}
    assert "GpuStuck" not in blind and "GpuMemoryHeldIdle" not in blind, blind
    assert "GpuMemoryLeak" not in blind and "GpuXidCritical" not in blind, blind


def test_the_agents_rule_engine_feeds_vgpumon_alerts(tmp_path):
    """The real engine behind /metrics: the 8-GPU incident replayed with rules on; what the
    engine holds firing (XID 79, uncorrectable ECC) is served as vgpumon_alerts, labelled by
    the GPU it is about, and a leak slope only where the leak rule has one (none in minutes)."""
    from vgpumon.agent import Agent
    from vgpumon.alerts.runner import RuleRunner
    from vgpumon.alerts.sinks import LogSink
    from vgpumon.sources.nvml import NvmlSource
    from vgpumon.store import open_store
    cap = incident.write(DATA, tmp_path / "incident.jsonl.gz", tick_seconds=1.0)
    store = open_store(f"sqlite:///{tmp_path / 'x.db'}")
    runner = RuleRunner(sinks=[LogSink()], wall=None)
    agent = Agent(NvmlSource(ReplayBackend(cap)), store, hostname="h", paced=False, rules=runner)
    try:
        asyncio.run(agent.run())
    finally:
        store.close()
    exporter = MetricsExporter.for_agent(agent, ExporterConfig(listen="off"), rules=runner)
    text = exporter.render().decode()
    firing = [ln for ln in text.splitlines() if ln.startswith("vgpumon_alerts{") and 'state="firing"' in ln]
    assert any('alertname="GpuXidCritical"' in ln and 'gpu="5"' in ln for ln in firing), firing
    assert any('alertname="GpuEccUncorrectable"' in ln and 'gpu="3"' in ln for ln in firing), firing
    assert runner.memory_slopes() == {}
