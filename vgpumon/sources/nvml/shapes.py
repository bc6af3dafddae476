"""The shapes of the plain data that crosses the NVML backend interface and fills a capture.

A capture is JSON Lines (``vgpumon.sources.nvml.backend``'s docstring has the format): a header
object, then one object per tick whose ``calls`` are ``[scope, function, args, kwargs, outcome]``.
"""

from __future__ import annotations

import ctypes
from typing import Any, TypeAlias, TypedDict, Union

#: A JSON value as ``json.loads`` returns it, before anything has checked what it is.
JsonValue: TypeAlias = Union[None, bool, int, float, str, list["JsonValue"], dict[str, "JsonValue"]]

#: An NVML answer as plain data (``int``, ``float``, ``str``, ``None``, lists, dicts of struct
#: fields). Its type is the function's: an ``int`` from ``nvmlDeviceGetPowerUsage``, a dict from
#: ``nvmlDeviceGetMemoryInfo_v2``, so only the caller, who named the function, knows it and reads
#: it as such. ``Any`` on purpose: a union would make every caller re-check what it asked for.
NvmlAnswer: TypeAlias = Any

#: An argument of an NVML call (an int, an enum's int, a list of field ids): the backend passes
#: it on to NVML and a recording writes it to the capture as JSON, neither looking inside.
NvmlArg: TypeAlias = object

#: A device's ``nvmlDevice_t`` (nvidia-ml-py's ``c_nvmlDevice_t``, a pointer to an opaque struct).
NvmlHandle: TypeAlias = "ctypes._Pointer[ctypes.Structure]"

#: Where a call was made: ``"sys"`` or a device index.
Scope: TypeAlias = str | int

#: One recorded call, ``[scope, function, args, kwargs, outcome]``: a JSON array of five values
#: of different types, which no list type can say (``capture._shape_error`` checks each); read
#: by unpacking, as ``Scope``, ``str``, ``list``, ``dict`` and ``Outcome``.
RecordedCall: TypeAlias = list[Any]


class Outcome(TypedDict, total=False):
    """A call's outcome in a capture: ``{"v": value}`` or ``{"e": code}``, with ``"d"``, its
    duration in seconds, when it took 1 ms or more."""

    v: NvmlAnswer
    e: int
    d: float


class Tick(TypedDict):
    """One capture line after the header: the init block (``tick == -1``) or one tick."""

    tick: int
    ts: float | None
    calls: list[RecordedCall]


class CaptureHeader(TypedDict, total=False):
    """A capture's first line. ``vgpumon_capture`` (the format version) is always there; the
    rest as the recording (``vgpumon record``'s ``meta``) or a derivation (``derived``) set it."""

    vgpumon_capture: int
    created: str
    host: str
    masked: bool
    interval_s: float
    slow_every: int
    vgpumon: str
    derived: str


class RawXid(TypedDict):
    """An XID event from ``NvmlBackend.xid_poll``; ``index`` is ``None`` for a device the event
    set could not place."""

    index: int | None
    xid: int
    ts: float


class PcieReading(TypedDict):
    """The latest ``nvmlDeviceGetPcieThroughput`` pair of a device (KB = 1000 bytes per second)."""

    tx_KBps: int
    rx_KBps: int
    ts: float

