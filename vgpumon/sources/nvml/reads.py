"""The choke point every NVML read passes (``_Reader``: one device's calls in one tick, errors
remembered, values checked at the door) and the general reads of the fast set's calls."""

from __future__ import annotations

import threading
from typing import Protocol, TypeAlias

from vgpumon.base.pcie import link_capacity_bytes_per_second
from vgpumon.catalogue import Door, Rejected
from vgpumon.catalogue.door import _PLAIN_HI, _PLAIN_LO, _SENTINEL_FLOOR, sentinel
from vgpumon.model import GpuIdentity
from vgpumon.sources.nvml.backend import NvmlBackend, NvmlCallError
from vgpumon.sources.nvml.constants import (
    _PERMANENT,
    NVML_CLOCK_MEM,
    NVML_CLOCK_SM,
    NVML_TEMPERATURE_GPU,
    PID_MAX,
    Abandoned,
    DeviceDown,
)
from vgpumon.sources.nvml.fastcalls import _NOT_AVAILABLE_U64, BoundCall, CStruct
from vgpumon.sources.nvml.shapes import NvmlAnswer, NvmlArg

#: A sample's field values as the reads fill them (field name → the value the door admitted: a
#: number or flag, a tuple of processes, the activity source's name), for ``GpuSample.of``.
SampleValues: TypeAlias = dict[str, object]
#: A call as the "not supported" cache keys it: ``(function, args, kwargs items)``.
CallKey: TypeAlias = tuple[str, tuple[NvmlArg, ...], tuple[tuple[str, NvmlArg], ...]]
#: ``(field, function, args, base units per NVML unit)`` of each plain getter ``scalars`` reads.
ScalarPlan: TypeAlias = tuple[tuple[str, str, tuple[int, ...], float], ...]

#: No NVML answer is wider than 64 bits: a larger integer (a capture's, edited) goes to the door,
#: which refuses it, instead of overflowing a float here.
_NVML_MAX = 1 << 64


def number_of(v: SampleValues, field: str, default: float | None = None) -> float | None:
    """``v[field]`` where the door admitted a number there, else ``default``."""
    x = v.get(field, default)
    return x if isinstance(x, (int, float)) else default


class _SourceParts(Protocol):
    """What the reads and the fast path call back of ``NvmlSource`` (a protocol: they sit below
    it, and ``NvmlSource`` satisfies it)."""

    backend: NvmlBackend
    _mem_api: dict[int, str]

    def _unwedge(self, index: int, fn: str) -> None: ...

    def _gpm_failed(self, r: _Reader, exc: NvmlCallError) -> None: ...

    def _memory(self, r: _Reader, gpu: GpuIdentity, v: SampleValues) -> None: ...

    def _processes(self, r: _Reader, v: SampleValues) -> None: ...

    def _utilization(self, r: _Reader, v: SampleValues) -> None: ...


class _Watch:
    """What the sampling thread is doing now, for the agent's per-device deadline.

    ``device``/``since`` name the device being read and since when (monotonic); ``fn`` the NVML
    call in flight. ``generation`` changes when the agent abandons a stuck thread: a reader of an
    older generation that gets its call back stops (``returned`` records how long it hung)."""

    def __init__(self, source: "_SourceParts") -> None:
        self.source = source
        self.generation = 0
        self.device: int | None = None
        self.fn = ""
        self.since = 0.0
        #: held while the agent decides to abandon a read, and while the sampling thread ends
        #: one: a read that ends as it is abandoned is either finished or abandoned, never both
        self.lock = threading.Lock()

    def returned(self, index: int, fn: str) -> None:
        self.source._unwedge(index, fn)
        raise Abandoned(f"GPU {index}: {fn} returned after the tick was given up")

class _Unsupported(set[CallKey]):
    """The calls (``(fn, args, kwargs)`` keys) a device answered "not supported", with the set of
    their function names beside them: a call whose function has no entry is asked without
    building its key (most calls, every tick)."""

    def __init__(self) -> None:
        super().__init__()
        self.fns: set[str] = set()
        self.version = 0  # changes with every add and clear: a reader built on the set rebuilds

    def add(self, key: CallKey) -> None:
        super().add(key)
        self.fns.add(key[0])
        self.version += 1

    def clear(self) -> None:
        super().clear()
        self.fns.clear()
        self.version += 1

