"""``diagnose`` on vLLM's serving signals: per server its SLO attainment, prefix-cache hits,
preemptions, speculative-decoding acceptance and LMCache's hit ratios and cache; and the share of a saturated GPU's PCIe traffic
that KV offload moved. The vLLM source polls fake servers serving the recorded vLLM 0.32 scrapes
(idle, then busy) and the vLLM 0.33 KV-offload expositions (tests/data/vllm-0.33-kv-offload); the
GPU rows are the recorded H200 copy phase, which saturates its Gen5 x16 link."""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys

import pytest
from conftest import DATA, KEEP_ALL
from rich.console import Console
from rules_support import copy_phase, replay
from shape_support import mismatches
from vllm_support import shared_dir, source

from vgpumon.capacity import render
from vgpumon.capacity.review import review_host
from vgpumon.capacity.schema import HostReview
from vgpumon.diagnose.render import render_diagnose
from vgpumon.diagnose.report import build_report
from vgpumon.model import GpuSample, Snapshot
from vgpumon.sources.vllm import VllmProcess
from vgpumon.store import Store
from vgpumon.store.vllm_repository import VllmRepository
from vgpumon.testing.vllm import FakeClock, FakeProcessTable, FakeVllmServer, free_port

GPU = "GPU-00000000-0000-4000-8000-000000000000"
REAL = shared_dir("fixtures", "vllm-real")
OFFLOAD = DATA / "vllm-0.33-kv-offload"
#: t0 → t1 of the KV-offload expositions, 10 s apart: load +11.4 GB, store +2.4 GB
LOAD_BPS, STORE_BPS = 11.4e9 / 10, 2.4e9 / 10


def _lmcache(scrape: str) -> str:
    """The ``lmcache:`` lines of a derived LMCache scrape (tests/data/vllm-0.32-lmcache): the 0.33
    server runs LMCache's connector too."""
    text = (DATA / "vllm-0.32-lmcache" / f"{scrape}.txt").read_text()
    return "".join(ln for ln in text.splitlines(keepends=True) if "lmcache:" in ln)


def _poll(end: float, gpus: tuple[str, ...] = (GPU,)) -> list:
    """Two servers polled twice, 10 s apart, the second poll at ``end``: ``0.32`` serves the
    recorded idle then busy scrapes (no GPU the agent can see), ``0.33`` the KV-offload
    expositions, its engine (pid 4243) holding ``gpus``."""

    async def go():
        clock = FakeClock(start=end - 10)
        real = FakeVllmServer(port=free_port(), version="0.32.0", models=["tiny"], metrics=(REAL / "vllm-0.32.0-cpu__idle.txt").read_text())
        kv = FakeVllmServer(port=free_port(), version="0.33.0", models=["tiny"], metrics=(OFFLOAD / "t0.txt").read_text() + _lmcache("t0"))
        table = [VllmProcess(pid=pid, create_time=clock.now - 600, host="127.0.0.1", port=srv.port, pids=(pid, pid + 1))
                 for pid, srv in ((4000, real), (4242, kv))]
        src = source(clock, processes=FakeProcessTable(table))
        for srv in (real, kv):
            await srv.start(srv.port)
        out = []
        try:
            for step in range(2):
                src.observe(Snapshot(ts=clock.now, hostname="h", gpus=(), samples=tuple(
                    GpuSample(ts=clock.now, uuid=u, index=i, processes=((4243, 30_000_000_000),)) for i, u in enumerate(gpus))))
                out += await src.poll()
                if step == 0:
                    clock.now = end
                    real.metrics = (REAL / "vllm-0.32.0-cpu__busy.txt").read_text()
                    kv.metrics = (OFFLOAD / "t1.txt").read_text() + _lmcache("t1")
        finally:
            await src.close()
            for srv in (real, kv):
                await srv.stop()
        return out

    return asyncio.run(go())


@pytest.fixture(scope="module")
def offload_url(tmp_path_factory):
    """The recorded copy phase for 10 min, and the two servers' polls at its end."""
    url = f"sqlite:///{tmp_path_factory.mktemp('kv') / 'x.db'}"
    replay(url, *copy_phase(minutes=10))
    store = Store(url)
    try:
        end = store.newest_ts([g.id for g in store.gpus_of("h")])
        VllmRepository(store.engine).write("h", _poll(end))
    finally:
        store.close()
    return url


