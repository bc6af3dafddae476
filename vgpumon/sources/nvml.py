"""The NVML collector: reads every GPU each tick through one choke point.

Cadence by measured cost (FACTS §1, H200, driver 580): the fast set (GPM pair, memory v2,
utilization, temperature, power, clocks, clocks-event reasons, performance state, current PCIe
link, processes) costs a few hundred µs per GPU and runs every tick; the slow set (ECC counters by
type and location, remapped rows, power limit, persistence and compute modes) runs every
``slow_every`` ticks; the minute set (energy, violation times, BAR1, PCIe replay counter, MIG mode:
calls that keep the driver busy for 0.2–3.3 ms of CPU each, on counters or facts that rarely
change) on the first slow tick at least ``MINUTE_SECONDS`` after its last read; static facts
are read at start and after a
re-initialisation. ``nvmlDeviceGetPcieThroughput`` (21 ms, blocking)
is never called on the sampling thread: with GPM, PCIe bytes/s come from GPM averaged over the
whole tick; without GPM the backend polls the throughput call on a thread of its own.

Every call goes through ``_Reader.q``:

* a field-level error (not supported, no permission, function not found, not in capture) makes
  that field ``None`` with a reason; "not supported" and "function not found" are remembered per
  device so the call is not retried every tick;
* a device lifecycle error (GPU lost, reset required, GPU not found, unknown) marks that device
  down; it is retried with exponential back-off in ticks (1, 2, 4, … ``max_backoff_ticks``) and
  comes back by itself;
* a library lifecycle error (uninitialized, driver not loaded, library/driver version mismatch)
  marks NVML down for the host; it is re-initialised with the same back-off and the static facts
  are read again;
* every value passes the field catalogue's door (``vgpumon.catalogue.Door``): a non-number
  (``"[N/A]"``), NaN, ±Inf, a blank sentinel (4294967295, DCGM's 2147483632 or
  9223372036854775794) or a value outside the field's range (temperature 644245923, a PCIe rate
  above 1.25 × the link's capacity) is ``None`` with a ``rejected: …`` reason, counted per field.
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
import time
from collections import Counter, deque
from dataclasses import replace
from typing import Any, Callable

from vgpumon import catalogue
from vgpumon.base.errors import NvmlUnavailableError
from vgpumon.base.pcie import link_capacity_bytes_per_second
from vgpumon.catalogue import Door, Rejected
from vgpumon.catalogue.door import _PLAIN_HI, _PLAIN_LO, _SENTINEL_FLOOR, sentinel
from vgpumon.model import GpuIdentity, GpuSample, HostEvent, NvmlReading, SourceStatus, XidEvent
from vgpumon.sources.nvml_backend import (
    ERROR_NAMES,
    NOT_IN_CAPTURE,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNINITIALIZED,
    LiveBackend,
    NvmlBackend,
    NvmlCallError,
)
from vgpumon.sources.nvml_fast import _INSUFFICIENT_SIZE, _NOT_AVAILABLE_U64
from vgpumon.sources.nvml_plain import _VALUE_MEMBERS as _FV_MEMBERS

log = logging.getLogger(__name__)

# pynvml constants, repeated so that the collector does not need pynvml to replay a capture.
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1  # nvml.h nvmlTemperatureThresholds_t
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_MEMORY_LOCATION_DRAM = 2
NVML_MEMORY_LOCATION_SRAM = 7
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_PERF_POLICY_POWER = 0
NVML_PERF_POLICY_THERMAL = 1
NVML_FI_DEV_MEMORY_TEMP = 82  # nvml.h field id: HBM temperature, °C
NVML_MEMORY_V2 = 0x02000028  # pynvml.nvmlMemory_v2: sizeof(nvmlMemory_v2_t) | 2 << 24

# GPM metric ids (nvml.h nvmlGpmMetricId_t); values are percent or MiB/s.
GPM_SM_UTIL = 2
GPM_SM_OCCUPANCY = 3
GPM_ANY_TENSOR_UTIL = 5
GPM_DRAM_BW_UTIL = 10
GPM_PCIE_TX_PER_SEC = 20
GPM_PCIE_RX_PER_SEC = 21
GPM_METRICS = (
    GPM_SM_UTIL,
    GPM_SM_OCCUPANCY,
    GPM_ANY_TENSOR_UTIL,
    GPM_DRAM_BW_UTIL,
    GPM_PCIE_TX_PER_SEC,
    GPM_PCIE_RX_PER_SEC,
)
_MIB = 1 << 20
_GPM_FIELDS = {
    GPM_SM_UTIL: "sm_active_ratio",
    GPM_SM_OCCUPANCY: "sm_occupancy_ratio",
    GPM_ANY_TENSOR_UTIL: "tensor_active_ratio",
    GPM_DRAM_BW_UTIL: "dram_active_ratio",
    GPM_PCIE_TX_PER_SEC: "pcie_tx_bytes_per_second",
    GPM_PCIE_RX_PER_SEC: "pcie_rx_bytes_per_second",
}
_GPM_PCIE = frozenset({GPM_PCIE_TX_PER_SEC, GPM_PCIE_RX_PER_SEC})
#: ``nvmlDeviceGetPerformanceState`` when the driver does not know the P-state.
NVML_PSTATE_UNKNOWN = 32
#: Largest PID Linux can hand out (``pid_max`` limit, 2**22); anything above is not a PID.
PID_MAX = 4_194_304
#: A difference this large between the wall clock's and the monotonic clock's advance over one
#: tick is a wall-clock step (NTP stepping, a VM resuming), not scheduling jitter.
CLOCK_STEP_SECONDS = 2.0
#: GPM PCIe cross-check (``NvmlSource._crosscheck``): GPM below this share of the throughput
#: call while the call reads above ``CROSSCHECK_MIN_BPS``, ``CROSSCHECK_STRIKES`` checks in a
#: row, is a collector fault. The call is polled for GPM GPUs every ``CROSSCHECK_POLL_SECONDS``.
CROSSCHECK_RATIO = 0.25
CROSSCHECK_MIN_BPS = 5e9
CROSSCHECK_STRIKES = 3
CROSSCHECK_POLL_SECONDS = 30.0
#: The minute set (catalogue cadence ``minute``) is read on the first slow tick at least this
#: many seconds (tick time, 5 % slack for jitter) after its last read: each minute at the
#: defaults, on every slow tick when those are further apart. Measured on the H200 (bench/nvml_call_cpu.py, CPU per
#: call): ``nvmlDeviceGetTotalEnergyConsumption`` 2.8 ms, ``nvmlDeviceGetViolationStatus`` 0.7 ms
#: per policy, ``nvmlDeviceGetPcieReplayCounter``, ``nvmlDeviceGetBAR1MemoryInfo`` and
#: ``nvmlDeviceGetMigMode`` about 0.17 ms each: 4.7 ms a GPU, at every slow tick 0.05 % of a core,
#: a quarter of the agent's whole CPU budget. Counters lose nothing by being read less often (the
#: energy or violation time over any window is still the difference of two reads); BAR1 and MIG
#: mode change with deployments, not within a minute. The ECC and remapped-row counters, which
#: page someone, stay in the slow set (a few µs each).
MINUTE_SECONDS = 60.0
CROSSCHECK_HISTORY = 64
#: A ``nvmlDeviceGetPcieThroughput`` reading older than this is not used for a tick.
PCIE_THROUGHPUT_MAX_AGE_S = 15.0

# Field-level answers that mean "this device will never answer this": cache them.
_PERMANENT = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND})
_PERMANENT_REASONS = frozenset(ERROR_NAMES[c] for c in _PERMANENT)
# Lifecycle errors of the library (whole host) rather than of one device.
_LIBRARY_DOWN = frozenset({NVML_ERROR_UNINITIALIZED, NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIB_RM_VERSION_MISMATCH})
# At start, these mean "no NVIDIA stack on this host": the agent exits 69 instead of waiting.
_FATAL_AT_START = frozenset({NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED})
_HINTS = {
    NVML_ERROR_LIBRARY_NOT_FOUND: "is the NVIDIA driver installed on this host?",
    NVML_ERROR_DRIVER_NOT_LOADED: "is the nvidia kernel module loaded (nvidia-smi)?",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "the driver was upgraded without a reload: reload the nvidia module or reboot",
}


class DeviceDown(Exception):
    """A lifecycle error on one device; carries the NVML error."""

    def __init__(self, error: NvmlCallError) -> None:
        super().__init__(str(error))
        self.error = error


def _describe(exc: NvmlCallError) -> str:
    hint = _HINTS.get(exc.code)
    return f"{exc.reason} ({hint})" if hint else exc.reason


class Abandoned(Exception):
    """Raised in a sampling thread the agent gave up on (it was stuck in a call): its tick was
    finished by another thread, so it must not touch the source's state any more."""


class _Watch:
    """What the sampling thread is doing now, for the agent's per-device deadline.

    ``device``/``since`` name the device being read and since when (monotonic); ``fn`` the NVML
    call in flight. ``generation`` changes when the agent abandons a stuck thread: a reader of an
    older generation that gets its call back stops (``returned`` records how long it hung)."""

    def __init__(self, source: "NvmlSource") -> None:
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


