"""KV offload traffic by direction and speculative-decoding acceptance, read from constructed
vLLM 0.33 expositions (tests/data/vllm-0.33-kv-offload/PROVENANCE.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vgpumon.sources.vllm.derive import IntervalDeriver as Deriver
from vgpumon.sources.vllm.metrics import parse_metrics

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm-0.33-kv-offload"


@pytest.mark.parametrize("prefix", ["", "deprecated-"])
def test_offload_rates_by_direction_and_acceptance(prefix):
    d = Deriver()
    t0 = parse_metrics((DATA / f"{prefix}t0.txt").read_bytes())
    t1 = parse_metrics((DATA / f"{prefix}t1.txt").read_bytes())
    assert not t1.rejected and t1.lines_dropped == 0
    d.step(100.0, t0)
    out = d.step(110.0, t1)
    assert out["kv_offload_load_bytes_per_second"] == pytest.approx(1.14e9)
    assert out["kv_offload_store_bytes_per_second"] == pytest.approx(2.4e8)
    assert out["spec_decode_acceptance_ratio"] == pytest.approx(0.6)


def test_a_bad_offload_value_costs_only_itself():
    body = (DATA / "t1.txt").read_text().replace("vllm:kv_offload_load_bytes_total{engine=\"0\",model_name=\"tiny\"} 1.24e10",
                                                 "vllm:kv_offload_load_bytes_total{engine=\"0\",model_name=\"tiny\"} NaN")
    r = parse_metrics(body)
    assert "vllm:kv_offload_load_bytes_total" in r.rejected
    assert r.counter_total("kv_offload_store_bytes") == 6.4e9
    assert r.counter_total("spec_decode_accepted_tokens") == 3600.0


def test_the_deprecated_offload_family_is_read_and_named_once_though_its_help_does_not_say_so(caplog, monkeypatch):
    """``kv_offload_total_bytes`` (deprecated by 0.33's flat counters; its HELP reads "Number of
    bytes offloaded by KV connector") is read as usual where it is the only one, named deprecated
    in each reading, and logged once per process; LMCache's family beside it is passed over."""
    import logging

    from vgpumon.sources.vllm import metrics

    monkeypatch.setattr(metrics, "_DEPRECATED_SAID", set())  # as in a new process
    with caplog.at_level(logging.INFO, logger="vgpumon.sources.vllm.metrics"):
        old = [parse_metrics((DATA / f"deprecated-t{i}.txt").read_bytes()) for i in (0, 1)]
        new = parse_metrics((DATA / "t1.txt").read_bytes())
    assert all(r.deprecated == ("vllm:kv_offload_total_bytes",) for r in (*old, new))
    assert old[1].counter_total("kv_offload_load_bytes") == 1.24e10  # read as usual
    said = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert len(said) == 1 and "vllm:kv_offload_total_bytes" in said[0]
    assert not new.rejected and "lmcache:num_hit_tokens_total" not in new.rejected
