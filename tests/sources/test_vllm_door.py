"""Impossible values from a vLLM server are refused at the door and cost only themselves.

Real HTTP servers serve the recorded real vLLM 0.32.0 busy capture, one of them with one value
changed to what was seen in the wild: +Inf KV usage (it once made the store refuse every vLLM row
for the rest of the run), 1e16 running requests (it stopped the vLLM source and the agent exited
70), a KV usage of 1.7 and −3 running requests (both were stored as is). Each poll of the odd
server is stored with that field NULL and every other value present, the refusal is counted and
stored, and the healthy server beside it loses nothing.
"""

from __future__ import annotations

import json
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
    from vgpumon.sources.vllm.scrape import stats_fields

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
    fields = stats_fields({"num_requests_running": 10 ** 400, "num_requests_waiting": 2, "block_size": float("inf")})
    assert fields == {"waiting": 2.0}


def _with_series(body: str, model: str, engine: str) -> str:
    """The capture's body with a second engine's gauges under the given labels."""
    extra = [ln.replace('engine="0",model_name="tiny"', f'engine="{engine}",model_name="{model}"') for ln in body.splitlines()
             if ln.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{", "vllm:kv_cache_usage_perc{"))]
    return body + "\n".join(extra) + "\n"


def test_outside_text_too_long_or_with_a_nul_costs_only_itself_the_same_on_both_stores(db_url):
    """A server whose ``/version`` is 300 characters, whose ``/v1/models`` names one model with
    a NUL beside the real one, and whose ``/metrics`` adds one engine with a 40-character
    ``engine`` label and one with a 300-character ``model_name``. Postgres used to refuse each
    of its samples (all of them went to the dead-letter file, the SQL logged over several
    lines) while SQLite kept them: now the door refuses those texts, on both stores alike, and
    every sample is stored, with the real engine's row and the real model name."""
    busy = (shared_dir("fixtures", "vllm-real") / "vllm-0.32.0-cpu__busy.txt").read_text()
    odd_body = _with_series(_with_series(busy, "tiny", "e" * 40), "m" * 300, "1")
    servers = ServerThread()
    try:
        healthy = servers.start(FakeVllmServer(metrics=busy, version="0.32.0", models=["tiny"]))
        odd = servers.start(FakeVllmServer(metrics=odd_body, models=["tiny", "evil\x00model"],
                                           raw={"/version": json.dumps({"version": "0." + "9" * 298}).encode()}))
        vllm = VllmSource(static_urls=[healthy.url, odd.url], processes=NoProcesses(), interval=0.05, request_timeout=1.0)
        agent = replay_into(db_url, hostname="h", agent_kw={"interval": 0.02, "paced": True, "flush_interval": 0.2, "vllm": vllm})
    finally:
        servers.close()
    stats = agent.stats
    assert stats.dead_letters == 0 and stats.rows_pending == 0 and stats.vllm_restarts == 0
    polls = stats.vllm_samples // 2
    assert polls >= 5
    rows = _samples(db_url)
    assert len(rows[odd.url]) == len(rows[healthy.url]) == polls
    store = open_store(db_url)
    try:
        repo = VllmRepository(store.engine)
        starts = {i["url"]: i for i in repo.instances("h")}
        engines = {url: {(e["model_name"], e["engine"]) for e in repo.engine_samples(starts[url]["id"])} for url in starts}
    finally:
        store.close()
    assert starts[odd.url]["version"] is None and starts[healthy.url]["version"] == "0.32.0"
    assert starts[odd.url]["model"] == "tiny"
    assert engines[odd.url] == engines[healthy.url] == {("tiny", "0")}
    assert vllm.rejected["version"] >= 1 and vllm.rejected["model"] >= 1
    assert vllm.rejected["engine"] >= polls - 1 and vllm.rejected["model_name"] >= polls - 1
    reasons = _reasons(db_url)
    assert any("longer than 32 characters (40)" in r for r in reasons), reasons
    assert any("longer than 255 characters (300)" in r for r in reasons), reasons
    assert any("a NUL character" in r for r in reasons), reasons


SHAPES = [
    ("/v1/models", b'{"object": "list", "data": null}'),
    ("/v1/models", b'{"data": {"id": "tiny"}}'),
    ("/v1/models", b'{"data": [null, 7, {"id": null}, {"id": ["tiny"]}]}'),
    ("/v1/models", b"null"),
    ("/version", b'{"version": {"major": 0}}'),
    ("/version", b"[\"0.32.0\"]"),
    ("/stats", b"null"),
    ("/stats", b'{"num_running": {"n": 1}, "gpu_cache_usage": [0.5], "block_size": null}'),
    ("/load", b'{"server_load": null}'),
    ("/load", b"[]"),
    ("/is_sleeping", b'{"is_sleeping": "no"}'),
    ("/is_sleeping", b"null"),
]


@pytest.mark.parametrize("path, body", SHAPES, ids=[f"{p} {b[:30].decode()}" for p, b in SHAPES])
def test_json_of_the_wrong_shape_costs_only_itself(path, body):
    """``null`` where an object is expected, an object where a list is: that answer is no
    answer; every other reading of the poll is kept. ``{"data": null}`` from ``/v1/models``
    used to raise TypeError in every poll of that server, forever."""
    import asyncio

    from vllm_support import source

    from vgpumon.testing.vllm import FakeClock

    busy = (shared_dir("fixtures", "vllm-real") / "vllm-0.32.0-cpu__busy.txt").read_text()
    servers = ServerThread()
    try:
        fake = servers.start(FakeVllmServer(metrics=busy, version="0.32.0", models=["tiny"], load=0.5,
                                            is_sleeping=False, stats={"num_running": 3}, raw={path: body}))
        src = source(FakeClock(), static_urls=[fake.url], processes=NoProcesses())

        async def polls():
            out = []
            try:
                for _ in range(3):
                    out.extend(await src.poll())
            finally:
                await src.close()
            return out

        samples = asyncio.run(polls())
    finally:
        servers.close()
    assert len(samples) == 3 and path in fake.requests
    last = samples[-1]
    assert "poll failed" not in last.reason and last.state.value == "busy", last.reason
    assert last.running == 97 and last.telemetry == "full" and last.model_names == ("tiny",)
    assert last.version == (None if path == "/version" else "0.32.0")


def test_a_server_with_thousands_of_series_costs_only_its_own_rows(db_url):
    """Any local user's process that really listens where its argv says is scraped as vLLM. One
    serving 2 000 ``(model_name, engine)`` series made 2 000 engine rows every poll (and as many
    ``/metrics`` series); now its first ``ENGINE_SERIES_LIMIT`` are kept, the rest are counted
    as rejected, and the healthy server beside it is polled as often as before."""
    from vgpumon.catalogue.vllm import ENGINE_SERIES_LIMIT

    busy = (shared_dir("fixtures", "vllm-real") / "vllm-0.32.0-cpu__busy.txt").read_text()
    gauges = [ln for ln in busy.splitlines()
              if ln.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{", "vllm:kv_cache_usage_perc{"))]
    assert gauges and all('engine="0",model_name="tiny"' in ln for ln in gauges)
    extra = [ln.replace('engine="0"', f'engine="{i}"') for i in range(1, 2000) for ln in gauges]
    servers = ServerThread()
    try:
        healthy = servers.start(FakeVllmServer(metrics=busy, version="0.32.0", models=["tiny"]))
        many = servers.start(FakeVllmServer(metrics=busy + "\n".join(extra) + "\n", version="0.32.0", models=["tiny"]))
        vllm = VllmSource(static_urls=[healthy.url, many.url], processes=NoProcesses(), interval=0.05, request_timeout=5.0)
        agent = replay_into(db_url, hostname="h", agent_kw={"interval": 0.02, "paced": True, "flush_interval": 0.2, "vllm": vllm})
    finally:
        servers.close()
    assert agent.stats.dead_letters == 0
    rows = _samples(db_url)
    # polled together, poll after poll (how many polls fit the replay's 1.5 s is the machine's speed)
    assert len(rows[many.url]) == len(rows[healthy.url]) >= 1
    store = open_store(db_url)
    try:
        repo = VllmRepository(store.engine)
        starts = {i["url"]: i for i in repo.instances("h")}
        per_sample: dict[str, dict[float, int]] = {}
        for url, inst in starts.items():
            for e in repo.engine_samples(inst["id"]):
                per_sample.setdefault(url, {}).setdefault(e["ts"], 0)
                per_sample[url][e["ts"]] += 1
    finally:
        store.close()
    assert set(per_sample[many.url].values()) == {ENGINE_SERIES_LIMIT}
    assert set(per_sample[healthy.url].values()) == {1}
    assert vllm.rejected["engine"] >= len(rows[many.url]) - 1
    assert any("2000 engine series; the first 256 kept" in r for r in _reasons(db_url))
