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
* ``retime(factor)`` — the ticks' timestamps (and the XID times in them) moved closer together
  (``factor`` < 1) or further apart around the first tick: the same readings at another pace, for
  replays at recorded pace.
* ``shift(seconds)`` — every timestamp (and the XID times) moved by ``seconds``: the same run,
  ending at another moment (data an hour old).
* ``delay_call(scope, fn, seconds, ticks=...)`` — the call answers as recorded but takes
  ``seconds`` (a wedged driver call: the failure that makes other exporters hang); replay blocks
  that long.
* ``graft(donor)`` — calls a capture never made (it was recorded before the collector learned
  them) answer as a donor capture of the same board and driver answered them, slow-set calls
  from the donor's slow ticks into the base's slow ticks; the base's own answers stay.
* ``between(start, end)`` — only the ticks recorded in ``[start, end)`` (epoch seconds), numbered
  from 0, the init block kept: one workload phase of a capture (the H2D copy phase), to be
  ``repeat``-ed into a long run of that phase.
* ``scale_gpm(metric_ids, factor)`` — the recorded GPM outputs of those metrics times ``factor``
  (a card carrying a fraction of the recorded PCIe traffic; 0: none at all).

Transformations are lazy: each returns ticks that are computed as they are read, tick by tick,
and can be read again when their input can (a list, or another transformation's output). Long
and wide captures (8 GPUs × 4 h from the 76-tick H200 capture) therefore cost the memory of a
tick, not of the capture; only ``repeat`` keeps its input's ticks (one pass) in memory, so put
it first. ``between``, ``scale_gpm`` and ``graft`` build their ticks at once (short captures).
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from vgpumon.sources.nvml.capture import ReplayBackend, iter_capture
from vgpumon.sources.nvml.shapes import CaptureHeader, NvmlAnswer, NvmlArg, Outcome, RecordedCall, Scope, Tick

Ticks = Iterable[Tick]


class _Lazy:
    """Ticks computed on each iteration by ``make`` (re-iterable when ``make``'s input is).
    ``len`` and indexing work too, by reading up to what they need (tests use them)."""

    def __init__(self, make: Callable[[], Iterator[Tick]]) -> None:
        self._make = make

    def __iter__(self) -> Iterator[Tick]:
        return self._make()

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __getitem__(self, i: int) -> Tick:
        if i < 0:
            return list(self)[i]
        try:
            return next(itertools.islice(self, i, None))
        except StopIteration:
            raise IndexError(i) from None


def load(path: str | Path) -> tuple[CaptureHeader, Ticks]:
    """Open a capture as ``(header, ticks)`` for transformation; ticks are read from the file
    each time they are iterated."""
    header, _ = iter_capture(path)
    return header, _Lazy(lambda: iter_capture(path)[1])


def bus_id(index: int, n: int = 8) -> str:
    """The PCI bus id ``replicate_devices`` gives device ``index`` of ``n`` (NVML form)."""
    return f"00000000:{bus_number(index, n):02X}:00.0"


def bus_number(index: int, n: int) -> int:
    """PCI bus of replicated device ``index`` of ``n``: 0x18, 0x28, …; beyond 15 devices 0x1c,
    0x24, … (0x08 apart, so that 16 fit the 8-bit bus number; never ending in 0 or 1, the buses
    ``vgpumon.testing.sysfs.switch_tree`` gives its switch ports)."""
    return 0x18 + index * 0x10 if n <= 15 else 0x1C + index * 0x08


def _relabel(fn: str, value: NvmlAnswer, index: int, n: int) -> NvmlAnswer:
    if fn == "nvmlDeviceGetUUID":
        return f"GPU-00000000-0000-4000-8000-{index:012d}"
    if fn == "nvmlDeviceGetSerial":
        return f"{index:013d}"
    if fn == "nvmlDeviceGetPciInfo" and isinstance(value, dict):
        bus = bus_id(index, n)
        return {**value, "busId": bus, "busIdLegacy": bus[4:], "bus": bus_number(index, n)}
    return value


def _ts(tick: Tick) -> float:
    """A tick's time; only the init block (``tick == -1``) has none."""
    ts = tick["ts"]
    assert ts is not None, f"tick {tick['tick']} has no time"
    return ts


def _per_tick(ticks: Ticks, fn: Callable[[Tick], Tick]) -> Ticks:
    return _Lazy(lambda: (fn(t) for t in ticks))


def replicate_devices(header: CaptureHeader, ticks: Ticks, n: int) -> tuple[CaptureHeader, Ticks]:
    """Answer every call of device 0 for devices ``0..n-1`` (see module docstring)."""

    def one(tick: Tick) -> Tick:
        calls: list[RecordedCall] = []
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
        return {**tick, "calls": calls}

    return {**header, "derived": f"replicate_devices({n})"}, _per_tick(ticks, one)


def fail_call(
    header: CaptureHeader, ticks: Ticks, fn: str, code: int, *, from_tick: int = 0, until_tick: int | None = None,
    devices: Iterable[int] | None = None,
) -> tuple[CaptureHeader, Ticks]:
    """Make ``fn`` (``"*"`` = every device call) answer error ``code`` on ``devices`` for ticks
    ``from_tick <= tick < until_tick``."""
    devs = None if devices is None else set(devices)

    def one(tick: Tick) -> Tick:
        active = tick["tick"] >= from_tick and (until_tick is None or tick["tick"] < until_tick)
        calls: list[RecordedCall] = []
        for scope, f, args, kwargs, outcome in tick["calls"]:
            device_match = scope != "sys" and fn == "*" and (devs is None or scope in devs)
            named_match = f == fn and (scope == "sys" or devs is None or scope in devs)
            if active and (device_match or named_match):
                outcome = {"e": code}
            calls.append([scope, f, args, kwargs, outcome])
        return {**tick, "calls": calls}

    return {**header, "derived": f"{header.get('derived', '')} fail_call({fn}, {code}, {from_tick})".strip()}, _per_tick(ticks, one)


def repeat(header: CaptureHeader, ticks: Ticks, times: int) -> tuple[CaptureHeader, Ticks]:
    """The ticks ``times`` times in a row (see module docstring); one pass of the input is kept
    in memory, the passes are made as they are read."""
    everything = list(ticks)
    body = [t for t in everything if t["tick"] >= 0]
    init = [t for t in everything if t["tick"] < 0]
    if not body:
        return header, everything
    span = _ts(body[-1]) - _ts(body[0]) + (_ts(body[1]) - _ts(body[0]) if len(body) > 1 else 1.0)

    def passes() -> Iterator[Tick]:
        yield from init
        for k in range(times):
            for t in body:
                yield {**t, "tick": k * len(body) + t["tick"], "ts": _ts(t) + k * span}

    return {**header, "derived": f"{header.get('derived', '')} repeat({times})".strip()}, _Lazy(passes)


def then(header: CaptureHeader, ticks: Ticks, more: Ticks) -> tuple[CaptureHeader, Ticks]:
    """``ticks``, then the ticks of ``more`` (its init block dropped): its times moved to follow
    on one tick interval after the last, its tick numbers continued."""
    first = list(ticks)
    body = [t for t in first if t["tick"] >= 0]
    rest = [t for t in more if t["tick"] >= 0]
    if not body or not rest:
        return header, first + rest
    step = _ts(body[-1]) - _ts(body[-2]) if len(body) > 1 else 1.0
    dt = _ts(body[-1]) + step - _ts(rest[0])
    n = body[-1]["tick"] + 1 - rest[0]["tick"]
    moved: list[Tick] = [{**t, "tick": t["tick"] + n, "ts": _ts(t) + dt} for t in rest]
    return {**header, "derived": f"{header.get('derived', '')} then".strip()}, first + moved


def retime(header: CaptureHeader, ticks: Ticks, factor: float) -> tuple[CaptureHeader, Ticks]:
    """Every tick's timestamp (and the XID event times it carries) scaled by ``factor`` around
    the first tick's: ``factor`` 0.1 replays at recorded pace ten times faster."""

    def make() -> Iterator[Tick]:
        t0: float | None = None
        for tick in ticks:
            if t0 is None and tick["ts"] is not None:
                t0 = tick["ts"]

            def at(ts: float) -> float:
                return t0 + (ts - t0) * factor  # type: ignore[operator]  # noqa: B023  t0 is set once, before the first tick, and never changes

            calls: list[RecordedCall] = []
            for scope, fn, args, kwargs, outcome in tick["calls"]:
                if fn == "xid_poll" and isinstance(outcome.get("v"), list):
                    outcome = {"v": [{**e, "ts": at(e["ts"])} for e in outcome["v"]]}
                calls.append([scope, fn, args, kwargs, outcome])
            yield {**tick, "ts": at(tick["ts"]) if tick["ts"] is not None else None, "calls": calls}

    return {**header, "derived": f"{header.get('derived', '')} retime({factor})".strip()}, _Lazy(make)


def shift(header: CaptureHeader, ticks: Ticks, seconds: float) -> tuple[CaptureHeader, Ticks]:
    """Every tick's timestamp (and the XID event times it carries) moved by ``seconds``: a
    capture made to end at a chosen moment (data an hour old for the freshness tests)."""

    def make() -> Iterator[Tick]:
        for tick in ticks:
            calls: list[RecordedCall] = []
            for scope, fn, args, kwargs, outcome in tick["calls"]:
                if fn == "xid_poll" and isinstance(outcome.get("v"), list):
                    outcome = {"v": [{**e, "ts": e["ts"] + seconds} for e in outcome["v"]]}
                calls.append([scope, fn, args, kwargs, outcome])
            yield {**tick, "ts": tick["ts"] + seconds if tick["ts"] is not None else None, "calls": calls}

    return {**header, "derived": f"{header.get('derived', '')} shift({seconds:+.0f} s)".strip()}, _Lazy(make)


def set_call(
    header: CaptureHeader,
    ticks: Ticks,
    scope: Scope,
    fn: str,
    outcome: Outcome,
    *,
    at: Iterable[int],
    args: Sequence[NvmlArg] = (),
    kwargs: dict[str, NvmlArg] | None = None,
) -> tuple[CaptureHeader, Ticks]:
    """Make call ``(scope, fn, args, kwargs)`` answer ``outcome`` in ticks ``at`` (``-1`` is the
    init block); the recorded answer is replaced, or the answer added if the tick had none."""
    wanted = set(at)
    kwargs = kwargs or {}

    def one(tick: Tick) -> Tick:
        calls = [list(c) for c in tick["calls"]]
        if tick["tick"] in wanted:
            hits = [c for c in calls if c[0] == scope and c[1] == fn and list(c[2]) == list(args) and c[3] == kwargs]
            for c in hits:
                c[4] = copy.deepcopy(outcome)
            if not hits:
                calls.append([scope, fn, list(args), dict(kwargs), copy.deepcopy(outcome)])
        return {**tick, "calls": calls}

    return {**header, "derived": f"{header.get('derived', '')} set_call({scope}, {fn})".strip()}, _per_tick(ticks, one)


def edit_call(
    header: CaptureHeader,
    ticks: Ticks,
    scope: Scope,
    fn: str,
    edit: Callable[[NvmlAnswer], NvmlAnswer],
    *,
    at: Iterable[int],
    args: Sequence[NvmlArg] = (),
    kwargs: dict[str, NvmlArg] | None = None,
) -> tuple[CaptureHeader, Ticks]:
    """Pass the recorded value of call ``(scope, fn, args, kwargs)`` through ``edit`` in ticks
    ``at``; ticks where the call was not made or answered an error are left alone."""
    wanted = set(at)
    kwargs = kwargs or {}

    def one(tick: Tick) -> Tick:
        calls = [list(c) for c in tick["calls"]]
        if tick["tick"] in wanted:
            for c in calls:
                if c[0] == scope and c[1] == fn and list(c[2]) == list(args) and c[3] == kwargs and "v" in c[4]:
                    c[4] = {"v": edit(copy.deepcopy(c[4]["v"]))}
        return {**tick, "calls": calls}

    return {**header, "derived": f"{header.get('derived', '')} edit_call({scope}, {fn})".strip()}, _per_tick(ticks, one)


def is_slow_tick(tick: Tick) -> bool:
    """True when the tick read the slow set: every slow tick reads the ECC totals
    (``vgpumon.sources.nvml``), no fast tick does."""
    return any(c[1] == "nvmlDeviceGetTotalEccErrors" for c in tick["calls"])


def graft(
    header: CaptureHeader, ticks: Ticks, donor_header: CaptureHeader, donor_ticks: Ticks
) -> tuple[CaptureHeader, Ticks]:
    """Add to each tick the donor's answers to calls the tick lacks (see module docstring).

    A base slow tick takes them from the donor's slow ticks, a fast tick from its fast ticks, in
    turn; the init block from the donor's init block. A call is matched by scope, function and
    arguments, so a recorded answer is never replaced.
    """

    def key(c: RecordedCall) -> str:
        return json.dumps(c[:4], sort_keys=True)

    donor_init = [t for t in donor_ticks if t["tick"] < 0]
    pools = {kind: [t for t in donor_ticks if t["tick"] >= 0 and is_slow_tick(t) == kind] for kind in (True, False)}
    turn = {True: 0, False: 0}
    out: list[Tick] = []
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


def delay_call(
    header: CaptureHeader,
    ticks: Ticks,
    scope: Scope,
    fn: str,
    seconds: float,
    *,
    at: Iterable[int],
    args: Sequence[NvmlArg] = (),
    kwargs: dict[str, NvmlArg] | None = None,
) -> tuple[CaptureHeader, Ticks]:
    """Make call ``(scope, fn, args, kwargs)`` take ``seconds`` in ticks ``at`` (its recorded
    answer, late): a wedged driver call, which replay reproduces by blocking that long."""
    wanted = set(at)
    kwargs = kwargs or {}

    def one(tick: Tick) -> Tick:
        calls = [list(c) for c in tick["calls"]]
        if tick["tick"] in wanted:
            for c in calls:
                if c[0] == scope and c[1] == fn and list(c[2]) == list(args) and c[3] == kwargs:
                    c[4] = {**c[4], "d": seconds}
        return {**tick, "calls": calls}

    return {**header, "derived": f"{header.get('derived', '')} delay_call({scope}, {fn}, {seconds})".strip()}, _per_tick(ticks, one)


def between(header: CaptureHeader, ticks: Ticks, start: float, end: float) -> tuple[CaptureHeader, Ticks]:
    """The ticks recorded in ``[start, end)``, renumbered from 0, with the init block (see module
    docstring)."""
    init = [t for t in ticks if t["tick"] < 0]
    body = [t for t in ticks if t["tick"] >= 0 and start <= _ts(t) < end]
    renumbered: list[Tick] = [{**t, "tick": k} for k, t in enumerate(body)]
    return {**header, "derived": f"{header.get('derived', '')} between({start}, {end})".strip()}, init + renumbered


def scale_gpm(header: CaptureHeader, ticks: Ticks, metric_ids: Iterable[int], factor: float) -> tuple[CaptureHeader, Ticks]:
    """Every recorded GPM output of ``metric_ids`` (on every device) times ``factor``."""
    ids = {str(m) for m in metric_ids}
    out: list[Tick] = []
    for tick in ticks:
        calls: list[RecordedCall] = []
        for scope, fn, args, kwargs, outcome in tick["calls"]:
            if fn == "gpm" and isinstance(outcome.get("v"), dict):
                outcome = {"v": {k: (v * factor if k in ids and isinstance(v, (int, float)) else v) for k, v in outcome["v"].items()}}
            calls.append([scope, fn, args, kwargs, outcome])
        out.append({**tick, "calls": calls})
    return {**header, "derived": f"{header.get('derived', '')} scale_gpm({sorted(ids)}, {factor})".strip()}, out


def backend(header: CaptureHeader, ticks: Ticks) -> ReplayBackend:
    """A replay backend over transformed ticks (read as the replay goes)."""
    return ReplayBackend(header=header, ticks=ticks)


def write(path: str | Path, header: CaptureHeader, ticks: Ticks) -> None:
    """Write a (transformed) capture to a file that ``vgpumon agent --replay`` reads."""
    from vgpumon.sources.nvml.capture import _open_text

    with _open_text(Path(path), "w") as f:
        f.write(json.dumps(header) + "\n")
        for tick in ticks:
            f.write(json.dumps(tick, separators=(",", ":")) + "\n")