@pytest.fixture(scope="module")
def report_and_text(offload_url):
    store = Store(offload_url)
    try:
        report = build_report(store, "h", window_seconds=600, now=store.newest_ts([g.id for g in store.gpus_of("h")]))
    finally:
        store.close()
    return report, render_diagnose(report, width=240)


def _server(report, version):
    (s,) = [s for s in report["vllm"] if s["version"] == version]
    return s


def test_the_saturated_links_finding_says_what_share_kv_offload_moved(report_and_text):
    """The copy phase fills the link (about 59 GB/s RX); the server's KV offload moved 1.14 GB/s
    into the GPU: the finding says so, and that it is 2 % of the RX — the offload is not what
    saturates this link."""
    report, text = report_and_text
    (sat,) = [f for f in report["findings"] if f["alert"] == "GpuPcieSaturated"]
    kv = sat["kv_offload"]
    rx_mean = report["gpus"][0]["pcie"]["rx"]["mean_bytes_per_second"]
    assert kv["servers"] == [_server(report, "0.33.0")["server"]] and kv["split"] == 1
    assert kv["load_bytes_per_second"] == pytest.approx(LOAD_BPS)
    assert kv["store_bytes_per_second"] == pytest.approx(STORE_BPS)
    assert kv["rx_share"] == pytest.approx(LOAD_BPS / rx_mean)
    assert 0.01 < kv["rx_share"] < 0.03
    sentence = f"KV offload of vLLM {kv['servers'][0]} moved 1.14 GB/s ({kv['rx_share'] * 100:.0f} % of its RX) into the GPU"
    assert sentence in sat["message"] and sentence in text


