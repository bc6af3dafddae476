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

#: The rules whose finding is about a GPU's PCIe traffic, and about a shared port's.
PCIE_TRAFFIC_RULES = ("GpuPcieSaturated",)
PORT_TRAFFIC_RULES = ("PcieUplinkSaturated",)


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
    has one; hit rate, acceptance, KV offload and LMCache's hit ratios as means of the polls with a
    figure, LMCache's local cache bytes from the newest poll that has them; preemptions
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
        "lmcache_retrieve_hit_ratio": _mean(polls, "lmcache_retrieve_hit_ratio"),
        "lmcache_lookup_hit_ratio": _mean(polls, "lmcache_lookup_hit_ratio"),
        "lmcache_local_cache_usage_bytes": next(
            (v for p in reversed(polls) if (v := _num(p, "lmcache_local_cache_usage_bytes")) is not None), None),
        "polls": len(polls),
    }


def _sum(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def attribute_kv_offload(findings: list[Finding], blocks: Sequence[GpuBlock], offload: Mapping[str, GpuKvOffload],
                         shared: Mapping[str, Sequence[str]] | None = None) -> None:
    """Add to each PCIe-traffic finding the share of the traffic that vLLM's KV offload moved over
    the window (``kv_offload`` and a sentence of evidence): a GPU's (``GpuPcieSaturated``), or
    the GPUs' behind a shared port (``PcieUplinkSaturated``; ``shared``: port → GPU UUIDs)."""
    means = {b["uuid"]: (b["pcie"]["rx"]["mean_bytes_per_second"], b["pcie"]["tx"]["mean_bytes_per_second"]) for b in blocks}
    ports = shared or {}
    for f in findings:
        gpu = f.get("gpu")
        if f.get("alert") in PCIE_TRAFFIC_RULES and gpu is not None:
            uuids, where = [gpu["uuid"]], "the GPU"
        elif f.get("alert") in PORT_TRAFFIC_RULES and (port := f["subject"].get("port", "")) in ports:
            uuids, where = list(ports[port]), f"the GPUs behind {port}"
        else:
            continue
        kvs = [offload[u] for u in uuids if u in offload]
        if not kvs:
            continue
        load = sum(kv["load_bytes_per_second"] for kv in kvs)
        store = sum(kv["store_bytes_per_second"] for kv in kvs)
        rx = _sum([means.get(u, (None, None))[0] for u in uuids])
        tx = _sum([means.get(u, (None, None))[1] for u in uuids])
        found: FindingKvOffload = {
            "servers": sorted({s for kv in kvs for s in kv["servers"]}), "split": max(kv["split"] for kv in kvs),
            "load_bytes_per_second": load, "store_bytes_per_second": store,
            "rx_share": share(load, rx), "tx_share": share(store, tx),
        }
        f["kv_offload"] = found
        sentence = evidence(found, where)
        f["message"] = f"{f['message']} {sentence}"
        f["headline"] = f"{f['headline']} {sentence}"


def evidence(kv: FindingKvOffload, where: str = "the GPU") -> str:
    """``KV offload of vLLM 127.0.0.1:8000 moved 1.14 GB/s (2 % of its RX) into the GPU and
    0.24 GB/s (7 % of its TX) out on average over the window.``"""
    from vgpumon import catalogue

    their = "its" if where == "the GPU" else "their"

    def part(rate: float, share_: float | None, field: str, direction: str) -> str:
        text = catalogue.fmt(("vllm_samples", field), rate)
        return text if share_ is None else f"{text} ({share_ * 100:.0f} % of {their} {direction})"

    shared = f", split evenly over the server's {kv['split']} GPUs" if kv["split"] > 1 else ""
    return (f"KV offload of vLLM {', '.join(kv['servers'])} moved "
            f"{part(kv['load_bytes_per_second'], kv['rx_share'], 'kv_offload_load_bytes_per_second', 'RX')} into {where} and "
            f"{part(kv['store_bytes_per_second'], kv['tx_share'], 'kv_offload_store_bytes_per_second', 'TX')} out "
            f"on average over the window{shared}.")
