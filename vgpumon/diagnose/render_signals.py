"""The on-call report's lines for a vLLM server's serving signals (``VllmServer.signals``,
``vgpumon.diagnose.signals``): its SLO attainment, and its prefix-cache hits, preemptions,
speculative-decoding acceptance and KV offload over the recent polls."""

from __future__ import annotations

from vgpumon import catalogue
from vgpumon.base.fmt import duration
from vgpumon.diagnose.schema import SloFigure, VllmServer

_V = "vllm_samples"


def _target(seconds: float) -> str:
    return f"{seconds * 1000:g} ms" if seconds < 1 else f"{seconds:g} s"


def _slo(name: str, fig: SloFigure, what: str) -> str:
    target = f"{name} ≤ {_target(fig['target_seconds'])}"
    objective = f"objective {fig['objective_ratio'] * 100:g} %"
    if fig["attainment_ratio"] is None:
        why = f"no {what} in the window" if fig["observations"] is not None else "not reported"
        return f"{target}: N/A ({why}; {objective})"
    n = catalogue.fmt((_V, "ttft_slo_observations"), fig["observations"], "n/a")
    mark = ", BELOW" if fig["below_objective"] else ""
    note = ", interpolated between bucket bounds" if fig["interpolated"] else ""
    return f"{target}: {catalogue.fmt((_V, 'ttft_slo_attainment_ratio'), fig['attainment_ratio'])} of {n} {what} ({objective}{mark}{note})"


def slo_line(s: VllmServer) -> str | None:
    """``127.0.0.1:8000: SLO attainment over 5 min: TTFT ≤ 500 ms: 99.7 % of 577 requests
    (objective 99 %); inter-token ≤ 50 ms: …``; ``None`` for a report without signals."""
    sig = s.get("signals")
    if sig is None:
        return None
    return (f"{s['server']}: SLO attainment over {duration(sig['slo_window_seconds'])}: "
            f"{_slo('TTFT', sig['ttft'], 'requests')}; {_slo('inter-token', sig['itl'], 'token intervals')}")


def signals_line(s: VllmServer) -> str | None:
    """Prefix-cache hits, preemptions, speculative decoding, KV offload and LMCache over the recent
    polls (the last three only when the server reports them); ``None`` without signals or polls."""
    sig = s.get("signals")
    if sig is None or not sig["polls"]:
        return None
    unit = sig["prefix_cache_unit"]
    hits = catalogue.fmt((_V, "prefix_cache_hit_ratio"), sig["prefix_cache_hit_ratio"], "no queries")
    parts = [f"prefix-cache hits {hits}" + (f" of queried {unit}" if unit and sig["prefix_cache_hit_ratio"] is not None else "")]
    if sig["preemptions"] is None:
        parts.append("preemptions N/A (not reported)")
    else:
        top = sig["preemptions_per_second_max"]
        peak = f", at most {catalogue.fmt((_V, 'preemptions_per_second'), top)}" if sig["preemptions"] and top else ""
        parts.append(f"{sig['preemptions']:.0f} preemptions{peak}")
    if sig["spec_decode_acceptance_ratio"] is not None:
        parts.append(f"spec-decode acceptance {catalogue.fmt((_V, 'spec_decode_acceptance_ratio'), sig['spec_decode_acceptance_ratio'])}")
    load, store = sig["kv_offload_load_bytes_per_second"], sig["kv_offload_store_bytes_per_second"]
    if load is not None or store is not None:
        parts.append(f"KV offload {catalogue.fmt((_V, 'kv_offload_load_bytes_per_second'), load, 'n/a')} loaded into the GPUs, "
                     f"{catalogue.fmt((_V, 'kv_offload_store_bytes_per_second'), store, 'n/a')} stored from them (mean)")
    hit, lookup, cached = sig["lmcache_retrieve_hit_ratio"], sig["lmcache_lookup_hit_ratio"], sig["lmcache_local_cache_usage_bytes"]
    if hit is not None or lookup is not None or cached is not None:
        parts.append(f"LMCache hits {catalogue.fmt((_V, 'lmcache_retrieve_hit_ratio'), hit, 'N/A (no retrieve)')}, "
                     f"lookups {catalogue.fmt((_V, 'lmcache_lookup_hit_ratio'), lookup, 'N/A')} (mean), "
                     f"local cache {catalogue.fmt((_V, 'lmcache_local_cache_usage_bytes'), cached, 'N/A')}")
    return f"{s['server']}: over its last {sig['polls']} polls: " + "; ".join(parts)
