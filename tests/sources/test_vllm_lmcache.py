"""LMCache's ``lmcache:*`` families in a vLLM server's ``/metrics``: read, summed across ``pid``
label sets, turned into interval figures, and checked at the door, on the real vLLM 0.32 busy
scrape with LMCache's families added (tests/data/vllm-0.32-lmcache/PROVENANCE.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import count, replay_into
from test_vllm_door import _samples
from vllm_support import ServerThread

from vgpumon.sources.vllm import VllmSource
from vgpumon.sources.vllm.derive import IntervalDeriver
from vgpumon.sources.vllm.discovery import NoProcesses
from vgpumon.sources.vllm.metrics import parse_metrics
from vgpumon.testing.vllm import FakeVllmServer

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm-0.32-lmcache"
GIB = 2**30


def _interval(prefix: str = "", t1: str | None = None) -> dict:
    d = IntervalDeriver()
    d.step(100.0, parse_metrics((DATA / f"{prefix}t0.txt").read_bytes()))
    return d.step(110.0, parse_metrics(t1 if t1 is not None else (DATA / f"{prefix}t1.txt").read_bytes()))


@pytest.mark.parametrize("prefix", ["", "pid-"])
def test_lmcache_figures_over_an_interval(prefix):
    t1 = parse_metrics((DATA / f"{prefix}t1.txt").read_bytes())
    assert not t1.rejected and t1.lines_dropped == 0
    # the vLLM side of the scrape reads as the recorded busy scrape does
    assert t1.running == 97 and t1.lmcache is not None
    out = _interval(prefix)
    # rates are the largest tensor-parallel rank's: both ranks count each request once
    assert out["lmcache_retrieve_requests_per_second"] == pytest.approx(4.0)
    assert out["lmcache_store_requests_per_second"] == pytest.approx(3.0)
    assert out["lmcache_hit_tokens_per_second"] == pytest.approx(2457.6)
    assert out["lmcache_stored_tokens_per_second"] == pytest.approx(3072.0)
    assert out["lmcache_retrieve_hit_ratio"] == pytest.approx(0.75)
    assert out["lmcache_lookup_hit_ratio"] == pytest.approx(0.8)
    assert out["lmcache_retrieve_mean_seconds"] == pytest.approx(0.06)
    assert out["lmcache_store_mean_seconds"] == pytest.approx(0.02)
    # bytes are every rank's and every process's: 2 GiB per rank at t1
    assert out["lmcache_local_cache_usage_bytes"] == 4 * GIB


def test_pid_label_sets_are_summed_not_reduced_with_max():
    t1 = parse_metrics((DATA / "pid-t1.txt").read_bytes())
    assert t1.lmcache is not None
    # rank 0's 2 GiB lie in two processes' series (1 GiB each); vLLM's own pid rule (max) would read 1 GiB
    assert t1.lmcache.values["local_cache_usage"]["0"] == 2 * GIB
    assert t1.lmcache.total("local_cache_usage") == 4 * GIB


def test_a_first_scrape_or_one_without_lmcache_has_no_interval_figures():
    d = IntervalDeriver()
    first = d.step(100.0, parse_metrics((DATA / "t0.txt").read_bytes()))
    assert first["lmcache_local_cache_usage_bytes"] == 3 * GIB  # a gauge needs no interval
    assert first["lmcache_retrieve_hit_ratio"] is None and first["lmcache_retrieve_requests_per_second"] is None
    plain = (DATA.parent / "vllm-real" / "vllm-0.32.0-cpu__busy.txt").read_bytes()
    assert parse_metrics(plain).lmcache is None
    out = d.step(110.0, parse_metrics(plain))
    assert all(v is None for k, v in out.items() if k.startswith("lmcache_"))


def test_an_interval_without_retrieves_has_no_hit_ratio_not_zero():
    out = _interval(t1=(DATA / "t0.txt").read_text())
    assert out["lmcache_retrieve_requests_per_second"] == 0.0
    assert out["lmcache_retrieve_hit_ratio"] is None and out["lmcache_retrieve_mean_seconds"] is None


def _with_value(body: str, metric: str, value: str) -> str:
    return "\n".join(re.sub(r" \S+$", f" {value}", ln) if ln.startswith(metric + "{") else ln for ln in body.splitlines()) + "\n"


def test_a_garbage_lmcache_value_costs_only_itself():
    body = _with_value((DATA / "t1.txt").read_text(), "lmcache:num_hit_tokens_total", "NaN")
    r = parse_metrics(body)
    assert set(r.rejected) == {"lmcache:num_hit_tokens_total"}
    out = _interval(t1=body)
    assert out["lmcache_retrieve_hit_ratio"] is None and out["lmcache_hit_tokens_per_second"] is None
    assert out["lmcache_retrieve_requests_per_second"] == pytest.approx(4.0)
    assert out["lmcache_lookup_hit_ratio"] == pytest.approx(0.8)
    assert out["lmcache_local_cache_usage_bytes"] == 4 * GIB
    # the vLLM figures of the same scrape are untouched
    assert r.running == 97 and r.counter_total("generation_tokens") == 46185.0
    # a line the parser refuses is dropped and counted; the rest of LMCache's families are read
    broken = (DATA / "t1.txt").read_text().replace(
        'lmcache:local_cache_usage{model_name="tiny",worker_id="1",role="worker",served_model_name="tiny"} 2147483648.0',
        'lmcache:local_cache_usage{model_name="tiny",worker_id="1",role="worker",served_model_name="tiny"} 2.1GiB')
    r = parse_metrics(broken)
    assert r.lines_dropped == 1 and r.lmcache is not None
    assert r.lmcache.total("local_cache_usage") == 2 * GIB
    assert r.lmcache.total("hit_tokens") == 2 * 90112.0


def test_an_impossible_lmcache_figure_is_refused_at_the_door_and_stored_as_null_alone(db_url):
    body = (DATA / "t1.txt").read_text()
    odd_body = body.replace(
        'lmcache:local_cache_usage{model_name="tiny",worker_id="1",role="worker",served_model_name="tiny"} 2147483648.0',
        'lmcache:local_cache_usage{model_name="tiny",worker_id="1",role="worker",served_model_name="tiny"} -5e9')
    servers = ServerThread()
    try:
        healthy = servers.start(FakeVllmServer(metrics=body, version="0.32.0"))
        odd = servers.start(FakeVllmServer(metrics=odd_body, version="0.32.0"))
        vllm = VllmSource(static_urls=[healthy.url, odd.url], processes=NoProcesses(), interval=0.05, request_timeout=1.0)
        agent = replay_into(db_url, hostname="h", agent_kw={"interval": 0.02, "paced": True, "flush_interval": 0.2, "vllm": vllm})
    finally:
        servers.close()
    assert agent.stats.vllm_restarts == 0 and agent.stats.dead_letters == 0
    rows = _samples(db_url)
    good, bad = rows[healthy.url][1:], rows[odd.url][1:]
    assert len(good) >= 3 and len(bad) >= 3
    assert all(r["lmcache_local_cache_usage_bytes"] == 4 * GIB for r in good)
    # an unchanged scrape: no retrieve in the interval (0/s), so no hit ratio
    assert all(r["lmcache_retrieve_requests_per_second"] == 0 and r["lmcache_retrieve_hit_ratio"] is None for r in good)
    for r in bad:
        assert r["lmcache_local_cache_usage_bytes"] is None
        assert r["lmcache_retrieve_requests_per_second"] == 0 and r["running"] == 97
    assert vllm.rejected["lmcache_local_cache_usage_bytes"] >= len(bad)
    assert count(db_url, "SELECT count(*) FROM rejected_values WHERE subject = 'vllm:" + odd.url
                 + "' AND field = 'lmcache_local_cache_usage_bytes'") >= len(bad)
    assert count(db_url, f"SELECT count(*) FROM rejected_values WHERE subject = 'vllm:{healthy.url}'") == 0
