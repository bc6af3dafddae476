"""What surrounds the GPUs in the on-call report (pure data): the vLLM servers and the GPUs they
hold, the processes holding most GPU memory, the trends that matter (memory and PCIe p95 as
series for sparklines, with the memory slope) and how fresh each source's data is.

One store query per concern, for all GPUs at once (docs/benchmarks.md, "diagnose").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from vgpumon.base.fmt import iso
from vgpumon.base.pcie import link_capacity_bytes_per_second
from vgpumon.diagnose.schema import Freshness, GpuTrend, PciePeak, Process, SourceAge, Trends, VllmServer
from vgpumon.rules.leak import theil_sen
from vgpumon.store import Store, StoredGpu
from vgpumon.store.rollup import percentile

if TYPE_CHECKING:
    from vgpumon.config.thresholds import Thresholds

#: Points of a trend (one sparkline character each).
TREND_POINTS = 40
#: Trends over longer look-backs are read from the 1-minute rollups, shorter ones from raw rows:
#: 2 h of 8 GPUs is 57 600 raw rows (about 0.1 s to read), 72 h would be 2 million.
RAW_TREND_MAX_SECONDS = 2 * 3600.0
#: The processes listed (largest GPU memory first).
TOP_PROCESSES = 10
#: How far back a vLLM server's state and queue are read: its newest polls, not the whole look-back.
VLLM_RECENT_SECONDS = 900.0

_PCIE = ("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second")


# -- vLLM -------------------------------------------------------------------------------------------


def servers(store: Store, hostname: str, start: float, end: float, index_of: dict[str, int],
            thresholds: Thresholds | None = None) -> list[VllmServer]:
    """The host's vLLM servers seen in ``[start, end]``: the newest start of each, its newest poll.

    Returns:
        One ``VllmServer`` per server (by URL), sorted by URL: ``url``, ``server`` (``host:port``, as the
        rules label it), ``model``, ``version``, ``pid``, ``state`` (newest poll, ``None`` without
        one), ``reason``, ``state_since`` (first poll of the current state run among the recent
        polls), ``ended``, ``prewarm_seconds``, ``prewarm_gpu_active_ratio``, ``running``,
        ``waiting`` (the queue), ``kv_cache_usage_ratio``, ``kv_fragmentation_ratio`` (newest
        estimate) and its mean over the recent polls, ``energy_per_token_joules``,
        ``energy_interval_joules`` and ``energy_per_token_note`` (newest poll), ``telemetry``, ``gpus`` (indices of the
        GPUs holding its processes, UUIDs of GPUs this host no longer has under ``gpu_uuids``),
        ``newest_poll``, ``signals`` (SLO attainment, prefix-cache hits, preemptions, speculative
        decoding, KV offload over the recent polls: ``vgpumon.diagnose.signals``; the SLO targets
        and objectives are ``thresholds``').
    """
    from vgpumon.config.thresholds import Thresholds as _Thresholds
    from vgpumon.diagnose.signals import server_signals
    from vgpumon.store.vllm_repository import VllmRepository

    th = thresholds or _Thresholds()

    repo = VllmRepository(store.engine)
    newest: dict[str, dict[str, Any]] = {}  # the store's rows
    for inst in repo.instances(hostname):
        if inst["first_seen"] > end or inst["last_seen"] < start:
            continue
        if inst["url"] not in newest or inst["first_seen"] >= newest[inst["url"]]["first_seen"]:
            newest[inst["url"]] = inst
    out: list[VllmServer] = []
    for url, inst in sorted(newest.items()):
        polls = repo.samples(inst["id"], max(start, end - VLLM_RECENT_SECONDS), end)
        last = polls[-1] if polls else None
        since = None
        if last is not None:
            since = last["ts"]
            for r in reversed(polls):
                if r["state"] != last["state"]:
                    break
                since = r["ts"]
        frag = [r["kv_fragmentation_ratio"] for r in polls if r["kv_fragmentation_ratio"] is not None]
        uuids = [m["gpu_uuid"] for m in repo.gpu_map(inst["id"])]
        out.append({
            "url": url,
            "server": f"{inst['address']}:{inst['port']}",
            "model": inst["model"],
            "version": inst["version"],
            "pid": inst["pid"],
            "state": last["state"].value if last else None,
            "reason": last["reason"] if last else "no poll in the window",
            "state_since": iso(since),
            "ended": iso(inst["ended"]),
            "prewarm_seconds": inst["prewarm_seconds"],
            "prewarm_gpu_active_ratio": inst["prewarm_gpu_active_ratio"],
            "running": last["running"] if last else None,
            "waiting": last["waiting"] if last else None,
            "kv_cache_usage_ratio": last["kv_cache_usage_ratio"] if last else None,
            "kv_fragmentation_ratio": last["kv_fragmentation_ratio"] if last else None,
            "kv_fragmentation_mean_ratio": sum(frag) / len(frag) if frag else None,
            "kv_block_size": last["kv_block_size"] if last else None,
            "energy_per_token_joules": last["energy_per_token_joules"] if last else None,
            "energy_interval_joules": last["energy_interval_joules"] if last else None,
            "energy_per_token_note": last["energy_per_token_note"] if last else None,
            "telemetry": last["telemetry"] if last else None,
            "gpus": sorted(index_of[u] for u in uuids if u in index_of),
            "gpu_uuids": sorted(u for u in uuids if u not in index_of),
            "newest_poll": iso(last["ts"]) if last else None,
            "newest_poll_ts": last["ts"] if last else None,
            "signals": server_signals(polls, th),
        })
    return out


# -- processes --------------------------------------------------------------------------------------


def processes(store: Store, gpus: Sequence[StoredGpu], start: float, end: float, *, top: int = TOP_PROCESSES) -> list[Process]:
    """The processes holding most GPU memory at the newest process sample of the window.

    Returns:
        Up to ``top`` ``Process`` entries, largest first: ``gpu`` (index), ``pid``, ``name``, ``cmdline``,
        ``username`` (the owner), ``container_id`` (from the process's cgroup), ``pod`` (``None``
        here: Kubernetes owners are not stored; the agent's API adds them), ``used_gpu_memory_bytes``,
        ``rss_bytes``, ``resolved``, ``ts``.
    """
    index = {g.id: g.identity.index for g in gpus}
    rows = store.process_holdings(list(index), start, end)
    return [
        {
            "gpu": index[r["gpu_id"]], "pid": r["pid"], "name": r["name"], "cmdline": r["cmdline"], "username": r["username"],
            "container_id": r["container_id"], "pod": None, "used_gpu_memory_bytes": r["used_gpu_memory_bytes"],
            "rss_bytes": r["rss_bytes"], "resolved": bool(r["resolved"]), "ts": iso(r["ts"]),
        }
        for r in rows[:top]
    ]


# -- trends -----------------------------------------------------------------------------------------


def _buckets(t0: float, end: float, points: int) -> tuple[float, int]:
    width = max((end - t0) / points, 1e-3)
    return width, points


def trends(store: Store, gpus: Sequence[StoredGpu], start: float, end: float, *, points: int = TREND_POINTS) -> Trends:
    """Memory used and PCIe TX/RX p95 per GPU over ``[start, end]``, as ``points`` buckets.

    Looks back of at most ``RAW_TREND_MAX_SECONDS`` are read from raw rows: a bucket's memory is
    the highest reading in it, its PCIe figure the 95th percentile of the readings. Longer ones
    read the 1-minute rollups: a bucket's memory is the highest minute maximum, its PCIe figure
    the highest minute p95 (at or above the true p95 of the bucket: a trend to notice, not a
    figure to plan with — ``vgpumon capacity`` is that). The buckets span from the first row in
    the window, so a short capture fills the whole line.

    Returns:
        ``{"source": "raw"|"rollups", "start", "start_ts", "end", "bucket_seconds", "gpus": [...]}``, one
        entry per GPU: ``index``, ``memory_used_bytes`` (list, ``None`` for an empty bucket),
        ``memory_total_bytes``, ``memory_slope_bytes_per_second`` (Theil–Sen over the buckets;
        ``None`` with fewer than 3), ``pcie_tx_p95_bytes_per_second`` and ``pcie_rx_…`` (lists),
        ``pcie_capacity_bytes_per_second``, ``pcie_peak`` (``{"direction", "bytes_per_second",
        "share_of_max_link", "at"}`` of the busiest bucket, ``None`` without readings).
    """
    ids = [g.id for g in gpus]
    raw = end - start <= RAW_TREND_MAX_SECONDS
    mem_col, pcie_cols = "memory_used_bytes", tuple(_PCIE)
    if raw:
        rows = store.series_many(ids, start, end, (mem_col, *pcie_cols))
        firsts = [r[0]["ts"] for r in rows.values() if r]
        t0 = min(firsts) if firsts else start
        width, n = _buckets(t0, end, points)
    else:
        # each bucket's largest minute values, taken in the database
        pcie_cols = tuple(f"{c}_p95" for c in _PCIE)
        mem_col = "memory_used_bytes_max"
        t0, width, maxima = store.rollup_bucket_maxima(ids, start, end, (mem_col, *pcie_cols), points)
        n = points
        rows = {g: [{"ts": t0 + i * width, **m} for i, m in enumerate(ms)] for g, ms in maxima.items()}
    out: list[GpuTrend] = []
    for g in gpus:
        mem: list[list[float]] = [[] for _ in range(n)]
        tx: list[list[float]] = [[] for _ in range(n)]
        rx: list[list[float]] = [[] for _ in range(n)]
        for r in rows[g.id]:
            i = min(int((r["ts"] - t0) / width), n - 1) if raw else int(round((r["ts"] - t0) / width))
            if r[mem_col] is not None:
                mem[i].append(r[mem_col])
            if r[pcie_cols[0]] is not None:
                tx[i].append(r[pcie_cols[0]])
            if r[pcie_cols[1]] is not None:
                rx[i].append(r[pcie_cols[1]])

        def p95(values: list[float]) -> float | None:
            if not values:
                return None
            return percentile(sorted(values), 0.95) if raw else max(values)

        memory = [max(v) if v else None for v in mem]
        tx95, rx95 = [p95(v) for v in tx], [p95(v) for v in rx]
        xs = [t0 + (i + 0.5) * width for i, v in enumerate(memory) if v is not None]
        ys = [v for v in memory if v is not None]
        slope = theil_sen(xs, ys)[0] if len(ys) >= 3 else None
        cap = link_capacity_bytes_per_second(g.identity.pcie_link_gen_max, g.identity.pcie_link_width_max)
        peak: PciePeak | None = None
        for direction, series in (("tx", tx95), ("rx", rx95)):
            for i, v in enumerate(series):
                if v is not None and (peak is None or v > peak["bytes_per_second"]):
                    peak = {"direction": direction, "bytes_per_second": v, "share_of_max_link": v / cap if cap else None,
                            "at": iso(t0 + i * width), "at_ts": t0 + i * width}
        out.append({
            "index": g.identity.index,
            "memory_used_bytes": memory,
            "memory_total_bytes": g.identity.memory_total_bytes,
            "memory_slope_bytes_per_second": slope,
            "pcie_tx_p95_bytes_per_second": tx95,
            "pcie_rx_p95_bytes_per_second": rx95,
            "pcie_capacity_bytes_per_second": cap,
            "pcie_peak": peak,
        })
    return {"source": "raw" if raw else "rollups", "start": iso(t0), "start_ts": t0, "end": iso(end), "bucket_seconds": width, "gpus": out}


# -- freshness --------------------------------------------------------------------------------------


def freshness(store: Store, hostname: str, gpus: Sequence[StoredGpu], end: float, now: float,
              vllm: Sequence[VllmServer], max_age: float | None) -> Freshness:
    """How old each source's newest data is, against ``now``.

    Returns:
        ``{"now", "newest_sample", "age_seconds", "max_age_seconds", "stale", "sources": {name:
        {"newest", "age_seconds"}}}``: ``stale`` when ``max_age`` is set and the newest GPU
        sample is older; sources are ``gpu_samples`` (NVML), ``host_samples``, ``vllm`` (newest
        poll of any server in the report) and ``rollups`` (the oldest rollup watermark of the
        host's GPUs: minutes after it are not yet rolled up).
    """
    def item(ts: float | None) -> SourceAge:
        return {"newest": iso(ts), "age_seconds": None if ts is None else max(0.0, now - ts)}

    host = store.newest_host_sample(hostname)
    polls = [s["newest_poll_ts"] for s in vllm if s["newest_poll_ts"] is not None]
    watermark = store.rollup_watermark([g.id for g in gpus])
    age = max(0.0, now - end)
    return {
        "now": iso(now),
        "newest_sample": iso(end),
        "age_seconds": age,
        "max_age_seconds": max_age,
        "stale": max_age is not None and age > max_age,
        "sources": {
            "gpu_samples": item(end),
            "host_samples": item(host),
            "vllm": item(max(polls) if polls else None),
            "rollups": item(watermark),
        },
    }
