"""SLO attainment from vLLM's TTFT and inter-token histograms (``vgpumon.sources.vllm.slo``), on the
real vLLM 0.32.0 captures of ``tests/data/vllm-real`` (idle, then busy: 577 requests, 45 608 token
intervals) and on vllm issue 8115's broken timer (flagged unreliable)."""

from __future__ import annotations

import pytest
from conftest import ROOT

from vgpumon.sources.vllm.derive import IntervalDeriver
from vgpumon.sources.vllm.metrics import parse_metrics
from vgpumon.sources.vllm.slo import SloTargets, share_within

REAL = ROOT / "tests" / "data" / "vllm-real"


def _reading(name: str):
    return parse_metrics((REAL / f"vllm-0.32.0-cpu__{name}.txt").read_text())


def _idle_then_busy(targets: SloTargets) -> dict:
    d = IntervalDeriver()
    d.step(0.0, _reading("idle"), targets)
    return d.step(60.0, _reading("busy"), targets)


def test_targets_on_bucket_bounds_count_their_buckets_exactly():
    """TTFT ≤ 0.5 s: 575 of 577 requests (bucket le="0.5"); ITL ≤ 50 ms: 45 593 of 45 608
    intervals (le="0.05") — as counted by hand from the capture; not interpolated."""
    out = _idle_then_busy(SloTargets())
    assert out["ttft_slo_attainment_ratio"] == pytest.approx(575 / 577)
    assert out["ttft_slo_observations"] == 577 and out["ttft_slo_interpolated"] is False
    assert out["itl_slo_attainment_ratio"] == pytest.approx(45593 / 45608)
    assert out["itl_slo_observations"] == 45608 and out["itl_slo_interpolated"] is False


def test_a_target_between_bounds_is_interpolated_inside_its_bucket_and_says_so():
    """TTFT ≤ 0.15 s lies between le="0.1" (351) and le="0.25" (575): 351 + 224 × 0.05 / 0.15."""
    out = _idle_then_busy(SloTargets(ttft_seconds=0.15))
    assert out["ttft_slo_attainment_ratio"] == pytest.approx((351 + 224 * 0.05 / 0.15) / 577)
    assert out["ttft_slo_interpolated"] is True
    assert out["itl_slo_interpolated"] is False


def test_share_within_edges():
    buckets = ((0.1, 2.0), (0.5, 6.0), (float("inf"), 10.0))
    assert share_within(buckets, 0.5) == (6.0, 10.0, False)
    assert share_within(buckets, 0.05) == (1.0, 10.0, True)  # first bucket: from 0
    assert share_within(buckets, 2.0) == (6.0, 10.0, True)  # beyond the last finite bound: a lower bound
    assert share_within(((0.1, 0.0), (float("inf"), 0.0)), 0.5) is None  # no observation, no figure


def test_an_idle_window_has_no_figure_not_100_nor_0():
    """Two idle scrapes, then busy ones falling out of a 120 s window: no request, no figure."""
    targets = SloTargets(window_seconds=120.0)
    d = IntervalDeriver()
    d.step(0.0, _reading("idle"), targets)
    out = d.step(10.0, _reading("idle"), targets)
    assert out["ttft_slo_attainment_ratio"] is None and out["itl_slo_attainment_ratio"] is None
    assert out["ttft_slo_observations"] == 0
    assert d.step(20.0, _reading("busy"), targets)["ttft_slo_attainment_ratio"] == pytest.approx(575 / 577)
    out = d.step(150.0, _reading("busy"), targets)  # the busy interval left the window, nothing since
    assert out["ttft_slo_attainment_ratio"] is None and out["ttft_slo_interpolated"] is None


# vllm issue 8115 (broken timing): 8060 TTFTs all in the first bucket, a mean of 73 µs
_BOUNDS = ("0.1", "0.25", "0.5", "0.75", "1.0", "2.5", "5.0", "7.5", "10.0", "+Inf")


def _broken(count: float, total: float) -> str:
    lines = ["# TYPE vllm:time_to_first_token_seconds histogram"]
    lines += [f'vllm:time_to_first_token_seconds_bucket{{le="{le}",model_name="m"}} {count}' for le in _BOUNDS]
    lines += [f'vllm:time_to_first_token_seconds_count{{model_name="m"}} {count}',
              f'vllm:time_to_first_token_seconds_sum{{model_name="m"}} {total}']
    return "\n".join(lines) + "\n"


def test_a_histogram_flagged_unreliable_never_feeds_the_attainment():
    d = IntervalDeriver()
    d.step(0.0, parse_metrics(_broken(8060, 0.5871782302856445)))
    out = d.step(1.0, parse_metrics(_broken(16120, 2 * 0.5871782302856445)))
    assert "ttft" in out["latency_unreliable"]
    assert out["ttft_slo_attainment_ratio"] is None and out["ttft_slo_observations"] == 0
