"""Impossible values from a vLLM server are refused at the door and cost only themselves.

Real HTTP servers serve the recorded real vLLM 0.32.0 busy capture, one of them with one value
changed to what was seen in the wild: +Inf KV usage (it once made the store refuse every vLLM row
for the rest of the run), 1e16 running requests (it stopped the vLLM source and the agent exited
70), a KV usage of 1.7 and −3 running requests (both were stored as is). Each poll of the odd
server is stored with that field NULL and every other value present, the refusal is counted and
stored, and the healthy server beside it loses nothing.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from conftest import count, replay_into
from vllm_support import ServerThread, shared_dir

from vgpumon.sources.vllm import VllmSource
from vgpumon.sources.vllm.discovery import NoProcesses
from vgpumon.store import open_store
from vgpumon.store.vllm_repository import VllmRepository
from vgpumon.testing.vllm import FakeVllmServer


def _with_value(body: str, metric: str, value: str) -> str:
    return "\n".join(re.sub(r" \S+$", f" {value}", ln) if ln.startswith(metric + "{") else ln for ln in body.splitlines()) + "\n"


def _samples(url: str) -> dict[str, list[dict[str, Any]]]:
    store = open_store(url)
    try:
        repo = VllmRepository(store.engine)
        out: dict[str, list[dict[str, Any]]] = {}
        for i in repo.instances("h"):
            out.setdefault(i["url"], []).extend(repo.samples(i["id"]))
        return out
    finally:
        store.close()


CASES = [
    ("vllm:kv_cache_usage_perc", "+Inf", "vllm:kv_cache_usage_perc", "kv_cache_usage_ratio", "infinite"),
    ("vllm:num_requests_running", "1e16", "running", "running", "outside 0..1e+06"),
    ("vllm:kv_cache_usage_perc", "1.7", "kv_cache_usage_ratio", "kv_cache_usage_ratio", "outside 0..1 ratio"),
    ("vllm:num_requests_running", "-3", "running", "running", "outside 0..1e+06"),
]


@pytest.mark.parametrize("metric, value, field_rejected, column, why", CASES, ids=[f"{c[0]} {c[1]}" for c in CASES])
def test_an_impossible_vllm_value_costs_only_its_field(db_url, metric, value, field_rejected, column, why):
    busy = (shared_dir("fixtures", "vllm-real") / "vllm-0.32.0-cpu__busy.txt").read_text()
    servers = ServerThread()
    try:
        healthy = servers.start(FakeVllmServer(metrics=busy, version="0.32.0"))
        odd = servers.start(FakeVllmServer(metrics=_with_value(busy, metric, value), version="0.32.0"))
        vllm = VllmSource(static_urls=[healthy.url, odd.url], processes=NoProcesses(), interval=0.05, request_timeout=1.0)
        agent = replay_into(db_url, hostname="h", agent_kw={"interval": 0.02, "paced": True, "flush_interval": 0.2, "vllm": vllm})
    finally:
        servers.close()
    stats = agent.stats
    assert count(db_url, "SELECT count(*) FROM gpu_samples") == stats.ticks
    assert stats.vllm_restarts == 0 and stats.dead_letters == 0 and stats.rows_pending == 0
    polls = stats.vllm_samples // 2
    assert polls >= 5
    rows = _samples(db_url)
    assert len(rows[healthy.url]) == len(rows[odd.url]) == polls
    # the healthy server reads the capture's own figures (97 requests running in the busy capture)
    assert all(r["running"] == 97 and r["kv_cache_usage_ratio"] is not None for r in rows[healthy.url][1:])
    # the odd one: that field NULL, the rest as the healthy one's
    for odd_row, good_row in zip(rows[odd.url][1:], rows[healthy.url][1:]):
        assert odd_row[column] is None
        for other in ("waiting", "kv_block_size", "kv_num_gpu_blocks", "running", "kv_cache_usage_ratio"):
            if other != column:
                assert odd_row[other] == good_row[other], other
    assert vllm.rejected[field_rejected] >= polls - 1
    stored = count(db_url, f"SELECT count(*) FROM rejected_values WHERE subject = 'vllm:{odd.url}' AND field = '{field_rejected}'")
    assert stored >= polls - 1
    reasons = _reasons(db_url)
    assert all(why in r for r in reasons), reasons
    assert count(db_url, f"SELECT count(*) FROM rejected_values WHERE subject = 'vllm:{healthy.url}'") == 0


def _reasons(url: str) -> list[str]:
    from sqlalchemy import text

    store = open_store(url)
    try:
        with store.engine.connect() as conn:
            return list(conn.scalars(text("SELECT DISTINCT reason FROM rejected_values")))
    finally:
        store.close()


def test_numbers_too_large_or_infinite_cost_only_themselves():
    """An integer token of 400 digits, or an info label reading ``inf``, raised OverflowError in
    the parser, so every poll of that server failed with a traceback. Each such value is now
    left out (counted as rejected where it is a sample); the rest of the body is read."""
    from vgpumon.sources.vllm.metrics import parse_metrics
    from vgpumon.sources.vllm.scrape import _stats_fields

    body = (
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{model_name="m"}} {"1" * 400}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{model_name="m"} 3\n'
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="inf",num_gpu_blocks="1e400",engine="0"} 1\n'
    )
    reading = parse_metrics(body)
    assert reading.waiting == 3 and reading.running is None
    assert "vllm:num_requests_running" in reading.rejected
    assert reading.cache is not None and (reading.cache.block_size, reading.cache.num_gpu_blocks) == (None, None)
    fields = _stats_fields({"num_requests_running": 10 ** 400, "num_requests_waiting": 2, "block_size": float("inf")})
    assert fields == {"waiting": 2.0}
