"""KV-offload traffic per GPU over a window, from the stored vLLM polls (docs/vllm.md, "KV offload
and the PCIe link"): what ``diagnose``'s PCIe findings and ``capacity`` attribute to KV offload.

vLLM's OffloadingConnector counts a server's transfers between its GPUs and the offload medium
(CPU memory) in ``vllm:kv_offload_load_bytes_total`` (medium → GPU: the GPU's PCIe **RX**) and
``vllm:kv_offload_store_bytes_total`` (GPU → medium: its **TX**). The counters are the server's,
summed over its workers; each worker moves its own shard of the KV cache, so a server holding N
GPUs is charged to each an N-th of its traffic (an even split, said in ``split``). A GPU held by two
servers gets both shares.

A server's figure is the mean of its polls' rates in the window that carry one (a poll without
the counters — no OffloadingConnector, the first poll of a start — is no evidence and is left
out); ``polls`` says how many there were.
"""

from __future__ import annotations

from typing import TypedDict

from sqlalchemy.engine import Engine

from vgpumon.store.vllm_repository import VllmRepository


class GpuKvOffload(TypedDict):
    """KV-offload traffic charged to one GPU over a window (bytes per second, means)."""

    load_bytes_per_second: float  # offload medium → GPU: part of the GPU's PCIe RX
    store_bytes_per_second: float  # GPU → offload medium: part of its PCIe TX
    servers: list[str]  # host:port of the servers whose traffic it is
    split: int  # the most GPUs one of those servers' traffic was split across (evenly)
    polls: int  # polls with a figure, over those servers


def by_gpu(engine: Engine, hostname: str, start: float, end: float) -> dict[str, GpuKvOffload]:
    """KV-offload bytes per second charged to each GPU (by UUID) of ``hostname`` over
    ``[start, end]``; GPUs without any are absent.

    Raises:
        StoreUnavailableError: the store cannot be read.
    """
    repo = VllmRepository(engine)
    out: dict[str, GpuKvOffload] = {}
    for inst in repo.instances(hostname):
        if inst["first_seen"] > end or inst["last_seen"] < start:
            continue
        load, store, polls = repo.kv_offload_means(inst["id"], start, end)
        if not polls:
            continue
        uuids = sorted({m["gpu_uuid"] for m in repo.gpu_map(inst["id"])})
        if not uuids:
            continue  # a --vllm-url target: its processes, so its GPUs, are not visible
        n = len(uuids)
        for uuid in uuids:
            entry = out.setdefault(uuid, {"load_bytes_per_second": 0.0, "store_bytes_per_second": 0.0, "servers": [], "split": 1,
                                          "polls": 0})
            entry["load_bytes_per_second"] += (load or 0.0) / n
            entry["store_bytes_per_second"] += (store or 0.0) / n
            server = f"{inst['address']}:{inst['port']}"
            if server not in entry["servers"]:
                entry["servers"].append(server)
            entry["split"] = max(entry["split"], n)
            entry["polls"] += polls
    return out


def share(part: float | None, whole: float | None) -> float | None:
    """``part`` over ``whole``, at most 1 (the two are means over slightly different instants:
    vLLM's polls and NVML's ticks); ``None`` when either is unknown or ``whole`` is not above 0."""
    if part is None or whole is None or whole <= 0:
        return None
    return min(1.0, part / whole)