class _Unsupported(set):
    """The calls (``(fn, args, kwargs)`` keys) a device answered "not supported", with the set of
    their function names beside them: a call whose function has no entry is asked without
    building its key (most calls, every tick)."""

    def __init__(self) -> None:
        super().__init__()
        self.fns: set[str] = set()
        self.version = 0  # changes with every add and clear: a reader built on the set rebuilds

    def add(self, key: tuple[Any, ...]) -> None:
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
        calls: dict[str, Any] | None = None,
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

    def q(self, field: str, fn: str, *args: Any, **kwargs: Any) -> Any:
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

    def _failed(self, field: str, fn: str, key: tuple[Any, ...], exc: NvmlCallError) -> None:
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

    def put(self, field: str, raw: Any, v: dict[str, Any], scale: float = 1.0, limit: float | None = None) -> None:
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
        if (cls is int or cls is float) and spec is not None and (
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

    def scalars(self, plan: tuple[tuple[str, str, tuple[Any, ...], float], ...], v: dict[str, Any]) -> None:
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

    def field_value(self, field: str, field_id: int) -> Any:
        """One ``nvmlDeviceGetFieldValues`` id. The call succeeds when *any* entry was filled, so
        the entry's own return code decides: NOT_SUPPORTED there is ``None`` (remembered like a
        call that is not supported), never the zeroed value beside it.

        Raises:
            DeviceDown: the entry says the device is gone.
        """
        key = ("nvmlDeviceGetFieldValues", ((field_id,),), ())
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

    def get(self, field: str, answer: Any, key: str) -> Any:
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
_FAST_SCALARS: tuple[tuple[str, str, tuple[Any, ...], float], ...] = (
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


def _admit_processes(r: _Reader, v: dict[str, Any], procs: list[tuple[Any, Any]]) -> None:
    """``v["processes"]`` from ``(pid, usedGpuMemory)`` pairs of a compute-process list: the
    whole list is refused when a PID cannot be one (nvidia-ml-py's struct layout and the driver's
    disagree: PIDs read as 0 / 4294967295 in a pattern); a process's memory figure outside its
    range costs only that figure (the process stays listed)."""
    if any(pid.__class__ is not int or pid <= 0 or pid > PID_MAX for pid, _ in procs):
        r.missing["processes"] = "garbage PIDs: nvidia-ml-py and driver disagree on the process struct"
        r.rejected["processes"] += 1
        return
    out = []
    limit = v.get("memory_total_bytes", r.memory_limit)
    for pid, used in procs:
        if used is not None:
            one: dict[str, Any] = {}
            r.put("used_gpu_memory_bytes", used, one, limit=limit)
            if "used_gpu_memory_bytes" not in one:  # this process's figure only; it stays listed
                r.missing["used_gpu_memory_bytes"] = f"{r.missing['used_gpu_memory_bytes']} (pid {pid})"
            used = one.get("used_gpu_memory_bytes")
        out.append((pid, used))
    v["processes"] = tuple(out)


def _procs_of(arr: Any, n: int) -> list[tuple[int, Any]]:
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

#: ``_FastPath._compile``'s code objects by source: plans repeat (each re-probe rebuilds them,
#: identical GPUs share one), so a plan is compiled once
_COMPILED: dict[str, Any] = {}


class _FastPath:
    """One device's fast set in straight-line code, for the live backend: the calls
    ``NvmlSource._sample_device`` makes, GPM included, through the device's own C functions and
    out-structs (``nvml_fast.Parts``), with the door's common path (a plain number inside its
    field's range, not a sentinel) inline and every constant worked out once.

    The calls are made first, each with its arguments built once; every raw answer but the
    process list and GPM's lies in one buffer and is read in one ``unpack_from``; then each
    answer is admitted in the general path's order. Nothing unusual is handled here: a call that
    answered an error goes to the general path for that call (which asks it again and decides:
    not supported, lifecycle, a reason), a value outside its field's range to ``_Reader.put``
    (which decides, counts and says why). So its answers are the general path's
    (tests/test_nvml_fast_path.py), at a fraction of the Python per value (docs/benchmarks.md,
    "Agent footprint"). Built per device; rebuilt when the device's "not supported" cache or
    reader changes.
    """

    def __init__(self, source: "NvmlSource", r: _Reader, gpu: GpuIdentity, parts: Any, gpm: Any) -> None:
        self.source, self.r, self.gpu, self.parts = source, r, gpu, parts
        spec, at, h = r.spec, parts.at, parts.handle
        #: ``backend.gpm_flat`` for a GPM device, else ``None``
        self.gpm = gpm

        def kind(field: str, scale: float) -> tuple[float, float, int]:
            """(lo, hi, how to admit): 0 the raw int, 1 float(x), 2 bool(x), 3 ``_Reader.put``."""
            lo, hi, integral, flag = spec[field]
            how = 2 if flag else (0 if scale == 1.0 else 3) if integral else 1
            return lo, hi, how

        cfn, ref, _ = parts.memory
        head = [("nvmlDeviceGetMemoryInfo", cfn, (h, ref))]
        cfn, ref, _ = parts.utilization
        head.append(("nvmlDeviceGetUtilizationRates", cfn, (h, ref)))
        #: (function, C function, arguments) of each call before GPM and after it
        self.head_calls = tuple(head)
        tail = []
        self.memtemp_unsupported = ("nvmlDeviceGetFieldValues", ((NVML_FI_DEV_MEMORY_TEMP,),), ()) in r.unsupported
        if not self.memtemp_unsupported:
            cfn, _, entry = parts.field_values
            entry[0].fieldId = NVML_FI_DEV_MEMORY_TEMP
            tail.append(("nvmlDeviceGetFieldValues", cfn, (h, ctypes.c_int32(1), entry)))
        self.fv_entry = parts.field_values[2]
        #: admission of each plain getter, in call order: (field, fn, args, scale, place in the
        #: raw answers, lo, hi, how); a getter answered "not supported" is not asked (as ``q``)
        self.scalars: list[tuple[Any, ...]] = []
        self.unsupported: list[str] = []
        for field, fn, args, scale in _FAST_SCALARS:
            if (fn, args, ()) in r.unsupported:
                self.unsupported.append(field)
                continue
            cfn, ref, _ = parts.scalars[(fn, args)]
            tail.append((fn, cfn, (h, *args, ref)))
            self.scalars.append((field, fn, args, scale, at[(fn, args)], *kind(field, scale)))
        cfn, ref, _ = parts.scalars[_PSTATE_CALL]
        tail.append(("nvmlDeviceGetPerformanceState", cfn, (h, ref)))
        self.tail_calls = tuple(tail)
        self.at = tuple(at[k] for k in (
            "memory.total", "memory.reserved", "memory.used", "utilization.gpu", "utilization.memory",
            "field_value.valueType", "field_value.nvmlReturn", "field_value.uiVal", _PSTATE_CALL,
        ))
        self.pstate = kind("performance_state", 1.0)
        self.memtemp = kind("memory_temperature_celsius", 1.0)
        self.util = kind("utilization_gpu_ratio", 0.01)
        self.mem = kind("memory_used_bytes", 1.0)
        #: GPM admission: (metric's place in the flat answer, field, scale, lo, hi, PCIe?)
        self.gpm_plan = tuple(
            (2 * i, _GPM_FIELDS[m], _MIB if m in _GPM_PCIE else 0.01, *spec[_GPM_FIELDS[m]][:2], m in _GPM_PCIE)
            for i, m in enumerate(GPM_METRICS)
        )
        self.source_code = ""
        #: ``read(v)``: the whole fast set into ``v`` (memory, utilization, GPM where the device
        #: has it, HBM temperature, the plain getters, P-state, processes), as
        #: ``NvmlSource._sample_device`` reads them on the general path; ``None`` where the plan
        #: holds a field kind ``_compile`` does not write (``build`` then refuses the device).
        #: Raises ``DeviceDown`` on a lifecycle error (through the general path).
        self.read = self._compile()

    def _compile(self) -> Callable[[dict[str, Any]], None] | None:
        """This device's ``read`` as one generated function, or ``None`` where a field's kind is
        not one it handles.

        The calls are written out one after the other with their arguments as constants; when
        every call answered and GPM gave every metric (the ordinary tick), each value is
        admitted inline, its field's bounds as constants: in range it is stored, otherwise
        ``_Reader.put`` decides as on the general path. Any other tick goes to ``_admit``, which
        decides case by case in loops. Generated rather than written because the plan differs per device and
        driver (calls answered "not supported" are left out, GPM only on GPM devices) and a loop
        over a plan costs about three times the Python per value (``namedtuple`` and
        ``dataclasses`` make their methods the same way). The source is kept in ``self.source_code``."""
        r = self.r
        if (self.mem[2], self.util[2], self.pstate[2]) != (0, 1, 0) or self.memtemp[2] > 1:
            return None
        if any(how > 1 for *_, how in self.scalars):
            return None
        ns: dict[str, Any] = {
            "W": r.watch, "R": r, "put": r.put, "unpack": self.parts.unpack, "arena": self.parts.arena,
            "processes": self._processes_call, "admit": self._admit, "admit_processes": _admit_processes,
            "GPM": self.gpm, "METRICS": GPM_METRICS, "NvmlCallError": NvmlCallError,
            "SF": _SENTINEL_FLOOR, "PL": _PLAIN_LO, "PH": _PLAIN_HI,
        }

        def const(x: Any) -> str:
            if x is None or x.__class__ is bool or x.__class__ is int or (x.__class__ is float and math.isfinite(x)):
                return repr(x)
            name = f"K{len(ns)}"
            ns[name] = x
            return name

        # the reader's generation and the device index are names, not literals, so that the same
        # plan on another GPU, or after the watchdog gave up on a read, compiles to the same code
        ns.update(GEN=r.generation, INDEX=r.index)
        code = ["def read(v):"]
        rets: list[str] = []

        def call(fn: str, cfn: Any, args: tuple[Any, ...]) -> None:
            n = len(rets)
            ns[f"C{n}"] = cfn
            names = []
            for j, a in enumerate(args):
                if a.__class__ is int:
                    names.append(repr(a))
                else:
                    ns[f"A{n}_{j}"] = a
                    names.append(f"A{n}_{j}")
            code.append(f"    W.fn = {fn!r}")
            code.append(f"    r{n} = C{n}({', '.join(names)})")
            code.append(f"    if W.generation != GEN: W.returned(INDEX, {fn!r})")
            rets.append(f"r{n}")

        for fn, cfn, args in self.head_calls:
            call(fn, cfn, args)
        if self.gpm is not None:
            code += [
                "    W.fn = 'nvmlGpmSampleGet'",
                "    try:",
                "        flat = GPM(INDEX, METRICS)",
                "    except NvmlCallError as exc:",
                "        flat, gerr = None, exc",
                "    else:",
                "        gerr = None",
                "    if W.generation != GEN: W.returned(INDEX, 'nvmlGpmSampleGet')",
            ]
        else:
            code.append("    flat = gerr = None")
        for fn, cfn, args in self.tail_calls:
            call(fn, cfn, args)
        # the process list: a failed call or more processes than the array holds go through
        # ``_processes_call``, which asks again (growing the array) and says which
        cp, _, held, count, count_ref = self.parts.processes
        ns.update(CP=cp, HELD=held, CNT=count, CREF=count_ref, H=self.parts.handle, procs_of=_procs_of)
        code += [
            "    arr = HELD[0]",
            "    CNT.value = len(arr)",
            "    W.fn = 'nvmlDeviceGetComputeRunningProcesses'",
            "    rp = CP(H, CREF, arr)",
            "    if W.generation != GEN: W.returned(INDEX, 'nvmlDeviceGetComputeRunningProcesses')",
            "    procs = processes(W, GEN, INDEX) if rp else procs_of(arr, CNT.value) if CNT.value else ()",
        ]
        # anything unusual: `_admit`, which decides case by case
        unusual = [*rets, "procs is None"]
        i_total, i_reserved, i_used, i_ugpu, i_umem, i_vtype, i_fvret, i_fv, i_pstate = self.at
        if self.gpm is not None:
            unusual += ["flat is None", *(f"flat[{i}]" for i, *_ in self.gpm_plan)]
        code.append("    raw = unpack(arena)")
        if not self.memtemp_unsupported:
            unusual += [f"raw[{i_fvret}]", f"raw[{i_vtype}] != 1"]
        code.append(f"    if {' or '.join(unusual)}:")
        code.append(f"        return admit(v, [{', '.join(rets)}], flat, gerr, procs)")
        missing: list[str] = []

        def admit(field: str, raw: str, lo: float, hi: float, scale: float = 1.0, store: str = "x",
                  sentinel: bool = True, limit: str = "") -> None:
            """Inline: ``x`` = ``raw`` × scale; stored as ``store`` when in [lo, hi] (and not a
            sentinel), else ``put`` decides."""
            code.append(f"    y = {raw}")
            code.append("    x = y" if scale == 1.0 else f"    x = y * {const(scale)}")
            check = f"{const(lo)} <= x <= {const(hi)}"
            if sentinel:
                check += " and (y < SF or PL < y < PH)"
            code.append(f"    if {check}: v[{field!r}] = {store}")
            args = "" if scale == 1.0 else f", {const(scale)}"
            if limit:
                args = f"{args or ', 1.0'}, {limit}"
            code.append(f"    else: put({field!r}, y, v{args})")

        lo, hi, _ = self.mem
        admit("memory_total_bytes", f"raw[{i_total}]", lo, hi)
        code.append(f"    limit = v.get('memory_total_bytes', {const(r.memory_limit)})")
        code.append(f"    cap = {const(hi)} if limit is None else min({const(hi)}, limit * (1 + 1e-6))")
        for field, i in (("memory_used_bytes", i_used), ("memory_reserved_bytes", i_reserved)):
            code.append(f"    y = x = raw[{i}]")
            code.append(f"    if {const(lo)} <= x <= cap and (y < SF or PL < y < PH): v[{field!r}] = x")
            code.append(f"    else: put({field!r}, y, v, limit=limit)")
        lo, hi, _ = self.util
        for field, i in (("utilization_gpu_ratio", i_ugpu), ("utilization_memory_ratio", i_umem)):
            admit(field, f"raw[{i}]", lo, hi, 0.01, sentinel=False)
        if self.gpm is not None:
            code.append("    v['activity_source'] = 'gpm'")
            pcie_limit = r.pcie_limit
            for i, field, scale, lo, hi, pcie in self.gpm_plan:
                if pcie and pcie_limit is not None:
                    admit(field, f"flat[{i + 1}]", lo, min(hi, pcie_limit * (1 + 1e-6)), scale, sentinel=False,
                          limit=const(pcie_limit))
                else:
                    admit(field, f"flat[{i + 1}]", lo, hi, scale, sentinel=False)
        if self.memtemp_unsupported:
            missing.append("memory_temperature_celsius")
        else:
            lo, hi, how = self.memtemp
            code.append(f"    y = x = raw[{i_fv}]")
            code.append(f"    if {const(lo)} <= x <= {const(hi)} and x < SF: "
                        f"v['memory_temperature_celsius'] = {'x' if how == 0 else 'float(x)'}")
            code.append("    else: put('memory_temperature_celsius', x, v)")
        missing += self.unsupported
        for field, _, _, scale, i, lo, hi, how in self.scalars:
            store = "y" if how == 0 else "x" if scale != 1.0 else "float(x)"
            admit(field, f"raw[{i}]", lo, hi, scale, store)
        lo, hi, _ = self.pstate
        code.append(f"    x = raw[{i_pstate}]")
        code.append(f"    if x == {NVML_PSTATE_UNKNOWN}: R.missing['performance_state'] = 'unknown'")
        code.append(f"    elif {const(lo)} <= x <= {const(hi)}: v['performance_state'] = x")
        code.append("    else: put('performance_state', x, v)")
        if missing:
            code.append("    m = R.missing")
            code += [f"    m[{field!r}] = 'not supported'" for field in missing]
        code.append("    if procs: admit_processes(R, v, procs)")
        code.append("    else: v['processes'] = ()")
        self.source_code = "\n".join(code) + "\n"
        compiled = _COMPILED.get(self.source_code)
        if compiled is None:  # a re-probe or reset rebuilds the same plan: compiled once (1 ms)
            compiled = compile(self.source_code, "<vgpumon fast path>", "exec")
            if len(_COMPILED) < 256:
                _COMPILED[self.source_code] = compiled
        exec(compiled, ns)  # noqa: S102 - our own code, from the plan above
        return ns["read"]

    @staticmethod
    def build(source: "NvmlSource", r: _Reader, gpu: GpuIdentity) -> "_FastPath | None":
        """The device's fast path, or ``None`` where the general path must serve (not the live
        backend, a driver without one of the C functions, memory API not decided as v2, a field
        the door does not treat as a plain number, a call it always makes cached as not
        supported)."""
        parts_of = getattr(source.backend, "fast_parts", None)
        if parts_of is None or source._mem_api.get(gpu.index) != "v2" or r.watch is None:
            return None
        if not _ALWAYS_ASKED.isdisjoint(r.unsupported.fns):
            return None  # cached "not supported" until the re-probe: the general path does not ask it
        try:
            parts = parts_of(gpu.index, _FAST_CALLS)
        except NvmlCallError:
            return None
        if parts is None or None in (parts.memory, parts.utilization, parts.field_values, parts.processes):
            return None
        if any(call not in parts.scalars for call in _FAST_CALLS):
            return None
        names = ("memory_used_bytes", "memory_total_bytes", "memory_reserved_bytes", "utilization_gpu_ratio",
                 "utilization_memory_ratio", "memory_temperature_celsius", "performance_state", "used_gpu_memory_bytes",
                 *(f for f, *_ in _FAST_SCALARS), *_GPM_FIELDS.values())
        if any(n not in r.spec for n in names):
            return None
        gpm = getattr(source.backend, "gpm_flat", None) if gpu.gpm_supported else None
        if gpu.gpm_supported and gpm is None:
            return None
        fast = _FastPath(source, r, gpu, parts, gpm)
        return fast if fast.read is not None else None

    def _admit(self, v: dict[str, Any], rets: list[int], flat: Any, gpm_error: NvmlCallError | None,
               procs: list[tuple[int, Any]] | None) -> None:
        """Admit the answers of the generated ``read``'s calls into ``v`` (return codes of the calls
        before and after GPM, GPM's flat answer and error, the process list or ``None``),
        whatever they are, in the general path's order: a failed call is asked again through
        the general path, which decides.

        Raises:
            DeviceDown: on a lifecycle error (through the general path).
        """
        r = self.r
        missing = r.missing
        parts = self.parts
        raw = parts.unpack(parts.arena)
        i_total, i_reserved, i_used, i_ugpu, i_umem, i_vtype, i_fvret, i_fv, i_pstate = self.at
        source = self.source
        # memory (v2)
        if rets[0]:
            source._memory(r, self.gpu, v)  # asks again and decides
        else:
            total = raw[i_total]
            lo, hi, how = self.mem
            if how == 0 and lo <= total <= hi and (total < _SENTINEL_FLOOR or _PLAIN_LO < total < _PLAIN_HI):
                v["memory_total_bytes"] = total
            else:
                r.put("memory_total_bytes", total, v)
            limit = v.get("memory_total_bytes", r.memory_limit)
            cap = hi if limit is None else min(hi, limit * (1 + 1e-6))
            for field, x in (("memory_used_bytes", raw[i_used]), ("memory_reserved_bytes", raw[i_reserved])):
                if how == 0 and lo <= x <= cap and (x < _SENTINEL_FLOOR or _PLAIN_LO < x < _PLAIN_HI):
                    v[field] = x
                else:
                    r.put(field, x, v, limit=limit)
        # utilization (percent: a sentinel is far out of range)
        if rets[1]:
            source._utilization(r, v)  # asks again and decides
        else:
            lo, hi, how = self.util
            for field, pct in (("utilization_gpu_ratio", raw[i_ugpu]), ("utilization_memory_ratio", raw[i_umem])):
                x = pct * 0.01
                if how == 1 and lo <= x <= hi:
                    v[field] = x
                else:
                    r.put(field, pct, v, 0.01)
        if self.gpm is not None:
            v["activity_source"] = "gpm"
            if gpm_error is not None:
                source._gpm_failed(r, gpm_error)
            elif flat is None:  # first GPM sample of this device: no interval to average over yet
                for field in _GPM_FIELDS.values():
                    missing[field] = "GPM: first sample, no interval yet"
            else:
                pcie_limit = r.pcie_limit
                for i, field, scale, lo, hi, pcie in self.gpm_plan:
                    value = flat[i + 1]
                    if flat[i]:
                        missing[field] = f"GPM: {NvmlCallError(flat[i], 'nvmlGpmMetricsGet').reason}"
                        continue
                    x = value * scale
                    if lo <= x <= hi and (not pcie or pcie_limit is None or x <= pcie_limit * (1 + 1e-6)):
                        v[field] = x
                    else:
                        r.put(field, value, v, scale, pcie_limit if pcie else None)
        k = 2
        # HBM temperature: one field-values entry; the entry's own return code decides
        if self.memtemp_unsupported:
            missing["memory_temperature_celsius"] = "not supported"
        else:
            ret, k = rets[k], k + 1
            if ret or raw[i_fvret] or raw[i_vtype] not in _FV_MEMBERS:
                r.put("memory_temperature_celsius", r.field_value("memory_temperature_celsius", NVML_FI_DEV_MEMORY_TEMP), v)
            else:
                vtype = raw[i_vtype]
                x = raw[i_fv] if vtype == 1 else getattr(self.fv_entry[0].value, _FV_MEMBERS[vtype])
                lo, hi, how = self.memtemp
                if x.__class__ is int and how < 2 and lo <= x <= hi and x < _SENTINEL_FLOOR:
                    v["memory_temperature_celsius"] = x if how == 0 else float(x)
                else:
                    r.put("memory_temperature_celsius", x, v)
        for field in self.unsupported:
            missing[field] = "not supported"
        for field, fn, args, scale, i, lo, hi, how in self.scalars:
            ret, k = rets[k], k + 1
            if ret:
                r.put(field, r.q(field, fn, *args), v, scale)  # asks again and decides
                continue
            x = y = raw[i]
            if scale != 1.0:
                x = y * scale
            if how != 3 and lo <= x <= hi and (y < _SENTINEL_FLOOR or _PLAIN_LO < y < _PLAIN_HI):
                v[field] = y if how == 0 else float(x) if how == 1 else bool(x)
            else:
                r.put(field, y, v, scale)
        pstate = raw[i_pstate] if not rets[k] else r.q("performance_state", "nvmlDeviceGetPerformanceState")
        lo, hi, how = self.pstate
        if pstate == NVML_PSTATE_UNKNOWN:
            missing["performance_state"] = "unknown"
        elif how == 0 and pstate is not None and lo <= pstate <= hi:
            v["performance_state"] = pstate
        else:
            r.put("performance_state", pstate, v)
        if procs is None:
            source._processes(r, v)  # asks again and decides
        elif procs:
            _admit_processes(r, v, procs)
        else:
            v["processes"] = ()

    def _processes_call(self, w: "_Watch", gen: int, index: int) -> list[tuple[int, Any]] | None:
        """The compute processes (v3 structs) as ``(pid, usedGpuMemory)``; more than fit: grow as
        nvidia-ml-py does. ``None``: the call answered an error (the general path asks again)."""
        cfn, proc, held, count, count_ref = self.parts.processes
        arr = held[0]
        h = self.parts.handle
        count.value = len(arr)
        w.fn = "nvmlDeviceGetComputeRunningProcesses"
        ret = cfn(h, count_ref, arr)
        if ret == _INSUFFICIENT_SIZE:
            arr = held[0] = (proc * (count.value * 2 + 5))()
            count.value = len(arr)
            ret = cfn(h, count_ref, arr)
        if w.generation != gen:
            w.returned(index, "nvmlDeviceGetComputeRunningProcesses")
        if ret:
            return None
        return _procs_of(arr, count.value)


class NvmlSource:
    """Samples every NVIDIA GPU of the host through an ``NvmlBackend``.

    Not thread-safe: the agent calls ``start``/``sample``/``close`` from one worker thread.

    Args:
        backend: ``LiveBackend()`` by default; ``ReplayBackend`` / ``RecordingBackend`` for
            captures. The same code runs on all three.
        slow_every: read the slow set every this many ticks (first tick included).
        minute_seconds: read the minute set (energy, violation times, BAR1, PCIe replays, MIG
            mode) on the first slow tick at least this long after its last read (the first slow
            tick included): ``MINUTE_SECONDS``; 0 reads it on every slow tick.
        use_gpm: set False to force the pre-Hopper path (utilization as activity proxy, PCIe
            from the polled throughput call).
        max_backoff_ticks: longest wait, in ticks, between retries of a down device or library.
        reprobe_every: ask again, every this many ticks, the calls a device answered "not
            supported" or "function not found" (a driver upgrade or a MIG change can make them
            answer); the cache is also cleared at every re-initialisation and recovery.
    """

    name = "nvml"

    def __init__(
        self,
        backend: NvmlBackend | None = None,
        *,
        slow_every: int = 10,
        minute_seconds: float = MINUTE_SECONDS,
        use_gpm: bool = True,
        max_backoff_ticks: int = 32,
        reprobe_every: int = 600,
    ) -> None:
        self.backend: NvmlBackend = backend if backend is not None else LiveBackend()
        self.slow_every = max(1, slow_every)
        self.minute_seconds = max(0.0, minute_seconds)
        self.use_gpm = use_gpm
        self.max_backoff_ticks = max(1, max_backoff_ticks)
        self.gpus: tuple[GpuIdentity, ...] = ()
        self.driver_version: str | None = None
        self.door = Door(
            (*catalogue.fields_of("gpu_samples"), *catalogue.fields_of("gpus"), *catalogue.fields_of("gpu_process_samples"))
        )
        self.rejected: Counter[str] = self.door.rejected
        self.last_success_ts: float | None = None
        self._unsupported: dict[int, _Unsupported] = {}
        self._readers: dict[int, _Reader] = {}
        #: the straight-line reader per device (``_FastPath``; ``None`` where it cannot serve) and
        #: the state it was built for (reader, identity, "not supported" cache, memory API)
        self._fast: dict[int, _FastPath | None] = {}
        self._fast_built: dict[int, tuple[Any, ...]] = {}
        #: use ``_FastPath`` where the backend allows (the live one); False: the general path only
        self.fast_path = True
        self._minute_last: float | None = None  # tick time of the minute set's last read
        self._minute_due = True
        self._tick = 0
        # device index → (reason, failures, next tick to retry)
        self._down: dict[int, tuple[str, int, int]] = {}
        # library down: (reason, failures, next tick to retry) or None
        self._lib_down: tuple[str, int, int] | None = None
        self._replay_prev: dict[str, tuple[float, int] | None] = {}
        self._xid_counts: dict[str, Counter[int]] = {}
        self._xid_last: dict[str, dict[int, float]] = {}
        self._xid_warned = False
        self._xid_seq: dict[str, int] = {}
        self._last_ts: float | None = None
        self._step_noted = False
        self._behind = False
        # Wedged calls (``abandon``): device index → (NVML call, monotonic time it started)
        self._watch = _Watch(self)
        self._wedged: dict[int, tuple[str, float]] = {}
        self._tick_state: dict[str, Any] | None = None
        self._started = False
        self.reprobe_every = max(1, reprobe_every)
        # Devices NVML counts but could not name (UUID unreadable): index → (reason, failures,
        # next tick to retry); retried with the same back-off as a lost GPU.
        self._unidentified: dict[int, tuple[str, int, int]] = {}
        self._device_count: int | None = None
        self._named_once = False
        # Memory API per device, decided by the first read after each (re-)initialisation and
        # kept until the next one, so that v1 (reserved memory included) and v2 never mix.
        self._mem_api: dict[int, str] = {}
        self._mem_api_of: dict[str, str] = {}  # UUID → API decided last (to tell a change)
        self._events: list[HostEvent] = []
        # GPM PCIe cross-check (``_crosscheck``), per GPU UUID
        self._gpm_history: dict[str, deque[tuple[float, Any, Any]]] = {}
        self._crosschecked: dict[str, float] = {}
        self._pcie_strikes: dict[str, int] = {}
        self._pcie_fault: dict[str, str] = {}
        self._now = 0.0  # the current tick's time, for events

    def _backoff(self, failures: int) -> int:
        return min(2 ** max(failures - 1, 0), self.max_backoff_ticks)

    # -- start ---------------------------------------------------------------------------------

    def start(self) -> tuple[GpuIdentity, ...]:
        """Initialise NVML and read every device's static facts.

        Returns:
            One ``GpuIdentity`` per readable device, by NVML index (empty when the host has no
            GPU, or when NVML is down for a reason that may pass — then ``sample`` retries).

        Raises:
            NvmlUnavailableError: no NVIDIA stack on this host (library not found, driver not
                loaded); the message names the cause.

        Calling it again returns the same GPUs (the CLI starts NVML before it opens the store,
        so that a host without a driver leaves no empty store behind).
        """
        if self._started:
            return self.gpus
        try:
            self._init()
        except NvmlCallError as exc:
            if exc.code in _FATAL_AT_START:
                raise NvmlUnavailableError(f"NVML unavailable: {_describe(exc)}") from None
            log.error("NVML unavailable: %s; retrying with back-off", _describe(exc))
            self._lib_down = (_describe(exc), 1, self._tick + self._backoff(1))
        self._started = True
        return self.gpus

    def _event(self, kind: str, subject: str, detail: str = "") -> None:
        # Events noticed before the first tick (at start) take the first tick's time.
        self._events.append(HostEvent(ts=self._now, kind=kind, subject=subject, detail=detail))

    def _init(self, why: str = "") -> None:
        """(Re-)initialise NVML and name every device (``why``: what made a re-initialisation). Answers cached as "not supported" and
        the memory API in use are forgotten: a driver reload or upgrade may answer them now."""
        self.backend.init()
        count = int(self.backend.system("nvmlDeviceGetCount"))
        try:
            self.driver_version = str(self.backend.system("nvmlSystemGetDriverVersion"))
        except NvmlCallError:
            self.driver_version = None
        self._unsupported.clear()
        self._mem_api.clear()
        self._device_count = count
        before = {g.uuid: g for g in self.gpus}
        first = not self._named_once  # the first set named is the baseline, not an arrival
        gpus = []
        self._unidentified.clear()
        for index in range(count):
            gpu = self._identify(index, max(self._tick - 1, 0))
            if gpu is not None:
                gpus.append(gpu)
                self._down.pop(index, None)
        self.gpus = tuple(gpus)
        self._named_once = True
        if not first:
            self._event("nvml_reinitialized", "host", f"{why}; {len(self.gpus)} GPU(s)")
            self._compare_device_sets(before)

    def _identify(self, index: int, tick: int = 0) -> GpuIdentity | None:
        """Name one device; one that cannot be named is retried with back-off from ``tick``
        (``None``)."""
        try:
            gpu = self._identity(index)
        except DeviceDown as exc:
            prev = self._unidentified.get(index)
            failures = 1 if prev is None else prev[1] + 1
            if prev is None:
                log.warning("GPU %d cannot be identified: %s; retrying with back-off", index, exc.error.reason)
                self._event("gpu_unidentified", f"index:{index}", exc.error.reason)
            self.backend.forget_device(index)
            self._unidentified[index] = (exc.error.reason, failures, tick + self._backoff(failures))
            return None
        if self._unidentified.pop(index, None) is not None:
            log.warning("GPU %d identified after retries: %s", index, gpu.uuid)
        return gpu

    def _compare_device_sets(self, before: dict[str, GpuIdentity]) -> None:
        now = {g.uuid: g for g in self.gpus}
        for uuid in sorted(now.keys() - before.keys(), key=lambda u: now[u].index):
            log.warning("GPU %d (%s) appeared", now[uuid].index, uuid)
            self._event("gpu_appeared", f"gpu:{uuid}", f"index {now[uuid].index}, bus {now[uuid].pci_bus_id}")
        for uuid in sorted(before.keys() - now.keys(), key=lambda u: before[u].index):
            log.warning("GPU %d (%s) is gone", before[uuid].index, uuid)
            self._event("gpu_disappeared", f"gpu:{uuid}", f"was index {before[uuid].index}, bus {before[uuid].pci_bus_id}")

    def _retry_unidentified(self, tick: int) -> None:
        """Devices that could not be named (at start, or after a re-initialisation) are retried
        with back-off; one named at last joins the sampled GPUs as an appeared GPU."""
        for index, (_, _, due) in sorted(self._unidentified.items()):
            if tick >= due:
                gpu = self._identify(index, tick)
                if gpu is not None:
                    before = {g.uuid: g for g in self.gpus}
                    self.gpus = tuple(sorted((*self.gpus, gpu), key=lambda g: g.index))
                    self._compare_device_sets(before)

    def _check_device_count(self, tick: int) -> None:
        """Slow period: re-read the device count; a changed count re-initialises NVML (its device
        list is fixed at nvmlInit), which names the new set and stores what appeared or went."""
        try:
            count = int(self.backend.system("nvmlDeviceGetCount"))
        except (NvmlCallError, TypeError, ValueError):
            return  # not answered (or not in a capture): the next slow tick asks again
        if self._device_count is not None and count != self._device_count:
            log.warning("NVML now counts %d GPU(s), was %d: re-initialising", count, self._device_count)
            self._reinitialise(tick, f"device count {self._device_count} → {count}")

    def _reinitialise(self, tick: int, why: str) -> None:
        self.backend.shutdown()
        try:
            self._init(why)
        except NvmlCallError as exc:
            self._library_failed(tick, exc)

    def _reprobe(self) -> None:
        """Forget the cached "not supported" answers so they are asked again."""
        for index, cached in self._unsupported.items():
            if cached:
                calls = ", ".join(sorted({key[0] for key in cached}))
                log.info("GPU %d: re-probing %d call(s) cached as not supported: %s", index, len(cached), calls)
                cached.clear()

    def _reader(self, index: int, gpu: GpuIdentity | None = None) -> _Reader:
        unsupported = self._unsupported.get(index)
        if unsupported is None:
            unsupported = self._unsupported[index] = _Unsupported()
        calls = None
        bound_calls = getattr(self.backend, "bound_calls", None)
        if bound_calls is not None and gpu is not None:
            try:
                calls = bound_calls(index)
            except NvmlCallError:
                pass  # no handle: the first call through the backend says why
        if gpu is None:
            return _Reader(self.backend, index, unsupported, self.door, gpu, self._watch, calls)
        # one reader per device, kept while nothing it holds changed: a tick only resets its reasons
        r = self._readers.get(index)
        if (r is None or r.gpu is not gpu or r.unsupported is not unsupported or r.bound is not calls
                or r.generation != self._watch.generation):
            r = self._readers[index] = _Reader(self.backend, index, unsupported, self.door, gpu, self._watch, calls)
        else:
            r.missing = {}
        return r

    def _identity(self, index: int) -> GpuIdentity:
        r = self._reader(index)
        v: dict[str, Any] = {}
        r.put("uuid", r.q("uuid", "nvmlDeviceGetUUID"), v)
        if "uuid" not in v:  # no identity, no history: the device is treated as down
            raise DeviceDown(NvmlCallError(NVML_ERROR_NOT_SUPPORTED, "nvmlDeviceGetUUID"))
        pci = r.q("pci_bus_id", "nvmlDeviceGetPciInfo")
        r.put("pci_bus_id", r.get("pci_bus_id", pci, "busId") or None, v)
        r.put("memory_total_bytes", r.get("memory_total_bytes", r.q("memory_total_bytes", "nvmlDeviceGetMemoryInfo"), "total"), v)
        gpm_supported = False
        if self.use_gpm:
            support = r.q("gpm", "nvmlGpmQueryDeviceSupport")
            gpm_supported = bool(isinstance(support, dict) and support.get("isSupportedDevice"))
        r.put("name", r.q("name", "nvmlDeviceGetName"), v)
        r.put("serial", r.q("serial", "nvmlDeviceGetSerial"), v)
        r.put("pcie_link_gen_max", r.q("pcie_link_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"), v)
        r.put("pcie_link_width_max", r.q("pcie_link_width_max", "nvmlDeviceGetMaxPcieLinkWidth"), v)
        r.put("pcie_link_gen_gpu_max", r.q("pcie_link_gen_gpu_max", "nvmlDeviceGetGpuMaxPcieLinkGeneration"), v)
        r.put("sm_clock_max_hertz", r.q("sm_clock_max_hertz", "nvmlDeviceGetMaxClockInfo", NVML_CLOCK_SM), v, 1e6)
        r.put("memory_clock_max_hertz", r.q("memory_clock_max_hertz", "nvmlDeviceGetMaxClockInfo", NVML_CLOCK_MEM), v, 1e6)
        r.put(
            "slowdown_temperature_celsius",
            r.q("slowdown_temperature_celsius", "nvmlDeviceGetTemperatureThreshold", NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
            v,
        )
        for field, reason in r.missing.items():
            if catalogue.is_rejection(reason):
                log.warning("GPU %d: %s %s", index, field, reason)
        return GpuIdentity(index=index, gpm_supported=gpm_supported, **v)

    # -- every tick ----------------------------------------------------------------------------

    def status(self, collect_seconds: float = 0.0) -> SourceStatus:
        """Self-metrics as of the last tick."""
        return SourceStatus(
            name=self.name,
            up=self._lib_down is None,
            last_success_ts=self.last_success_ts,
            collect_seconds=collect_seconds,
            rejected=dict(self.rejected),
            message=None if self._lib_down is None else f"NVML down: {self._lib_down[0]}",
        )

    def sample(self, ts: float | None = None) -> NvmlReading:
        """Read one tick from every device.

        Args:
            ts: the tick's time (seconds since the epoch); ``time.time()`` when ``None``. A replay
                backend substitutes the capture's timestamp.

        Returns:
            ``NvmlReading``: one ``GpuSample`` per device in ``self.gpus`` (a device that could
            not be read has ``up=False``, all values ``None`` and the reason in ``missing["*"]``),
            the XID events received since the last tick, and the source's status.

        Raises:
            EndOfCapture: a replay has no more ticks.
        """
        t0 = time.perf_counter()
        ts = self._stamp(self.backend.begin_tick(time.time() if ts is None else ts))
        self._now = ts
        tick = self._tick
        self._tick += 1
        if self._lib_down is not None and not self._retry_library(tick):
            reason = f"NVML down: {self._lib_down[0]}" if self._lib_down else "NVML down"
            samples = tuple(self._down_sample(g, ts, reason) for g in self.gpus)
            return NvmlReading(ts, samples, (), self.status(time.perf_counter() - t0), self._take_events())
        slow = tick % self.slow_every == 0
        if slow:
            last = self._minute_last
            # a wall clock stepped back (ts before the last read) makes it due too
            self._minute_due = last is None or not 0 <= ts - last < self.minute_seconds * 0.95
            if self._minute_due:
                self._minute_last = ts
        if tick and tick % self.reprobe_every == 0:
            self._reprobe()
        if self._unidentified:
            self._retry_unidentified(tick)
        if slow and tick:
            self._check_device_count(tick)
        self._tick_state = {"ts": ts, "tick": tick, "slow": slow, "t0": t0, "mono": time.monotonic(), "done": {}, "late": False}
        return self._finish_tick()

    def resume(self) -> NvmlReading:
        """Finish the tick the agent gave up waiting for (a call on one device did not return
        within its deadline, ``abandon``): the devices read already keep their samples, the
        wedged one is down, the rest are read now and carry the time they were read.

        Raises:
            RuntimeError: no tick is in progress.
        """
        if self._tick_state is None:
            raise RuntimeError("no tick to resume")
        self._tick_state["late"] = True
        return self._finish_tick()

    def inflight(self) -> tuple[int, str, float] | None:
        """The device being read now, the NVML call in flight and since when (monotonic), or
        ``None`` between devices and ticks. Read by the agent's watchdog from another thread."""
        w = self._watch
        device = w.device
        return None if device is None else (device, w.fn, w.since)

    def abandon(self, index: int, fn: str, since: float, then: Callable[[], None] | None = None) -> bool:
        """Give up on the sampling thread stuck in ``fn`` on device ``index`` (as ``inflight``
        named it): the device is wedged (down, reason "wedged: <call> for N s", an event) and
        skipped until the call returns; the stuck thread stops when it does. Call ``resume`` on
        a fresh thread next.

        Args:
            then: called once the read is abandoned, before the stuck thread can see it (the
                agent's own bookkeeping of which thread samples).

        Returns:
            False, abandoning nothing, when that read is no longer in flight: it ended between
            ``inflight`` and this call (the device was slow, not wedged).
        """
        w = self._watch
        with w.lock:
            if w.device != index or w.since != since:
                return False
            w.generation += 1
            w.device = None
            self._wedged[index] = (fn, since)
            if then is not None:
                then()
        gpu = next((g for g in self.gpus if g.index == index), None)
        log.error("GPU %d: %s did not return; skipping the GPU until it does", index, fn)
        self._event("gpu_wedged", f"gpu:{gpu.uuid}" if gpu else f"index:{index}", f"{fn} did not return")
        return True

    def _unwedge(self, index: int, fn: str) -> None:
        """The stuck call returned (on the abandoned thread): sample the device again. Its GPM pair
        and handle, which began before the hang, are dropped while it is still marked wedged (the
        sampling thread skips it until the mark goes, so never reads it as they are dropped)."""
        self.backend.forget_device(index)
        began = self._wedged.pop(index, (fn, time.monotonic()))[1]
        hung = time.monotonic() - began
        gpu = next((g for g in self.gpus if g.index == index), None)
        log.warning("GPU %d: %s returned after %.1f s; sampling it again", index, fn, hung)
        self._events.append(
            HostEvent(ts=self._now, kind="gpu_unwedged", subject=f"gpu:{gpu.uuid}" if gpu else f"index:{index}",
                      detail=f"{fn} returned after {hung:.1f} s")
        )

    @property
    def wedged(self) -> bool:
        """A call on some device has not returned (NVML must then not be shut down)."""
        return bool(self._wedged)

    def _finish_tick(self) -> NvmlReading:
        state = self._tick_state
        assert state is not None
        ts, tick, slow, t0 = state["ts"], state["tick"], state["slow"], state["t0"]
        done: dict[int, GpuSample] = state["done"]
        watch = self._watch
        generation = watch.generation
        late, wedged_devices = state["late"], self._wedged
        for gpu in self.gpus:
            if gpu.index in done:
                continue
            if watch.generation != generation:
                raise Abandoned("tick given up")
            wedged = wedged_devices.get(gpu.index) if wedged_devices else None
            if wedged is not None:
                done[gpu.index] = self._down_sample(gpu, ts, f"wedged: {wedged[0]} for {time.monotonic() - wedged[1]:.0f} s")
                continue
            # a device read after the tick was resumed carries the time it was read
            at = ts + (time.monotonic() - state["mono"]) if late else ts
            # since first: ``inflight`` reads nothing while ``device`` is None, so it never pairs
            # this device with the previous read's start
            watch.since = time.monotonic()
            watch.device = gpu.index
            sample = self._read_device(gpu, at, tick, slow)
            with watch.lock:
                given_up = watch.generation != generation
                if not given_up:
                    watch.device = None
            if given_up:  # abandoned after its last call returned: not wedged after all
                watch.returned(gpu.index, watch.fn)
            done[gpu.index] = sample
        self._tick_state = None
        samples = list(done.values())  # filled in the order of self.gpus, a resumed tick too
        xids = self._poll_xids() if self._lib_down is None else ()
        if self._xid_counts:  # counts stay on every later sample, not only the event's tick
            samples = [self._with_xids(s) for s in samples]
        if self._lib_down is None:
            self.last_success_ts = ts
        return NvmlReading(ts, tuple(samples), xids, self.status(time.perf_counter() - t0), self._take_events())

    def _read_device(self, gpu: GpuIdentity, ts: float, tick: int, slow: bool) -> GpuSample:
        """One device's sample for this tick, or its down sample (lost, back-off, NVML down)."""
        if self._lib_down is not None:  # the library went down earlier in this tick
            return self._down_sample(gpu, ts, f"NVML down: {self._lib_down[0]}")
        down = self._down.get(gpu.index)
        if down is not None and tick < down[2]:
            return self._down_sample(gpu, ts, f"device down: {down[0]}; retry in {down[2] - tick} ticks")
        try:
            if down is not None:  # a retry after a reset: what it supports may differ
                self._unsupported.pop(gpu.index, None)
                self._mem_api.pop(gpu.index, None)
            sample = self._sample_device(gpu, ts, slow)
            if down is not None:
                log.warning("GPU %d (%s) is back after %d failed tries", gpu.index, gpu.uuid, down[1])
                self._event("gpu_recovered", f"gpu:{gpu.uuid}", f"after {down[1]} failed tries ({down[0]})")
                del self._down[gpu.index]
            return sample
        except DeviceDown as exc:
            self.backend.forget_device(gpu.index)
            if exc.error.code in _LIBRARY_DOWN:
                self._library_failed(tick, exc.error)
                return self._down_sample(gpu, ts, f"NVML down: {self._lib_down[0]}")  # type: ignore[index]
            failures = 1 if down is None else down[1] + 1
            if down is None:
                log.warning("GPU %d (%s) down: %s", gpu.index, gpu.uuid, exc.error.reason)
                self._event("gpu_down", f"gpu:{gpu.uuid}", exc.error.reason)
            self._down[gpu.index] = (exc.error.reason, failures, tick + self._backoff(failures))
            return self._down_sample(gpu, ts, f"device down: {exc.error.reason}")

    def _stamp(self, ts: float) -> float:
        """The tick's stored time: the wall clock (or the capture's), never at or before the
        previous tick's millisecond. Ticks are keyed by (GPU, millisecond): a tick in the same
        millisecond as the last one would be dropped as a duplicate, and after the wall clock
        steps back the newest ticks must still be the newest in the store. A step back seen
        here (a replayed capture; the live agent tells ``clock_stepped`` itself) is an event."""
        last = self._last_ts
        if last is not None and ts < last + 0.001:
            if ts < last - CLOCK_STEP_SECONDS and not self._behind:
                if not self._step_noted:
                    self.clock_stepped(ts - last, at=last)
                self._behind = True  # one event per step, however long it takes to catch up
            ts = round(last + 0.001, 3)
        else:
            self._behind = False
        self._step_noted = False
        self._last_ts = ts
        return ts

    def clock_stepped(self, delta: float, at: float | None = None) -> None:
        """The wall clock jumped by ``delta`` seconds (NTP, a VM resumed): store the event and
        make the rates that span it unknown (``pcie_replay_rate_per_second``: reason
        "wall-clock step"). Ticks stay in order (``_stamp``)."""
        when = at if at is not None else (self._last_ts or 0.0)
        direction = "forward" if delta > 0 else "back"
        log.warning("wall clock stepped %s by %.3f s; rates across the step are unknown", direction, abs(delta))
        self._events.append(HostEvent(ts=when, kind="clock_step", subject="host", detail=f"{delta:+.3f} s ({direction})"))
        for uuid in list(self._replay_prev):
            self._replay_prev[uuid] = None
        self._step_noted = True

    def _take_events(self) -> tuple[HostEvent, ...]:
        if not self._events:
            return ()
        events, self._events = self._events, []
        return tuple(e if e.ts else replace(e, ts=self._now) for e in events)

    @staticmethod
    def _down_sample(gpu: GpuIdentity, ts: float, reason: str) -> GpuSample:
        return GpuSample(ts=ts, uuid=gpu.uuid, index=gpu.index, up=False, missing={"*": reason})

    def _library_failed(self, tick: int, error: NvmlCallError) -> None:
        failures = 1 if self._lib_down is None else self._lib_down[1] + 1
        if self._lib_down is None:
            log.error("NVML down: %s; re-initialising with back-off", _describe(error))
            self._event("nvml_down", "host", _describe(error))
        self._lib_down = (_describe(error), failures, tick + self._backoff(failures))

    def _retry_library(self, tick: int) -> bool:
        """Re-initialise NVML if the back-off allows; True when it is usable again."""
        assert self._lib_down is not None
        reason, failures, due = self._lib_down
        if tick < due:
            return False
        self.backend.shutdown()
        try:
            self._init(f"after {failures} tries ({reason})")
        except NvmlCallError as exc:
            self._lib_down = (_describe(exc), failures + 1, tick + self._backoff(failures + 1))
            return False
        log.warning("NVML usable again after %d tries (%s); %d GPU(s)", failures, reason, len(self.gpus))
        self._lib_down = None
        return True

    def _poll_xids(self) -> tuple[XidEvent, ...]:
        try:
            raw = self.backend.xid_poll()
        except NvmlCallError as exc:
            if exc.code != NOT_IN_CAPTURE and not self._xid_warned:
                log.warning("XID events unavailable: %s", exc.reason)
                self._xid_warned = True
            return ()
        if not raw:  # the common tick
            return ()
        by_index = {g.index: g.uuid for g in self.gpus}
        events = []
        for e in raw:
            uuid = by_index.get(e.get("index"))
            if uuid is None:
                continue
            xid = int(e["xid"])
            seq = self._xid_seq.get(uuid, 0)
            self._xid_seq[uuid] = seq + 1
            events.append(XidEvent(ts=float(e["ts"]), uuid=uuid, xid=xid, seq=seq))
            self._xid_counts.setdefault(uuid, Counter())[xid] += 1
            self._xid_last.setdefault(uuid, {})[xid] = float(e["ts"])
            log.warning("XID %d on GPU %s", xid, uuid)
        return tuple(events)

    def _with_xids(self, s: GpuSample) -> GpuSample:
        counts = self._xid_counts.get(s.uuid)
        if not counts:
            return s
        return replace(s, xid_counts=dict(counts), xid_last_seen=dict(self._xid_last[s.uuid]))

    def _fast_path(self, r: _Reader, gpu: GpuIdentity) -> _FastPath | None:
        """The device's straight-line reader, kept while its reader and "not supported" cache
        stay the same; ``None`` where the general path serves."""
        key = (r, gpu, r.unsupported.version, self._mem_api.get(gpu.index))
        if self._fast_built.get(gpu.index) == key:
            return self._fast[gpu.index]  # built (or refused: None) for this very state
        fp = self._fast[gpu.index] = _FastPath.build(self, r, gpu)
        self._fast_built[gpu.index] = key
        return fp

    def _sample_device(self, gpu: GpuIdentity, ts: float, slow: bool) -> GpuSample:
        r = self._reader(gpu.index, gpu)
        v: dict[str, Any] = {}
        fast = self._fast_path(r, gpu) if self.fast_path else None

        if fast is not None:
            fast.read(v)  # GPM included where the device has it
            if gpu.gpm_supported:
                self._crosscheck(r, gpu, ts, v, slow)
            else:
                v["activity_source"] = "utilization"
                self._pcie_throughput(r, gpu, ts, v)
        else:
            self._memory(r, gpu, v)
            self._utilization(r, v)
            if gpu.gpm_supported:
                v["activity_source"] = "gpm"
                self._gpm(r, gpu, v)
                self._crosscheck(r, gpu, ts, v, slow)
            else:
                v["activity_source"] = "utilization"
                self._pcie_throughput(r, gpu, ts, v)
            r.put("memory_temperature_celsius", r.field_value("memory_temperature_celsius", NVML_FI_DEV_MEMORY_TEMP), v)
            r.scalars(_FAST_SCALARS, v)
            pstate = r.q("performance_state", "nvmlDeviceGetPerformanceState")
            if pstate == NVML_PSTATE_UNKNOWN:
                r.missing["performance_state"] = "unknown"
            else:
                r.put("performance_state", pstate, v)
            self._processes(r, v)
        if slow:
            self._slow(r, gpu, ts, v)
        return GpuSample.of(ts, gpu.uuid, gpu.index, r.missing, v)

    def _memory(self, r: _Reader, gpu: GpuIdentity, v: dict[str, Any]) -> None:
        """Memory used/reserved/total through the API decided for this device since the last
        (re-)initialisation: v2 (driver-reserved memory apart) where the driver has it, else v1
        (whose ``used`` includes ~615 MiB reserved on the H200). A failed read is ``None`` for
        the tick — never a v1 value in a v2 series (a +615 MiB step a trend would take for a
        leak). A change of API across a re-initialisation is stored as an event."""
        api = self._mem_api.get(gpu.index)
        mem = None
        if api != "v1":
            mem = r.q("memory_used_bytes", "nvmlDeviceGetMemoryInfo", version=NVML_MEMORY_V2)
            if mem is not None and api is None:
                api = self._decide_memory_api(gpu, "v2")
            elif mem is None and api is None and r.missing.get("memory_used_bytes") in _PERMANENT_REASONS:
                api = self._decide_memory_api(gpu, "v1")
                r.missing.pop("memory_used_bytes", None)
        if api == "v1":
            mem = r.q("memory_used_bytes", "nvmlDeviceGetMemoryInfo")
            r.missing["memory_reserved_bytes"] = "memory v2 not available"
        if mem is None:
            if "memory_used_bytes" in r.missing:
                r.missing.setdefault("memory_total_bytes", r.missing["memory_used_bytes"])
            return
        r.put("memory_total_bytes", r.get("memory_total_bytes", mem, "total"), v)
        limit = v.get("memory_total_bytes", r.memory_limit)
        r.put("memory_used_bytes", r.get("memory_used_bytes", mem, "used"), v, limit=limit)
        if api == "v2":
            r.put("memory_reserved_bytes", r.get("memory_reserved_bytes", mem, "reserved"), v, limit=limit)

    @staticmethod
    def _utilization(r: _Reader, v: dict[str, Any]) -> None:
        util = r.q("utilization_gpu_ratio", "nvmlDeviceGetUtilizationRates")
        if util is not None:
            r.put("utilization_gpu_ratio", r.get("utilization_gpu_ratio", util, "gpu"), v, 0.01)
            r.put("utilization_memory_ratio", r.get("utilization_memory_ratio", util, "memory"), v, 0.01)
        elif "utilization_gpu_ratio" in r.missing:  # MIG mode: no device-level utilization
            r.missing["utilization_memory_ratio"] = r.missing["utilization_gpu_ratio"]

    def _decide_memory_api(self, gpu: GpuIdentity, api: str) -> str:
        self._mem_api[gpu.index] = api
        before = self._mem_api_of.get(gpu.uuid)
        self._mem_api_of[gpu.uuid] = api
        if before is not None and before != api:
            log.warning("GPU %d (%s): memory API %s → %s (used memory %s driver-reserved memory from now on)",
                        gpu.index, gpu.uuid, before, api, "includes" if api == "v1" else "excludes")
            self._event("memory_api_changed", f"gpu:{gpu.uuid}", f"{before} → {api}")
        return api

    def _processes(self, r: _Reader, v: dict[str, Any]) -> None:
        procs = r.q("processes", "nvmlDeviceGetComputeRunningProcesses")
        if procs is None:
            return
        if not isinstance(procs, list) or not all(isinstance(p, dict) for p in procs):
            r.missing["processes"] = f"rejected: malformed answer {str(procs)[:40]!r}"
            r.rejected["processes"] += 1
            return
        _admit_processes(r, v, [(p.get("pid"), p.get("usedGpuMemory")) for p in procs])

    def _slow(self, r: _Reader, gpu: GpuIdentity, ts: float, v: dict[str, Any]) -> None:
        for field, etype, counter in (
            ("ecc_corrected_volatile_total", NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC),
            ("ecc_uncorrected_volatile_total", NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC),
            ("ecc_corrected_aggregate_total", NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC),
            ("ecc_uncorrected_aggregate_total", NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC),
        ):
            r.put(field, r.q(field, "nvmlDeviceGetTotalEccErrors", etype, counter), v)
        for field, etype, location in (
            ("ecc_corrected_volatile_dram_total", NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_LOCATION_DRAM),
            ("ecc_uncorrected_volatile_dram_total", NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_MEMORY_LOCATION_DRAM),
            ("ecc_corrected_volatile_sram_total", NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_LOCATION_SRAM),
            ("ecc_uncorrected_volatile_sram_total", NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_MEMORY_LOCATION_SRAM),
        ):
            r.put(field, r.q(field, "nvmlDeviceGetMemoryErrorCounter", etype, NVML_VOLATILE_ECC, location), v)
        if self._minute_due:
            self._minute(r, gpu, ts, v)
        remap = r.q("remapped_rows_correctable_total", "nvmlDeviceGetRemappedRows")
        if isinstance(remap, list) and len(remap) == 4:
            for field, raw in zip(
                ("remapped_rows_correctable_total", "remapped_rows_uncorrectable_total", "remapped_rows_pending", "remapped_rows_failure"),
                remap,
            ):
                r.put(field, raw, v)
        elif remap is not None:
            r.get("remapped_rows_correctable_total", remap, "")  # malformed: counted as rejected
        elif "remapped_rows_correctable_total" in r.missing:
            # Pre-Ampere boards retire pages instead of remapping rows.
            sbe = r.q("retired_pages_single_bit_total", "nvmlDeviceGetRetiredPages", NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
            if isinstance(sbe, list):
                r.put("retired_pages_single_bit_total", len(sbe), v)
                dbe = r.q("retired_pages_double_bit_total", "nvmlDeviceGetRetiredPages", NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
                if isinstance(dbe, list):
                    r.put("retired_pages_double_bit_total", len(dbe), v)
                r.put("retired_pages_pending", r.q("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus"), v)
        r.put("power_limit_watts", r.q("power_limit_watts", "nvmlDeviceGetEnforcedPowerLimit"), v, 1e-3)
        r.put("persistence_mode", r.q("persistence_mode", "nvmlDeviceGetPersistenceMode"), v)
        r.put("compute_mode", r.q("compute_mode", "nvmlDeviceGetComputeMode"), v)

    def _minute(self, r: _Reader, gpu: GpuIdentity, ts: float, v: dict[str, Any]) -> None:
        """The minute set (``MINUTE_SECONDS``): the calls that cost the driver most CPU."""
        r.put("energy_joules_total", r.q("energy_joules_total", "nvmlDeviceGetTotalEnergyConsumption"), v, 1e-3)
        bar1 = r.q("bar1_used_bytes", "nvmlDeviceGetBAR1MemoryInfo")
        if bar1 is not None:
            r.put("bar1_total_bytes", r.get("bar1_total_bytes", bar1, "bar1Total"), v)
            r.put("bar1_used_bytes", r.get("bar1_used_bytes", bar1, "bar1Used"), v, limit=v.get("bar1_total_bytes"))
        r.put("pcie_replay_total", r.q("pcie_replay_total", "nvmlDeviceGetPcieReplayCounter"), v)
        replays = v.get("pcie_replay_total")
        if replays is not None:
            stepped = gpu.uuid in self._replay_prev and self._replay_prev[gpu.uuid] is None
            prev = self._replay_prev.get(gpu.uuid)
            self._replay_prev[gpu.uuid] = (ts, replays)
            if stepped:
                r.missing["pcie_replay_rate_per_second"] = "wall-clock step"
            elif prev is not None and ts > prev[0]:
                if replays >= prev[1]:
                    v["pcie_replay_rate_per_second"] = (replays - prev[1]) / (ts - prev[0])
                else:  # driver reload or reset: the counter restarted; no negative rate
                    r.missing["pcie_replay_rate_per_second"] = "counter reset"
        for field, policy in (
            ("violation_power_seconds_total", NVML_PERF_POLICY_POWER),
            ("violation_thermal_seconds_total", NVML_PERF_POLICY_THERMAL),
        ):
            status = r.q(field, "nvmlDeviceGetViolationStatus", policy)
            r.put(field, r.get(field, status, "violationTime"), v, 1e-9)
        mig = r.q("mig_mode", "nvmlDeviceGetMigMode")
        if isinstance(mig, list) and mig:
            r.put("mig_mode", mig[0], v)
        elif mig is not None:
            r.get("mig_mode", mig, "")

    def _gpm(self, r: _Reader, gpu: GpuIdentity, v: dict[str, Any]) -> None:
        watch = r.watch
        if watch is not None:
            watch.fn = "nvmlGpmSampleGet"
        try:
            metrics = self.backend.gpm(gpu.index, GPM_METRICS)
            if watch is not None and watch.generation != r.generation:
                watch.returned(gpu.index, "nvmlGpmSampleGet")
        except NvmlCallError as exc:
            if watch is not None and watch.generation != r.generation:
                watch.returned(gpu.index, "nvmlGpmSampleGet")
            self._gpm_failed(r, exc)
            return
        if metrics is None:  # first GPM sample of this device: no interval to average over yet
            for field in _GPM_FIELDS.values():
                r.missing[field] = "GPM: first sample, no interval yet"
            return
        spec, pcie_limit = r.spec, r.pcie_limit
        for metric_id, field in _GPM_FIELDS.items():
            value = metrics.get(metric_id)
            if value.__class__ is float:  # the common case, inline: a float inside the field's range
                lo, hi = spec[field][:2]
                if metric_id in _GPM_PCIE:  # MiB/s
                    x = value * _MIB
                    if lo <= x <= hi and (pcie_limit is None or x <= pcie_limit * (1 + 1e-6)):
                        v[field] = x
                        continue
                else:  # percent
                    x = value * 0.01
                    if lo <= x <= hi:
                        v[field] = x
                        continue
            if isinstance(value, NvmlCallError):
                r.missing[field] = f"GPM: {value.reason}"
            elif metric_id in _GPM_PCIE:
                r.put(field, value, v, _MIB, pcie_limit)
            else:
                r.put(field, value, v, 0.01)

    @staticmethod
    def _gpm_failed(r: _Reader, exc: NvmlCallError) -> None:
        """The GPM pair failed as a whole: its fields are ``None`` with the reason.

        Raises:
            DeviceDown: on a lifecycle error.
        """
        if exc.is_lifecycle:
            raise DeviceDown(exc) from None
        for field in _GPM_FIELDS.values():
            r.missing[field] = f"GPM: {exc.reason}"

    def _crosscheck(self, r: _Reader, gpu: GpuIdentity, ts: float, v: dict[str, Any], slow: bool) -> None:
        """Keep GPM's PCIe figures honest: on slow ticks, compare them with the newest
        ``nvmlDeviceGetPcieThroughput`` reading (taken on the backend's poller thread, never on
        this one: the call blocks ~21 ms per direction; the byte counters 197/198 cannot serve,
        they wrap within ~70 ms at full rate, FACTS §1). GPM below ``CROSSCHECK_RATIO`` of it
        while it reads above ``CROSSCHECK_MIN_BPS``, ``CROSSCHECK_STRIKES`` checks in a row, is a
        collector fault (a known exporter failure: a PCIe rate of 0 during a 56 GB/s copy), not
        an idle link: stored as an event, and GPM's PCIe values are withheld until a check
        agrees again."""
        history = self._gpm_history.get(gpu.uuid)
        if history is None:
            history = self._gpm_history[gpu.uuid] = deque(maxlen=CROSSCHECK_HISTORY)
        history.append((ts, v.get("pcie_tx_bytes_per_second"), v.get("pcie_rx_bytes_per_second")))
        if slow:
            self._crosscheck_once(r, gpu, history)
        fault = self._pcie_fault.get(gpu.uuid)
        if fault is not None:
            for f in ("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second"):
                v.pop(f, None)
                r.missing[f] = f"collector fault: {fault}"

    def _crosscheck_once(self, r: _Reader, gpu: GpuIdentity, history: deque[tuple[float, Any, Any]]) -> None:
        try:
            latest = self.backend.pcie_throughput(gpu.index, period=CROSSCHECK_POLL_SECONDS)
        except NvmlCallError as exc:
            if exc.is_lifecycle:
                raise DeviceDown(exc) from None
            return  # not supported, or not in this capture: nothing to compare with
        at = latest.get("ts") if isinstance(latest, dict) else None
        if not isinstance(at, (int, float)) or at == self._crosschecked.get(gpu.uuid):
            return  # no reading yet, or the one already compared
        # the GPM tick whose interval holds the reading (GPM averages over the tick before it)
        match = next((h for h in history if h[0] >= at), None)
        if match is None:
            return
        self._crosschecked[gpu.uuid] = at
        worst = None
        for name, gpm_value, key in (("TX", match[1], "tx_KBps"), ("RX", match[2], "rx_KBps")):
            other = latest.get(key)
            if not isinstance(other, (int, float)) or gpm_value is None:
                continue
            other_bps = other * 1000.0  # NVML "KB" is 1000 bytes (FACTS §1)
            if other_bps > CROSSCHECK_MIN_BPS and gpm_value < CROSSCHECK_RATIO * other_bps:
                worst = f"GPM PCIe {name} {gpm_value / 1e9:.2f} GB/s while nvmlDeviceGetPcieThroughput reads {other_bps / 1e9:.2f} GB/s"
        strikes = self._pcie_strikes.get(gpu.uuid, 0)
        if worst is None:
            self._pcie_strikes[gpu.uuid] = 0
            if gpu.uuid in self._pcie_fault:
                log.warning("GPU %d (%s): GPM PCIe agrees with the throughput call again", gpu.index, gpu.uuid)
                self._event("collector_fault_cleared", f"gpu:{gpu.uuid}", self._pcie_fault.pop(gpu.uuid))
            return
        strikes += 1
        self._pcie_strikes[gpu.uuid] = strikes
        if strikes >= CROSSCHECK_STRIKES and gpu.uuid not in self._pcie_fault:
            detail = f"{worst} ({strikes} checks in a row)"
            log.error("GPU %d (%s): collector fault: %s; GPM PCIe figures withheld", gpu.index, gpu.uuid, detail)
            self._pcie_fault[gpu.uuid] = detail
            self._event("collector_fault", f"gpu:{gpu.uuid}", detail)

    def _pcie_throughput(self, r: _Reader, gpu: GpuIdentity, ts: float, v: dict[str, Any]) -> None:
        """Pre-Hopper PCIe bytes/s: the newest reading of the backend's throughput poller (a
        20 ms window every few seconds, not an average over the tick)."""
        fields = ("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second")
        key = ("pcie_throughput", (), ())
        if key in r.unsupported:
            for f in fields:
                r.missing[f] = "not supported"
            return
        try:
            latest = self.backend.pcie_throughput(gpu.index)
        except NvmlCallError as exc:
            if exc.is_lifecycle:
                raise DeviceDown(exc) from None
            if exc.code in _PERMANENT:
                r.unsupported.add(key)
            for f in fields:
                r.missing[f] = exc.reason
            return
        at = r.get(fields[0], latest, "ts")
        if not isinstance(at, (int, float)) or abs(ts - float(at)) > PCIE_THROUGHPUT_MAX_AGE_S:
            for f in fields:
                r.missing.setdefault(f, "PCIe throughput: no recent reading")
            return
        for f, k in zip(fields, ("tx_KBps", "rx_KBps")):
            r.put(f, r.get(f, latest, k), v, 1000.0, r.pcie_limit)  # NVML "KB" is 1000 bytes (FACTS §1)

    def close(self) -> None:
        """Release NVML (never raises). Not while a call is stuck: shutting the library down
        under a thread that is inside it can hang as well, and the process is exiting anyway."""
        if self._wedged:
            log.warning("NVML not shut down: %s %s not returned", ", ".join(f"{fn} on GPU {i}" for i, (fn, _) in self._wedged.items()),
                        "has" if len(self._wedged) == 1 else "have")
            return
        self.backend.shutdown()
