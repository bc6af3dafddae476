"""PCIe link capacity, per direction, in bytes per second.

Payload rate after line coding (FACTS: 8b/10b for Gen1–2, 128b/130b for Gen3–5; Gen6 uses
FLIT mode whose FLIT/FEC overhead takes roughly 8 % off the raw rate). PCIe is full duplex: TX
and RX each have this capacity.
"""

from __future__ import annotations

# Transfer rate per lane in GT/s and the share of it that carries payload.
_LANE_GT_PER_S: dict[int, float] = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
_ENCODING_EFFICIENCY: dict[int, float] = {
    1: 8 / 10,
    2: 8 / 10,
    3: 128 / 130,
    4: 128 / 130,
    5: 128 / 130,
    6: 0.92,
}


def link_capacity_bytes_per_second(generation: int | None, width: int | None) -> float | None:
    """Capacity of one direction of a PCIe link.

    Args:
        generation: PCIe generation 1–6 (``nvmlDeviceGetMaxPcieLinkGeneration`` and friends).
        width: lane count (1, 2, 4, 8, 16, 32).

    Returns:
        Bytes per second of payload per direction (Gen5 x16 → 63.0e9), or ``None`` when either
        input is unknown or outside the known generations.
    """
    if generation is None or width is None or width <= 0:
        return None
    rate = _LANE_GT_PER_S.get(generation)
    if rate is None:
        return None
    return rate * 1e9 * _ENCODING_EFFICIENCY[generation] * width / 8


def replay_budget_per_minute(generation: int | None, width: int | None) -> int | None:
    """PCIe replays per minute above which NVIDIA's DCGM health watch warns:
    ``ceil(1e-12 × lane rate × 60 × lanes)`` (FACTS §4: x16 budgets Gen3 8, Gen4 16, Gen5 31 —
    a bit error rate of 1e-12 at the lane rate).

    Returns:
        Replays per minute, or ``None`` when the link is unknown.
    """
    if generation is None or width is None or width <= 0 or generation not in _LANE_GT_PER_S:
        return None
    import math

    return math.ceil(round(1e-12 * _LANE_GT_PER_S[generation] * 1e9 * 60 * width, 6))


#: Transfer rate per lane (GT/s) by generation, for the rule twins' PromQL.
LANE_GT_PER_S = dict(_LANE_GT_PER_S)
