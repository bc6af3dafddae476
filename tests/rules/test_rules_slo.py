"""VllmSloAttainmentLow natively: a discovered server answering the real vLLM 0.32.0 captures (idle,
then busy: 575 of 577 TTFTs ≤ 0.5 s, 45 593 of 45 608 token intervals ≤ 50 ms)."""

from __future__ import annotations

from test_rules_vllm import capture, evaluate, run

from vgpumon.sources.vllm.slo import SloTargets


def _idle_then_busy(i, server):
    server.metrics = capture("idle" if i < 2 else "busy")


def test_the_recorded_busy_server_meets_its_objectives(tmp_path):
    finding = evaluate(tmp_path, run(_idle_then_busy, 4), "VllmSloAttainmentLow")
    assert finding.state == "ok" and abs(finding.value - 575 / 577) < 1e-4  # TTFT: the nearer its objective


def test_a_tighter_ttft_target_between_bounds_fires_and_says_it_is_interpolated(tmp_path):
    """TTFT ≤ 0.15 s: (351 + 224 × 0.05 / 0.15) of 577 = 73.8 % < 99 %."""
    samples = run(_idle_then_busy, 4, slo=SloTargets(ttft_seconds=0.15))
    finding = evaluate(tmp_path, samples, "VllmSloAttainmentLow")
    assert finding.state == "firing"
    assert abs(finding.value - (351 + 224 * 0.05 / 0.15) / 577) < 1e-3
    assert "interpolated" in finding.evidence["how"] and finding.evidence["n"] == "577"


def test_an_idle_server_has_no_verdict(tmp_path):
    finding = evaluate(tmp_path, run(lambda i, s: setattr(s, "metrics", capture("idle")), 3), "VllmSloAttainmentLow")
    assert finding.state == "unknown" and "no request" in finding.reason
