"""KV-cache fragmentation estimate (FACTS §5).

vLLM allocates the KV cache in blocks of ``B`` token slots; a sequence holds whole blocks, so the
waste ("internal fragmentation") sits in each running sequence's last, partly filled block: on
average ``(B − 1) / 2`` empty slots per running sequence. ``/metrics`` gives the block usage, not
token counts, so the estimate is::

    N  = kv_cache_size_tokens / B   when the server reports kv_cache_size_tokens (from 0.25),
         else num_gpu_blocks        (cache_config_info)
    U  = usage · (N − 1)            blocks in use (vLLM: usage = 1 − free / (N − 1); one block
                                    is reserved as the null block)
    W  = R · (B − 1) / 2            wasted slots, R = running requests
    fragmentation_ratio = W / (U · B)          share of the used slots that hold no token
    token_occupancy_ratio = (U · B − W) / (N · B)   estimated tokens held / token capacity

clipped to 0–1. It is approximate by construction (an average over sequence lengths; prefix
sharing makes several requests hold one block, which the formula counts as waste), and more so for
hybrid models, whose KV groups (attention, sliding window, Mamba state) have block pools of other
sizes: ``approximate`` says so, and ``kv_cache_size_tokens`` is then preferred for ``N``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KvEstimate:
    """One tick's estimate.

    Attributes:
        block_size: ``B`` (tokens per block).
        blocks_total: ``N``.
        blocks_used: ``U`` (fractional: usage is a ratio).
        fragmentation_ratio: ``W / (U·B)``; ``None`` when no block is in use.
        token_occupancy_ratio: ``(U·B − W) / (N·B)``.
        approximate: True for hybrid models (several KV groups) or when the config does not say.
    """

    block_size: int
    blocks_total: int
    blocks_used: float
    fragmentation_ratio: float | None
    token_occupancy_ratio: float | None
    approximate: bool


def _clip(x: float) -> float:
    return min(max(x, 0.0), 1.0)


def estimate(
    *,
    running: float | None,
    kv_usage_ratio: float | None,
    block_size: int | None,
    num_gpu_blocks: int | None,
    kv_cache_size_tokens: int | None = None,
    hybrid: bool | None = None,
) -> KvEstimate | None:
    """Estimate KV-cache fragmentation from one scrape (formula in the module docstring).

    Args:
        running: running requests (``vllm:num_requests_running``, summed over engines).
        kv_usage_ratio: ``vllm:kv_cache_usage_perc`` (ratio 0–1; ``gpu_cache_usage_perc`` before
            0.9).
        block_size: ``cache_config_info`` ``block_size``.
        num_gpu_blocks: ``cache_config_info`` ``num_gpu_blocks``.
        kv_cache_size_tokens: ``cache_config_info`` ``kv_cache_size_tokens`` (0.25+).
        hybrid: ``CacheConfig.hybrid``.

    Returns:
        The estimate, or ``None`` when block size, capacity, usage or running requests are
        unknown.
    """
    if not block_size or kv_usage_ratio is None or running is None:
        return None
    if kv_cache_size_tokens:
        n = kv_cache_size_tokens // block_size
    elif num_gpu_blocks:
        n = num_gpu_blocks
    else:
        return None
    if n < 2:
        return None
    b = block_size
    used = kv_usage_ratio * (n - 1)
    waste = running * (b - 1) / 2.0
    frag = _clip(waste / (used * b)) if used > 0 else None
    occ = _clip((used * b - waste) / (n * b)) if used > 0 else 0.0
    return KvEstimate(
        block_size=b,
        blocks_total=n,
        blocks_used=used,
        fragmentation_ratio=frag,
        token_occupancy_ratio=occ,
        approximate=hybrid is not False,
    )