class _Reader:
    """The choke point: one device, one tick. Collects values and reasons for ``None``.

    Every value goes through the catalogue's door (``put``): a reading that is not a number, is
    NaN/±Inf, a blank sentinel or outside its field's range becomes ``None`` with a
    ``rejected: …`` reason and is counted.
    """

    __slots__ = (
        "backend", "index", "unsupported", "door", "rejected", "missing", "pcie_limit", "memory_limit", "watch", "generation",
        "calls", "bound", "gpu", "spec",
    )

    def __init__(
        self,
        backend: NvmlBackend,
        index: int,
        unsupported: _Unsupported,
        door: Door,
        gpu: GpuIdentity | None = None,
        watch: "_Watch | None" = None,
        calls: dict[str, BoundCall] | None = None,
    ) -> None:
        self.backend = backend
        self.calls = calls or {}  # LiveBackend.bound_calls: the per-tick calls without dispatch
        self.bound = calls
        self.gpu = gpu
        self.index = index
        self.unsupported = unsupported
        self.door = door
        self.spec = door.numeric_spec
        self.watch = watch
        self.generation = watch.generation if watch is not None else 0
        self.rejected = door.rejected
        self.missing: dict[str, str] = {}
        # Device bounds (catalogue ``Field.limit``): a PCIe rate above 1.25 × the max link's
        # capacity, or memory above the GPU's total, is not a reading.
        capacity = None if gpu is None else link_capacity_bytes_per_second(gpu.pcie_link_gen_max, gpu.pcie_link_width_max)
        self.pcie_limit = None if capacity is None else 1.25 * capacity
        self.memory_limit = None if gpu is None else gpu.memory_total_bytes

    def q(self, field: str, fn: str, *args: NvmlArg, **kwargs: NvmlArg) -> NvmlAnswer:
        """Call ``fn`` for this device; ``None`` (reason in ``missing[field]``) on field errors.

        Raises:
            DeviceDown: on a lifecycle error (GPU lost, reset required, driver gone, ...).
        """
        unsupported = self.unsupported
        if fn in unsupported.fns and (fn, args, tuple(kwargs.items())) in unsupported:
            self.missing[field] = "not supported"
            return None
        watch = self.watch
        if watch is not None:
            watch.fn = fn
        call = self.calls.get(fn)
        try:
            if call is not None:
                value = call(*args, **kwargs)
            else:
                value = self.backend.device(self.index, fn, *args, **kwargs)
        except NvmlCallError as exc:
            self._failed(field, fn, (fn, args, tuple(kwargs.items())), exc)
            return None
        if watch is not None and watch.generation != self.generation:
            watch.returned(self.index, fn)  # this thread was given up on while the call hung
        return value

    def _failed(self, field: str, fn: str, key: CallKey, exc: NvmlCallError) -> None:
        """A call answered with an error: a thread given up on stops, a lifecycle error takes the
        device down, a permanent one is remembered under ``key``, any other is this tick's reason.

        Raises:
            DeviceDown: on a lifecycle error.
        """
        watch = self.watch
        if watch is not None and watch.generation != self.generation:
            watch.returned(self.index, fn)
        if exc.is_lifecycle:
            raise DeviceDown(exc) from None
        if exc.code in _PERMANENT:
            self.unsupported.add(key)
        self.missing[field] = exc.reason

    def put(self, field: str, raw: NvmlAnswer, v: SampleValues, scale: float = 1.0, limit: float | None = None) -> None:
        """Admit ``raw`` (NVML's unit) × ``scale`` as ``v[field]``; ``None`` stays absent (its
        reason was set by ``q``); an impossible value is left out with its reason."""
        if raw is None:
            return
        # The door's own common path, inlined (this runs ~20 times per GPU per tick): a plain
        # number, not a sentinel, inside the field's range. Anything else — text, bool, NaN,
        # ±Inf, a sentinel, out of range, a fraction in a whole-number field — goes through
        # ``Door.value``, which decides, counts and says why.
        cls = raw.__class__
        spec = self.spec.get(field)
        if (cls is float or (cls is int and -_NVML_MAX < raw < _NVML_MAX)) and spec is not None and (
            raw < _SENTINEL_FLOOR or _PLAIN_LO < raw < _PLAIN_HI or not sentinel(raw)
        ):
            x = raw * scale if scale != 1.0 else raw
            lo, hi, integral, flag = spec
            if lo <= x <= hi and (limit is None or x <= limit * (1 + 1e-6)):
                if flag:
                    v[field] = bool(x)
                    return
                if not integral:
                    v[field] = float(x)
                    return
                if x == int(x):
                    v[field] = int(x)
                    return
        try:
            v[field] = self.door.value(field, raw, scale, limit)
        except Rejected as exc:
            self.missing[field] = exc.reason

    def scalars(self, plan: ScalarPlan, v: SampleValues) -> None:
        """``put(field, q(field, fn, *args), v, scale)`` for each ``(field, fn, args, scale)`` of
        ``plan``, in one loop: the fast set's plain getters without two Python calls each.

        Raises:
            DeviceDown: on a lifecycle error.
        """
        calls, watch, generation = self.calls, self.watch, self.generation
        fns = self.unsupported.fns
        for field, fn, args, scale in plan:
            call = calls.get(fn)
            if call is None or fn in fns:
                self.put(field, self.q(field, fn, *args), v, scale)
                continue
            if watch is not None:
                watch.fn = fn
            try:
                raw = call(*args)
            except NvmlCallError as exc:
                self._failed(field, fn, (fn, args, ()), exc)
                continue
            if watch is not None and watch.generation != generation:
                watch.returned(self.index, fn)  # this thread was given up on while the call hung
            self.put(field, raw, v, scale)

    def field_value(self, field: str, field_id: int) -> NvmlAnswer:
        """One ``nvmlDeviceGetFieldValues`` id. The call succeeds when *any* entry was filled, so
        the entry's own return code decides: NOT_SUPPORTED there is ``None`` (remembered like a
        call that is not supported), never the zeroed value beside it.

        Raises:
            DeviceDown: the entry says the device is gone.
        """
        key: CallKey = ("nvmlDeviceGetFieldValues", ((field_id,),), ())
        answer = self.q(field, "nvmlDeviceGetFieldValues", (field_id,))
        entry = answer[0] if isinstance(answer, list) and answer else answer
        ret = self.get(field, entry, "nvmlReturn")
        if ret is None:
            return None
        if ret != 0:
            exc = NvmlCallError(int(ret), "nvmlDeviceGetFieldValues")
            if exc.is_lifecycle:
                raise DeviceDown(exc)
            if exc.code in _PERMANENT:
                self.unsupported.add(key)
            self.missing[field] = exc.reason
            return None
        return self.get(field, entry, "value")

    def get(self, field: str, answer: NvmlAnswer, key: str) -> NvmlAnswer:
        """``answer[key]`` of a struct answer (a dict), or ``None`` with a reason when the
        answer is not the struct NVML defines (a binding/driver mismatch)."""
        if isinstance(answer, dict) and key in answer:
            return answer[key]
        if answer is not None:
            self.missing[field] = f"rejected: malformed answer {str(answer)[:40]!r}"
            self.rejected[field] += 1
        return None

