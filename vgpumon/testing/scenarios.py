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
* ``retime(factor)`` — timestamps scaled around the first tick's: a replay at recorded pace
  that runs ``1 / factor`` times faster (for tests against a real Prometheus).
* ``graft(donor)`` — calls a capture never made (it was recorded before the collector learned
  them) answer as a donor capture of the same board and driver answered them, slow-set calls
  from the donor's slow ticks into the base's slow ticks; the base's own answers stay.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Callable, Iterable, Sequence

from vgpumon.sources.nvml_backend import ReplayBackend, read_capture

Ticks = list[dict[str, Any]]


def load(path: str) -> tuple[dict[str, Any], Ticks]:
    """Read a capture as ``(header, ticks)`` for transformation."""
    return read_capture(path)


def bus_id(index: int) -> str:
    """The PCI bus id ``replicate_devices`` gives device ``index`` (NVML form)."""
    return f"00000000:{0x18 + index * 0x10:02X}:00.0"


def _relabel(fn: str, value: Any, index: int) -> Any:
    if fn == "nvmlDeviceGetUUID":
        return f"GPU-00000000-0000-4000-8000-{index:012d}"
    if fn == "nvmlDeviceGetSerial":
        return f"{index:013d}"
    if fn == "nvmlDeviceGetPciInfo" and isinstance(value, dict):
        bus = bus_id(index)
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


def retime(header: dict[str, Any], ticks: Ticks, factor: float) -> tuple[dict[str, Any], Ticks]:
    """Every tick's timestamp (and the XID event times it carries) scaled by ``factor`` around
    the first tick's: ``factor`` 0.25 replays at recorded pace four times faster (a rate derived
    from a counter over capture time reads four times its recorded value)."""
    t0 = next((t["ts"] for t in ticks if t["ts"] is not None), 0.0)

    def at(ts: float) -> float:
        return t0 + (ts - t0) * factor

    out = []
    for tick in ticks:
        calls = []
        for scope, fn, args, kwargs, outcome in tick["calls"]:
            if fn == "xid_poll" and isinstance(outcome.get("v"), list):
                outcome = {"v": [{**e, "ts": at(e["ts"])} for e in outcome["v"]]}
            calls.append([scope, fn, args, kwargs, outcome])
        out.append({**tick, "ts": at(tick["ts"]) if tick["ts"] is not None else None, "calls": calls})
    return {**header, "derived": f"{header.get('derived', '')} retime({factor})".strip()}, out


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


def is_slow_tick(tick: dict[str, Any]) -> bool:
    """True when the tick read the slow set: every slow tick reads the ECC totals
    (``vgpumon.sources.nvml``), no fast tick does."""
    return any(c[1] == "nvmlDeviceGetTotalEccErrors" for c in tick["calls"])


def graft(
    header: dict[str, Any], ticks: Ticks, donor_header: dict[str, Any], donor_ticks: Ticks
) -> tuple[dict[str, Any], Ticks]:
    """Add to each tick the donor's answers to calls the tick lacks (see module docstring).

    A base slow tick takes them from the donor's slow ticks, a fast tick from its fast ticks, in
    turn; the init block from the donor's init block. A call is matched by scope, function and
    arguments, so a recorded answer is never replaced.
    """

    def key(c: list[Any]) -> str:
        return json.dumps(c[:4], sort_keys=True)

    donor_init = [t for t in donor_ticks if t["tick"] < 0]
    pools = {kind: [t for t in donor_ticks if t["tick"] >= 0 and is_slow_tick(t) == kind] for kind in (True, False)}
    turn = {True: 0, False: 0}
    out = []
    for tick in ticks:
        if tick["tick"] < 0:
            donors = donor_init
        else:
            kind = is_slow_tick(tick)
            pool = pools[kind] or pools[not kind]
            donors = [pool[turn[kind] % len(pool)]] if pool else []
            turn[kind] += 1
        have = {key(c) for c in tick["calls"]}
        added = [copy.deepcopy(c) for d in donors for c in d["calls"] if key(c) not in have]
        out.append({**tick, "calls": [*tick["calls"], *added]})
    return {**header, "derived": f"{header.get('derived', '')} graft({donor_header.get('created', 'donor')})".strip()}, out


def backend(header: dict[str, Any], ticks: Sequence[dict[str, Any]]) -> ReplayBackend:
    """A replay backend over transformed ticks."""
    return ReplayBackend(header=header, ticks=ticks)


def write(path: Any, header: dict[str, Any], ticks: Sequence[dict[str, Any]]) -> None:
    """Write a (transformed) capture to a file that ``vgpumon agent --replay`` reads."""
    from pathlib import Path

    from vgpumon.sources.nvml_backend import _open_text

    with _open_text(Path(path), "w") as f:
        f.write(json.dumps(header) + "\n")
        for tick in ticks:
            f.write(json.dumps(tick, separators=(",", ":")) + "\n")
