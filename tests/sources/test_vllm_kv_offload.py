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
