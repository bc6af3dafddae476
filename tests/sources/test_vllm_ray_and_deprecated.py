"""Expositions vLLM's own ``/metrics`` is not: Ray Serve's ``ray_vllm_*`` re-export with its
replica and worker labels, and families whose HELP says they are deprecated.

The Ray exposition is derived from the real vLLM 0.32 scrape (``tests/data/vllm-real``) the way
Ray renames and labels it (vllm PR 24267's sample: ``ray_vllm_time_to_first_token_seconds_count
{Component="core_worker",NodeAddress=…,ReplicaId="3r4e76ag",SessionName=…,Version="2.52.0",
WorkerId=…,engine="0",model_name=…}``), two replicas with different loads."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from vgpumon.sources.vllm.metrics import parse_metrics

DATA = Path(__file__).resolve().parents[1] / "data"
BUSY = (DATA / "vllm-real" / "vllm-0.32.0-cpu__busy.txt").read_text()
RAY = 'Component="core_worker",NodeAddress="10.1.113.171",ReplicaId="{r}",SessionName="session_2025-12-01_11-05-34",Version="2.52.0",WorkerId="{w}",'


def ray_replica(body: str, replica: str, worker: str, scale: float) -> str:
    """One replica's share of a Ray exposition: vLLM's lines renamed, Ray's labels added, every
    sample's value times ``scale`` (a replica with another load)."""
    out = []
    for line in body.splitlines():
        if line.startswith("#"):
            out.append(line.replace("vllm:", "ray_vllm_"))
            continue
        m = re.match(r"vllm:([^{ ]+)(\{([^}]*)\})? (\S+)$", line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(3) or "", float(m.group(4))
        if name.endswith("_info"):
            scale_by = 1.0
        else:
            scale_by = scale
        out.append(f"ray_vllm_{name}{{{RAY.format(r=replica, w=worker)}{labels}}} {value * scale_by!r}")
    return "\n".join(out) + "\n"


def test_ray_serve_replicas_are_read_as_engines_of_one_server():
    own = parse_metrics(BUSY)
    body = ray_replica(BUSY, "3r4e76ag", "6f8b9bc4", 1.0) + ray_replica(BUSY, "9kq2mz1x", "71aa03de", 0.5)
    ray = parse_metrics(body.encode())
    assert ray.has_vllm and ray.lines_dropped == 0 and not ray.rejected
    assert ray.replicas == ("3r4e76ag", "9kq2mz1x")
    assert set(ray.engines) == {"3r4e76ag/0", "9kq2mz1x/0"}
    assert ray.model_names == own.model_names == ("tiny",)
    # totals add the replicas up (97 running + 48.5); the KV maximum is the fuller replica's
    assert own.running == 97.0
    assert ray.running == pytest.approx(97.0 * 1.5)
    assert ray.kv_cache_usage_ratio == pytest.approx(own.kv_cache_usage_ratio)
    assert ray.counter_total("generation_tokens") == pytest.approx(own.counter_total("generation_tokens") * 1.5)
    # the histograms are read per replica, as the engines' are
    ttft = ray.histogram_counts_by_model("ttft")
    assert ttft["tiny"] == pytest.approx(own.histogram_counts_by_model("ttft")["tiny"] * 1.5)


def test_two_workers_of_one_replica_are_one_view_not_twice_the_load():
    """Ray labels each process's copy with its WorkerId: reduced with max, like vLLM's pid."""
    body = ray_replica(BUSY, "3r4e76ag", "6f8b9bc4", 1.0) + ray_replica(BUSY, "3r4e76ag", "71aa03de", 1.0)
    ray = parse_metrics(body.encode())
    assert ray.engines == ("3r4e76ag/0",) and ray.running == 97.0


def test_a_family_whose_help_says_deprecated_is_read_and_named_once(caplog, monkeypatch):
    from vgpumon.sources.vllm import metrics

    monkeypatch.setattr(metrics, "_DEPRECATED_SAID", set())  # as in a new process
    body = (DATA / "vllm" / "production-stack-issue-617.txt").read_bytes()
    with caplog.at_level(logging.INFO, logger="vgpumon.sources.vllm.metrics"):
        first = parse_metrics(body)
        again = parse_metrics(body)
    assert "vllm:gpu_prefix_cache_hits" in first.deprecated and "vllm:gpu_prefix_cache_queries" in first.deprecated
    assert again.deprecated == first.deprecated
    said = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    # once per process and metric, not at every poll
    assert len(said) == len(first.deprecated)
    # read as usual: the deprecated prefix-cache counters still give their values
    assert first.counter_total("prefix_cache_hits") is not None
    assert not parse_metrics(BUSY).deprecated