#: The fast set's plain getters: (field, nvidia-ml-py function, its arguments, base units per
#: NVML unit). ``_Reader.scalars`` reads them in one loop.
_FAST_SCALARS: ScalarPlan = (
    ("temperature_celsius", "nvmlDeviceGetTemperature", (NVML_TEMPERATURE_GPU,), 1.0),
    ("power_watts", "nvmlDeviceGetPowerUsage", (), 1e-3),
    ("sm_clock_hertz", "nvmlDeviceGetClockInfo", (NVML_CLOCK_SM,), 1e6),
    ("memory_clock_hertz", "nvmlDeviceGetClockInfo", (NVML_CLOCK_MEM,), 1e6),
    ("clocks_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons", (), 1.0),
    ("fan_speed_ratio", "nvmlDeviceGetFanSpeed", (), 0.01),
    ("pcie_link_gen_current", "nvmlDeviceGetCurrPcieLinkGeneration", (), 1.0),
    ("pcie_link_width_current", "nvmlDeviceGetCurrPcieLinkWidth", (), 1.0),
)

_PSTATE_CALL = ("nvmlDeviceGetPerformanceState", ())

#: every plain-getter call of the straight-line path, as ``(function, args)``
_FAST_CALLS = (*((fn, args) for _, fn, args, _ in _FAST_SCALARS), _PSTATE_CALL)

def _admit_processes(r: _Reader, v: SampleValues, procs: list[tuple[NvmlAnswer, NvmlAnswer]]) -> None:
    """``v["processes"]`` from ``(pid, usedGpuMemory)`` pairs of a compute-process list: the
    whole list is refused when a PID cannot be one (nvidia-ml-py's struct layout and the driver's
    disagree: PIDs read as 0 / 4294967295 in a pattern); a process's memory figure outside its
    range costs only that figure (the process stays listed)."""
    if any(pid.__class__ is not int or pid <= 0 or pid > PID_MAX for pid, _ in procs):
        r.missing["processes"] = "garbage PIDs: nvidia-ml-py and driver disagree on the process struct"
        r.rejected["processes"] += 1
        return
    out = []
    limit = number_of(v, "memory_total_bytes", r.memory_limit)
    for pid, used in procs:
        if used is not None:
            one: SampleValues = {}
            r.put("used_gpu_memory_bytes", used, one, limit=limit)
            if "used_gpu_memory_bytes" not in one:  # this process's figure only; it stays listed
                r.missing["used_gpu_memory_bytes"] = f"{r.missing['used_gpu_memory_bytes']} (pid {pid})"
            used = one.get("used_gpu_memory_bytes")
        out.append((pid, used))
    v["processes"] = tuple(out)

def _procs_of(arr: CStruct, n: int) -> list[tuple[NvmlAnswer, NvmlAnswer]]:
    """``(pid, usedGpuMemory or None)`` of the first ``n`` v3 process structs of ``arr``."""
    procs = []
    for i in range(n):
        p = arr[i]
        used = p.usedGpuMemory
        procs.append((p.pid, None if used == _NOT_AVAILABLE_U64 else used))
    return procs

#: Calls the straight-line path makes on every tick, whatever the "not supported" cache holds
#: (the plain getters and the HBM temperature are left out of its plan when cached): while one
#: of them is cached, the general path serves the device.
_ALWAYS_ASKED = frozenset({"nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates",
                           "nvmlDeviceGetPerformanceState", "nvmlDeviceGetComputeRunningProcesses"})