def test_a_pcie_finding_without_kv_offload_says_nothing_of_it(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    replay(url, *copy_phase(minutes=10))
    store = Store(url)
    try:
        report = build_report(store, "h", window_seconds=600)
    finally:
        store.close()
    (sat,) = [f for f in report["findings"] if f["alert"] == "GpuPcieSaturated"]
    assert "kv_offload" not in sat and "KV offload" not in sat["message"]


def test_each_server_has_its_slo_attainment_line(report_and_text):
    """The recorded idle → busy scrapes' TTFT and inter-token histograms against the default
    targets (0.5 s, 50 ms), both on a bucket bound: 575 of 577 requests, 45 593 of 45 608 token
    intervals, above the objectives (99 %, 95 %); the KV-offload server serves no latency
    histogram: no figure, and not the idle window's "no requests"."""
    report, text = report_and_text
    real, kv = _server(report, "0.32.0"), _server(report, "0.33.0")
    ttft, itl = real["signals"]["ttft"], real["signals"]["itl"]
    assert (ttft["observations"], itl["observations"]) == (577, 45608)
    assert ttft["attainment_ratio"] == pytest.approx(575 / 577, abs=1e-4) and not ttft["below_objective"]
    assert itl["attainment_ratio"] == pytest.approx(45593 / 45608, abs=1e-4) and not itl["interpolated"]
    assert (f"{real['server']}: SLO attainment over 5 min: TTFT ≤ 500 ms: 99.7 % of 577 requests (objective 99 %); "
            "inter-token ≤ 50 ms: 100.0 % of 45,608 token intervals (objective 95 %)") in text
    assert kv["signals"]["ttft"]["attainment_ratio"] is None and kv["signals"]["ttft"]["observations"] is None
    assert f"{kv['server']}: SLO attainment over 5 min: TTFT ≤ 500 ms: N/A (not reported; objective 99 %)" in text


def test_prefix_cache_preemptions_and_speculative_decoding_lines(report_and_text):
    """The busy scrape's prefix-cache hits and preemptions over the interval; the 0.33 server's
    speculative decoding (600 of 1000 draft tokens accepted) and KV offload."""
    report, text = report_and_text
    real, kv = _server(report, "0.32.0"), _server(report, "0.33.0")
    sig = real["signals"]
    assert sig["preemptions"] is not None and sig["spec_decode_acceptance_ratio"] is None
    # the busy scrape: 27 099 prefix-cache queries, no hit; no preemption; no draft model, no offload
    assert f"{real['server']}: over its last 2 polls: prefix-cache hits 0.0 % of queried tokens; 0 preemptions" in text
    line = next(t for t in text.splitlines() if t.startswith(f"{real['server']}: over its last"))
    assert "spec-decode" not in line and "KV offload" not in line
    assert kv["signals"]["spec_decode_acceptance_ratio"] == pytest.approx(0.6)
    assert (f"{kv['server']}: over its last 2 polls: prefix-cache hits N/A (no queries); preemptions N/A (not reported); "
            "spec-decode acceptance 60.0 %; KV offload 1.14 GB/s loaded into the GPUs, 0.24 GB/s stored from them (mean)") in text
    # LMCache (tests/data/vllm-0.32-lmcache): 0.75 of the tokens retrieves asked for, 0.8 found by lookups, 2 GiB per rank
    assert kv["signals"]["lmcache_retrieve_hit_ratio"] == pytest.approx(0.75)
    assert kv["signals"]["lmcache_local_cache_usage_bytes"] == 4 * 2**30
    assert real["signals"]["lmcache_retrieve_hit_ratio"] is None and "LMCache" not in line
    flat = " ".join(text.split())  # the line wraps at the report's width
    assert "spec-decode acceptance 60.0 %; KV offload 1.14 GB/s loaded into the GPUs, 0.24 GB/s stored from them (mean); " \
           "LMCache hits 75.0 %, lookups 80.0 % (mean), local cache 4.00 GiB " in flat


def test_capacity_says_what_share_of_a_cards_traffic_kv_offload_moved(offload_url):
    """``vgpumon capacity`` over the same window: the card's mean RX (the mean of its 1-minute
    means; rolled up by ``vgpumon db prune``) against the server's 1.14 GB/s of KV loads, and the
    share of the Gen5 x16 link."""
    prune = subprocess.run([sys.executable, "-m", "vgpumon", "db", "prune", "--db", offload_url, *KEEP_ALL],
                           capture_output=True, text=True, timeout=120)
    assert prune.returncode == 0, prune.stderr
    store = Store(offload_url)
    try:
        host = review_host(store, "h", window_seconds=3600)
        out = Console(file=io.StringIO(), width=240, color_system=None)
        render.print_review({"window_seconds": 3600.0, "add_cards": 2, "saturation_ratio": 0.8, "hosts": [host], "unknown_hosts": []}, out)
        text = out.file.getvalue()
    finally:
        store.close()
    (card,) = host["gpus"]
    kv = card["kv_offload"]
    assert kv["load_bytes_per_second"] == pytest.approx(LOAD_BPS) and kv["store_bytes_per_second"] == pytest.approx(STORE_BPS)
    assert kv["rx_mean_bytes_per_second"] == pytest.approx(59e9, rel=0.05)  # the copy: 94-96 % of 63 GB/s (FACTS §1)
    assert kv["rx_share_of_traffic"] == pytest.approx(LOAD_BPS / kv["rx_mean_bytes_per_second"])
    assert kv["load_share_of_max_link"] == pytest.approx(LOAD_BPS / 63.0e9, rel=1e-3)
    assert (f"GPU 0: KV offload of vLLM {kv['servers'][0]} moved 1.14 GB/s ({kv['rx_share_of_traffic'] * 100:.1f} % of its RX "
            f"traffic; 1.8 % of the max link) in and 0.24 GB/s ({kv['tx_share_of_traffic'] * 100:.1f} % of its TX traffic) out") in text
    assert mismatches(host, HostReview) == []


def test_the_offload_means_are_one_aggregate_query_on_sqlite_and_postgres(db_url):
    """``vgpumon.store.kv_offload.by_gpu`` on both stores: the polls' mean rates charged to the
    GPU the server's engine holds; a window without polls charges nothing."""
    from vgpumon.store import kv_offload, open_store

    end = 1_800_000_000.0
    store = open_store(db_url)
    try:
        VllmRepository(store.engine).write("h", _poll(end))
        got = kv_offload.by_gpu(store.engine, "h", end - 60, end)
        before = kv_offload.by_gpu(store.engine, "h", end - 3600, end - 60)
    finally:
        store.close()
    (kv,) = got.values()
    assert list(got) == [GPU] and kv["split"] == 1 and kv["polls"] == 1
    assert kv["load_bytes_per_second"] == pytest.approx(LOAD_BPS) and kv["store_bytes_per_second"] == pytest.approx(STORE_BPS)
    assert before == {}


def test_an_idle_window_says_no_requests_not_100_percent():
    """Two polls of the recorded idle scrape: the histograms are served, nothing was observed in
    the window: no figure, and the line says why."""
    from vgpumon.config.thresholds import Thresholds
    from vgpumon.diagnose.render_signals import slo_line
    from vgpumon.diagnose.signals import server_signals

    polls = [{"ts": 0.0, "ttft_slo_observations": None}, {"ts": 2.0, "ttft_slo_observations": 0.0, "itl_slo_observations": 0.0}]
    sig = server_signals(polls, Thresholds())
    assert sig["ttft"]["attainment_ratio"] is None and sig["ttft"]["observations"] == 0
    line = slo_line({"server": "s:1", "signals": sig})  # type: ignore[typeddict-item]
    assert line == ("s:1: SLO attainment over 5 min: TTFT ≤ 500 ms: N/A (no requests in the window; objective 99 %); "
                    "inter-token ≤ 50 ms: N/A (no token intervals in the window; objective 95 %)")


def test_a_saturated_shared_switch_says_what_share_kv_offload_moved_through_it(tmp_path):
    """Sixteen cards, eight behind each switch, each carrying 12 % of the recorded copy: the
    switches' uplinks saturate. The KV-offload server holds GPUs 0 and 1 (behind switch
    0000:10:00.0 and root port 0000:00:01.0): its 1.14 GB/s of loads, half charged to each, is
    the share of those ports' traffic the finding names; the other switch has none."""
    import json

    from rules_support import PCIE_GPM

    from vgpumon.model import GpuIdentity
    from vgpumon.testing import scenarios, sysfs

    header, ticks = scenarios.scale_gpm(*copy_phase(minutes=7, devices=16), PCIE_GPM, 0.12)
    gpus = [GpuIdentity(index=i, uuid=f"u{i}", pci_bus_id=f"00000000:{scenarios.bus_number(i, 16):02X}:00.0") for i in range(16)]
    root = sysfs.materialize(sysfs.switch_tree(json.loads((DATA / "h200-sysfs.json").read_text()), gpus, per_switch=8), tmp_path / "sys")
    url = f"sqlite:///{tmp_path / 'x.db'}"
    replay(url, header, ticks, sysfs_root=root)
    store = Store(url)
    try:
        stored = store.gpus_of("h")
        end = store.newest_ts([g.id for g in stored])
        uuids = {g.identity.index: g.identity.uuid for g in stored}
        VllmRepository(store.engine).write("h", _poll(end, gpus=(uuids[0], uuids[1])))
        report = build_report(store, "h", window_seconds=420, now=end)
    finally:
        store.close()
    ports = {f["subject"]["port"]: f for f in report["findings"] if f["alert"] == "PcieUplinkSaturated"}
    assert {"0000:10:00.0", "0000:20:00.0"} <= set(ports)
    kv = ports["0000:10:00.0"]["kv_offload"]
    assert kv["split"] == 2 and kv["load_bytes_per_second"] == pytest.approx(LOAD_BPS)
    rx = sum(g["pcie"]["rx"]["mean_bytes_per_second"] for g in report["gpus"] if g["index"] < 8)
    assert kv["rx_share"] == pytest.approx(LOAD_BPS / rx)
    assert (f"moved 1.14 GB/s ({kv['rx_share'] * 100:.0f} % of their RX) into the GPUs behind 0000:10:00.0"
            in ports["0000:10:00.0"]["message"])
    assert "split evenly over the server's 2 GPUs" in ports["0000:10:00.0"]["message"]
    assert "kv_offload" not in ports["0000:20:00.0"]

    # vgpumon capacity: each card an half, the switch above them the whole
    prune = subprocess.run([sys.executable, "-m", "vgpumon", "db", "prune", "--db", url, *KEEP_ALL], capture_output=True, text=True, timeout=120)
    assert prune.returncode == 0, prune.stderr
    store = Store(url)
    try:
        host = review_host(store, "h", window_seconds=3600)
    finally:
        store.close()
    cards = {g["index"]: g for g in host["gpus"]}
    assert cards[0]["kv_offload"]["load_bytes_per_second"] == pytest.approx(LOAD_BPS / 2) and cards[0]["kv_offload"]["split"] == 2
    assert "kv_offload" not in cards[2]
    shared = {p["port"]: p for p in host["shared"]}
    port = shared["0000:10:00.0"]["kv_offload"]
    assert port["load_bytes_per_second"] == pytest.approx(LOAD_BPS)
    # eight cards carrying the same load: eight times a card's mean
    assert port["rx_mean_bytes_per_second"] == pytest.approx(8 * cards[0]["kv_offload"]["rx_mean_bytes_per_second"], rel=0.02)
    assert port["rx_share_of_traffic"] == pytest.approx(LOAD_BPS / port["rx_mean_bytes_per_second"])
    assert "kv_offload" not in shared["0000:20:00.0"]
    assert mismatches(host, HostReview) == []
