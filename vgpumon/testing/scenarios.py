"""Failure and scale scenarios derived from real captures by documented transformations.

A scenario never invents readings: it starts from a capture recorded on hardware and applies one
of the transformations below, so every value a test sees was once answered by a real GPU.

* ``replicate_devices(n)`` — answer as ``n`` GPUs: every device-0 call is copied to indices
  ``0..n-1`` with distinct masked UUIDs, serials and PCI bus ids (an 8-GPU host from a 1-GPU
  capture).
* ``fail_call(fn, code, from_tick, devices)`` — from tick ``from_tick`` on, ``fn`` answers the NVML
  error ``code`` on ``devices`` (a lost GPU: ``fail_call("*", NVML_ERROR_GPU_IS_LOST, ...)``).
* ``repeat(times)`` — play the ticks ``times`` times in a row, each pass shifted by the capture's
  length (a long run from a short capture; GPM and counters repeat as recorded).
* ``set_call(scope, fn, outcome, ticks=...)`` — the call answers ``outcome`` (``{"v": value}``
  or ``{"e": code}``) in the given ticks, replacing the recorded answer or adding one; for
  values seen in the wild on other boards (utilization 4294967295, a counter reset by a driver
  reload, XID 79, MIG mode), injected into real ticks.
* ``between(start, end)`` — only the ticks recorded in ``[start, end)`` (epoch seconds), numbered
  from 0, the init block kept: one workload phase of a capture (the H2D copy phase), to be
  ``repeat``-ed into a long run of that phase.
* ``scale_gpm(metric_ids, factor)`` — the recorded GPM outputs of those metrics times ``factor``
  (a card carrying a fraction of the recorded PCIe traffic; 0: none at all).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Iterable, Sequence

from vgpumon.sources.nvml_backend import ReplayBackend, read_capture

Ticks = list[dict[str, Any]]


def load(path: str) -> tuple[dict[str, Any], Ticks]:
    """Read a capture as ``(header, ticks)`` for transformation."""
    return read_capture(path)


def bus_number(index: int, n: int) -> int:
    """PCI bus of replicated device ``index`` of ``n``: 0x18, 0x28, …; beyond 15 devices 0x1c,
    0x24, … (0x08 apart, so that 16 fit the 8-bit bus number; never ending in 0 or 1, the buses
    ``vgpumon.testing.sysfs.switch_tree`` gives its switch ports)."""
    return 0x18 + index * 0x10 if n <= 15 else 0x1C + index * 0x08


def _relabel(fn: str, value: Any, index: int, n: int) -> Any:
    if fn == "nvmlDeviceGetUUID":
        return f"GPU-00000000-0000-4000-8000-{index:012d}"
    if fn == "nvmlDeviceGetSerial":
        return f"{index:013d}"
    if fn == "nvmlDeviceGetPciInfo" and isinstance(value, dict):
        bus = f"00000000:{bus_number(index, n):02X}:00.0"
        return {**value, "busId": bus, "busIdLegacy": bus[4:], "bus": bus_number(index, n)}
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
                        oc["v"] = _relabel(fn, oc["v"], i, n)
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
            device_match = scope != "sys" and fn == "*" and (devs is None or scope in devs)
            named_match = f == fn and (scope == "sys" or devs is None or scope in devs)
            if active and (device_match or named_match):
                outcome = {"e": code}
            calls.append([scope, f, args, kwargs, outcome])
        out.append({**tick, "calls": calls})
    return {**header, "derived": f"{header.get('derived', '')} fail_call({fn}, {code}, {from_tick})".strip()}, out


def repeat(header: dict[str, Any], ticks: Ticks, times: int) -> tuple[dict[str, Any], Ticks]:
    """The ticks ``times`` times in a row (see module docstring)."""
    body = [t for t in ticks if t["tick"] >= 0]
    init = [t for t in ticks if t["tick"] < 0]
    if not body:
        return header, ticks
    span = body[-1]["ts"] - body[0]["ts"] + (body[1]["ts"] - body[0]["ts"] if len(body) > 1 else 1.0)
    out = list(init)
    for k in range(times):
        for t in body:
            out.append({**t, "tick": k * len(body) + t["tick"], "ts": t["ts"] + k * span})
    return {**header, "derived": f"{header.get('derived', '')} repeat({times})".strip()}, out


def set_call(
    header: dict[str, Any],
    ticks: Ticks,
    scope: Any,
    fn: str,
    outcome: dict[str, Any],
    *,
    at: Iterable[int],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], Ticks]:
    """Make call ``(scope, fn, args, kwargs)`` answer ``outcome`` in ticks ``at`` (``-1`` is the
    init block); the recorded answer is replaced, or the answer added if the tick had none."""
    wanted = set(at)
    kwargs = kwargs or {}
    out = []
    for tick in ticks:
        calls = [list(c) for c in tick["calls"]]
        if tick["tick"] in wanted:
            hits = [c for c in calls if c[0] == scope and c[1] == fn and list(c[2]) == list(args) and c[3] == kwargs]
            for c in hits:
                c[4] = copy.deepcopy(outcome)
            if not hits:
                calls.append([scope, fn, list(args), dict(kwargs), copy.deepcopy(outcome)])
        out.append({**tick, "calls": calls})
    return {**header, "derived": f"{header.get('derived', '')} set_call({scope}, {fn})".strip()}, out


def edit_call(
    header: dict[str, Any],
    ticks: Ticks,
    scope: Any,
    fn: str,
    edit: Callable[[Any], Any],
    *,
    at: Iterable[int],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], Ticks]:
    """Pass the recorded value of call ``(scope, fn, args, kwargs)`` through ``edit`` in ticks
    ``at``; ticks where the call was not made or answered an error are left alone."""
    wanted = set(at)
    kwargs = kwargs or {}
    out = []
    for tick in ticks:
        calls = [list(c) for c in tick["calls"]]
        if tick["tick"] in wanted:
            for c in calls:
                if c[0] == scope and c[1] == fn and list(c[2]) == list(args) and c[3] == kwargs and "v" in c[4]:
                    c[4] = {"v": edit(copy.deepcopy(c[4]["v"]))}
        out.append({**tick, "calls": calls})
    return {**header, "derived": f"{header.get('derived', '')} edit_call({scope}, {fn})".strip()}, out


def between(header: dict[str, Any], ticks: Ticks, start: float, end: float) -> tuple[dict[str, Any], Ticks]:
    """The ticks recorded in ``[start, end)``, renumbered from 0, with the init block (see module
    docstring)."""
    init = [t for t in ticks if t["tick"] < 0]
    body = [t for t in ticks if t["tick"] >= 0 and start <= t["ts"] < end]
    return {**header, "derived": f"{header.get('derived', '')} between({start}, {end})".strip()}, init + [
        {**t, "tick": k} for k, t in enumerate(body)
    ]


def scale_gpm(header: dict[str, Any], ticks: Ticks, metric_ids: Iterable[int], factor: float) -> tuple[dict[str, Any], Ticks]:
    """Every recorded GPM output of ``metric_ids`` (on every device) times ``factor``."""
    ids = {str(m) for m in metric_ids}
    out = []
    for tick in ticks:
        calls = []
        for scope, fn, args, kwargs, outcome in tick["calls"]:
            if fn == "gpm" and isinstance(outcome.get("v"), dict):
                outcome = {"v": {k: (v * factor if k in ids and isinstance(v, (int, float)) else v) for k, v in outcome["v"].items()}}
            calls.append([scope, fn, args, kwargs, outcome])
        out.append({**tick, "calls": calls})
    return {**header, "derived": f"{header.get('derived', '')} scale_gpm({sorted(ids)}, {factor})".strip()}, out


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
