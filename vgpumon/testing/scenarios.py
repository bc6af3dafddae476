"""Failure and scale scenarios derived from real captures by documented transformations.

A scenario never invents readings: it starts from a capture recorded on hardware and applies one
of the transformations below, so every value a test sees was once answered by a real GPU.

* ``replicate_devices(n)`` — answer as ``n`` GPUs: every device-0 call is copied to indices
  ``0..n-1`` with distinct masked UUIDs, serials and PCI bus ids (an 8-GPU host from a 1-GPU
  capture).
* ``fail_call(fn, code, from_tick, devices)`` — from tick ``from_tick`` on, ``fn`` answers the NVML
  error ``code`` on ``devices`` (a lost GPU: ``fail_call("*", NVML_ERROR_GPU_IS_LOST, ...)``).
* ``repeat(times)`` — play the capture's ticks ``times`` times in a row, each pass shifted in time
  by the capture's span plus one interval (a longer run from a short capture).
"""

from __future__ import annotations

import copy
from typing import Any, Iterable, Sequence

from vgpumon.sources.nvml_backend import ReplayBackend, read_capture

Ticks = list[dict[str, Any]]


def load(path: str) -> tuple[dict[str, Any], Ticks]:
    """Read a capture as ``(header, ticks)`` for transformation."""
    return read_capture(path)


def _relabel(fn: str, value: Any, index: int) -> Any:
    if fn == "nvmlDeviceGetUUID":
        return f"GPU-00000000-0000-4000-8000-{index:012d}"
    if fn == "nvmlDeviceGetSerial":
        return f"{index:013d}"
    if fn == "nvmlDeviceGetPciInfo" and isinstance(value, dict):
        bus = f"00000000:{0x18 + index * 0x10:02X}:00.0"
        return {**value, "busId": bus, "busIdLegacy": bus[4:], "bus": 0x18 + index * 0x10}
    return value


def replicate_devices(header: dict[str, Any], ticks: Ticks, n: int) -> tuple[dict[str, Any], Ticks]:
    """Answer every call of device 0 for devices ``0..n-1`` (see module docstring)."""
    out = []
    for tick in ticks:
        calls = []
        for scope, fn, args, kwargs, outcome in tick["calls"]:
            if scope == "sys" and fn == "nvmlDeviceGetCount" and "v" in outcome:
                calls.append([scope, fn, args, kwargs, {"v": n}])
            elif scope == 0:
                for i in range(n):
                    oc = copy.deepcopy(outcome)
                    if "v" in oc:
                        oc["v"] = _relabel(fn, oc["v"], i)
                    calls.append([i, fn, args, kwargs, oc])
            elif scope == "sys" or isinstance(scope, int) and scope >= n:
                calls.append([scope, fn, args, kwargs, outcome])
        out.append({**tick, "calls": calls})
    return {**header, "derived": f"replicate_devices({n})"}, out


def fail_call(
    header: dict[str, Any], ticks: Ticks, fn: str, code: int, *, from_tick: int = 0, until_tick: int | None = None,
    devices: Iterable[int] | None = None,
) -> tuple[dict[str, Any], Ticks]:
    """Make ``fn`` (``"*"`` = every device call) answer error ``code`` on ``devices`` for ticks
    ``from_tick <= tick < until_tick``."""
    devs = None if devices is None else set(devices)
    out = []
    for tick in ticks:
        active = tick["tick"] >= from_tick and (until_tick is None or tick["tick"] < until_tick)
        calls = []
        for scope, f, args, kwargs, outcome in tick["calls"]:
            if active and scope != "sys" and (fn in ("*", f)) and (devs is None or scope in devs):
                outcome = {"e": code}
            calls.append([scope, f, args, kwargs, outcome])
        out.append({**tick, "calls": calls})
    return {**header, "derived": f"{header.get('derived', '')} fail_call({fn}, {code}, {from_tick})".strip()}, out


def repeat(header: dict[str, Any], ticks: Ticks, times: int) -> tuple[dict[str, Any], Ticks]:
    """The capture's ticks ``times`` times in a row (see module docstring); init block kept once."""
    init = [t for t in ticks if t["tick"] < 0]
    body = [t for t in ticks if t["tick"] >= 0]
    interval = float(header.get("interval_s") or 1.0)
    span = body[-1]["ts"] - body[0]["ts"] + interval
    out = list(init)
    for k in range(times):
        for t in body:
            out.append({**t, "tick": len(out) - len(init), "ts": t["ts"] + k * span})
    return {**header, "derived": f"{header.get('derived', '')} repeat({times})".strip()}, out


def backend(header: dict[str, Any], ticks: Sequence[dict[str, Any]]) -> ReplayBackend:
    """A replay backend over transformed ticks."""
    return ReplayBackend(header=header, ticks=ticks)


def write(path: Any, header: dict[str, Any], ticks: Sequence[dict[str, Any]]) -> None:
    """Write a (transformed) capture to a file that ``vgpumon agent --replay`` reads."""
    import json
    from pathlib import Path

    from vgpumon.sources.nvml_backend import _open_text

    with _open_text(Path(path), "w") as f:
        f.write(json.dumps(header) + "\n")
        for tick in ticks:
            f.write(json.dumps(tick, separators=(",", ":")) + "\n")
