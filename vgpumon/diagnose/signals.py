"""vLLM serving signals in the on-call report (pure data): per server its SLO attainment,
prefix-cache hit rate, preemptions, speculative-decoding acceptance and KV-offload traffic over
its recent polls; and, on a GPU's PCIe finding, the part of the traffic that KV offload moved
(docs/diagnose.md, "vLLM servers"; docs/vllm.md, "KV offload and the PCIe link").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from vgpumon.diagnose.schema import Finding, FindingKvOffload, GpuBlock, SloFigure, VllmSignals
from vgpumon.store.kv_offload import GpuKvOffload, share

if TYPE_CHECKING:
    from vgpumon.config.thresholds import Thresholds
    from vgpumon.store.vllm_schema import StoredSample

#: The rules whose finding is about a GPU's PCIe traffic.
PCIE_TRAFFIC_RULES = ("GpuPcieSaturated",)


def _num(poll: StoredSample, key: str) -> float | None:
    v = poll.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _mean(polls: Sequence[StoredSample], key: str) -> float | None:
    values = [v for p in polls if (v := _num(p, key)) is not None]
    return sum(values) / len(values) if values else None


def _slo(polls: Sequence[StoredSample], key: str, target: float, objective: float) -> SloFigure:
    """The newest poll's attainment of one SLO (the figure is over the SLO window already)."""
    # the newest poll with a figure; else the newest that counted the window's observations (0:
    # no request in the window); else none (the histogram not served, or one poll only)
    newest = next((p for p in reversed(polls) if _num(p, f"{key}_slo_attainment_ratio") is not None),
                  next((p for p in reversed(polls) if _num(p, f"{key}_slo_observations") is not None), None))
    ratio = None if newest is None else _num(newest, f"{key}_slo_attainment_ratio")
    return {
        "target_seconds": target, "objective_ratio": objective, "attainment_ratio": ratio,
        "observations": None if newest is None else _num(newest, f"{key}_slo_observations"),
        "interpolated": bool(newest is not None and newest.get(f"{key}_slo_interpolated")),
        "below_objective": ratio is not None and ratio < objective,
    }


def server_signals(polls: Sequence[StoredSample], th: Thresholds) -> VllmSignals:
    """A server's signals over ``polls`` (oldest first): SLO attainment from the newest poll that
    has one; hit rate, acceptance and KV offload as means of the polls with a figure; preemptions
    counted as each poll's rate times the time since the poll before."""
    count, counted = 0.0, False
    for before, poll in zip(polls, polls[1:]):
        rate = _num(poll, "preemptions_per_second")
        if rate is not None:
            count += rate * ((_num(poll, "ts") or 0.0) - (_num(before, "ts") or 0.0))
            counted = True
    rates = [v for p in polls if (v := _num(p, "preemptions_per_second")) is not None]
    unit = next((u for p in reversed(polls) if isinstance(u := p.get("prefix_cache_unit"), str)), None)
    return {
        "slo_window_seconds": th.vllm_slo_window_seconds,
        "ttft": _slo(polls, "ttft", th.vllm_slo_ttft_seconds, th.vllm_slo_ttft_objective_ratio),
        "itl": _slo(polls, "itl", th.vllm_slo_itl_seconds, th.vllm_slo_itl_objective_ratio),
        "prefix_cache_hit_ratio": _mean(polls, "prefix_cache_hit_ratio"),
        "prefix_cache_unit": unit,
        "preemptions": round(count) if counted else None,
        "preemptions_per_second_max": max(rates) if rates else None,
        "spec_decode_acceptance_ratio": _mean(polls, "spec_decode_acceptance_ratio"),
        "kv_offload_load_bytes_per_second": _mean(polls, "kv_offload_load_bytes_per_second"),
        "kv_offload_store_bytes_per_second": _mean(polls, "kv_offload_store_bytes_per_second"),
        "polls": len(polls),
    }


def attribute_kv_offload(findings: list[Finding], blocks: Sequence[GpuBlock], offload: Mapping[str, GpuKvOffload]) -> None:
    """Add to each PCIe-traffic finding of a GPU that vLLM offloads KV through the share of its
    traffic that KV offload moved over the window: ``kv_offload`` and a sentence of evidence."""
    means = {b["uuid"]: (b["pcie"]["rx"]["mean_bytes_per_second"], b["pcie"]["tx"]["mean_bytes_per_second"]) for b in blocks}
    for f in findings:
        gpu = f.get("gpu")
        if f.get("alert") not in PCIE_TRAFFIC_RULES or gpu is None or gpu["uuid"] not in offload:
            continue
        kv = offload[gpu["uuid"]]
        rx, tx = means.get(gpu["uuid"], (None, None))
        found: FindingKvOffload = {
            "servers": list(kv["servers"]), "split": kv["split"],
            "load_bytes_per_second": kv["load_bytes_per_second"], "store_bytes_per_second": kv["store_bytes_per_second"],
            "rx_share": share(kv["load_bytes_per_second"], rx), "tx_share": share(kv["store_bytes_per_second"], tx),
        }
        f["kv_offload"] = found
        sentence = evidence(found)
        f["message"] = f"{f['message']} {sentence}"
        f["headline"] = f"{f['headline']} {sentence}"


def evidence(kv: FindingKvOffload) -> str:
    """``KV offload of vLLM 127.0.0.1:8000 moved 1.14 GB/s into the GPU (76 % of its RX) and
    240 MB/s out (20 % of its TX) on average over the window.``"""
    from vgpumon import catalogue

    def part(rate: float, share_: float | None, field: str, direction: str) -> str:
        text = catalogue.fmt(("vllm_samples", field), rate)
        return text if share_ is None else f"{text} ({share_ * 100:.0f} % of its {direction})"

    shared = f", split evenly over the server's {kv['split']} GPUs" if kv["split"] > 1 else ""
    return (f"KV offload of vLLM {', '.join(kv['servers'])} moved "
            f"{part(kv['load_bytes_per_second'], kv['rx_share'], 'kv_offload_load_bytes_per_second', 'RX')} into the GPU and "
            f"{part(kv['store_bytes_per_second'], kv['tx_share'], 'kv_offload_store_bytes_per_second', 'TX')} out "
            f"on average over the window{shared}.")
