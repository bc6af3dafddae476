"""NVML backends: the one place where vgpumon talks to libnvidia-ml.

Three backends share one small interface so that the collector (``vgpumon.sources.nvml``) is the
same code on hardware, while recording, and while replaying:

* ``LiveBackend`` calls ``pynvml`` (the ``nvidia-ml-py`` distribution).
* ``RecordingBackend`` wraps another backend and writes every call's answer, or its error code,
  per tick to a capture file.
* ``ReplayBackend`` answers the same calls from a capture, tick by tick, keeping the capture's
  timestamps.

Every answer crosses the interface as plain data (``int``, ``float``, ``str``, ``None``, lists,
dicts of struct fields), so a capture is plain JSON and a replay cannot tell itself apart from the
hardware. Errors cross it as ``NvmlCallError`` carrying NVML's return code.

Capture format (JSON Lines, gzip when the file name ends in ``.gz``)::

    {"vgpumon_capture": 1, "created": "...", "host": "...", "masked": true, ...}   header
    {"tick": -1, "ts": 1764467000.1, "calls": [[scope, fn, args, kwargs, outcome], ...]}  init
    {"tick": 0,  "ts": 1764467001.1, "calls": [...]}                                 one per tick

``scope`` is ``"sys"`` or the device index; ``outcome`` is ``{"v": value}`` or ``{"e": code}``,
with ``"d"``: the call's duration in seconds when it took 1 ms or more (a replay reproduces 10 ms
or more: a slow or wedged call).
The ``gpm`` pseudo-call records GPM metric outputs: ``{"v": {"<metric id>": value or {"e": code}}}``
or ``{"v": null}`` for the first sample of a device, which has no pair yet.
"""

from __future__ import annotations

import ctypes
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Protocol, TypeAlias

from vgpumon.model.gpu import GPU_LOST_REASON
from vgpumon.sources.nvml.plain import to_plain
from vgpumon.sources.nvml.shapes import NvmlAnswer, NvmlArg, NvmlHandle, PcieReading, RawXid

if TYPE_CHECKING:
    from vgpumon.sources.nvml.fastcalls import BoundCall, FastCalls, Parts, ScalarCall

CAPTURE_FORMAT_VERSION = 1

# NVML return codes (nvml.h ``nvmlReturn_t``) the collector distinguishes.
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_UNKNOWN = 999
#: Not an NVML code: the capture being replayed holds no answer for this call.
NOT_IN_CAPTURE = -1

ERROR_NAMES: dict[int, str] = {
    NVML_ERROR_UNINITIALIZED: "uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "invalid argument",
    NVML_ERROR_NOT_SUPPORTED: "not supported",
    NVML_ERROR_NO_PERMISSION: "no permission",
    NVML_ERROR_NOT_FOUND: "not found",
    NVML_ERROR_DRIVER_NOT_LOADED: "NVIDIA driver not loaded",
    NVML_ERROR_TIMEOUT: "timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML library (libnvidia-ml.so.1) not found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "function not found in this driver",
    NVML_ERROR_GPU_IS_LOST: GPU_LOST_REASON,
    NVML_ERROR_RESET_REQUIRED: "GPU requires reset",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "NVML library / kernel driver version mismatch",
    NVML_ERROR_DEPRECATED: "deprecated",
    NVML_ERROR_GPU_NOT_FOUND: "GPU not found",
    NVML_ERROR_UNKNOWN: "unknown error",
    NOT_IN_CAPTURE: "not in capture",
}

#: Codes after which the device (or the whole library) must be re-acquired, not just one field.
LIFECYCLE_ERRORS = frozenset(
    {
        NVML_ERROR_UNINITIALIZED,
        NVML_ERROR_DRIVER_NOT_LOADED,
        NVML_ERROR_GPU_IS_LOST,
        NVML_ERROR_RESET_REQUIRED,
        NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        NVML_ERROR_GPU_NOT_FOUND,
        NVML_ERROR_UNKNOWN,
    }
)


class NvmlCallError(Exception):
    """An NVML call failed.

    Attributes:
        code: NVML return code (``nvmlReturn_t``), or ``NOT_IN_CAPTURE`` in a replay.
        fn: the NVML function name, e.g. ``"nvmlDeviceGetPowerUsage"``.
    """

    def __init__(self, code: int, fn: str = "") -> None:
        self.code = code
        self.fn = fn
        super().__init__(f"{fn}: {self.reason}" if fn else self.reason)

    @property
    def reason(self) -> str:
        """Short human reason, e.g. ``"not supported"``."""
        return ERROR_NAMES.get(self.code, f"NVML error {self.code}")

    @property
    def is_lifecycle(self) -> bool:
        """True when the device or library is down, not just one field unavailable."""
        return self.code in LIFECYCLE_ERRORS


class EndOfCapture(Exception):
    """A replay has answered its last tick."""


#: ``NvmlBackend.gpm``'s answer: metric id → value (percent or MiB/s), or that metric's error.
GpmValues: TypeAlias = dict[int, float | NvmlCallError]


class NvmlBackend(Protocol):
    """What the collector needs from NVML. All answers are plain data (see module docstring)."""

    def init(self) -> None:
        """``nvmlInit``. Raises ``NvmlCallError`` (e.g. library not found, driver not loaded)."""

    def shutdown(self) -> None:
        """``nvmlShutdown``; never raises."""

    def begin_tick(self, ts: float) -> float:
        """Mark the start of a tick and return its timestamp (a replay returns the capture's).

        Raises ``EndOfCapture`` when a replay has no more ticks.
        """

    def system(self, fn: str, *args: NvmlArg) -> NvmlAnswer:
        """Call a device-less NVML function (``nvmlSystemGet*``, ``nvmlDeviceGetCount``)."""

    def device(self, index: int, fn: str, *args: NvmlArg, **kwargs: NvmlArg) -> NvmlAnswer:
        """Call ``fn(handle_of(index), *args, **kwargs)``; raises ``NvmlCallError``."""

    def gpm(self, index: int, metric_ids: Sequence[int]) -> GpmValues | None:
        """Take a GPM sample and compute ``metric_ids`` over it and the previous one.

        Returns ``None`` for the first sample of a device (no pair yet), else metric id → value
        (in NVML's unit: percent or MiB/s) or ``NvmlCallError`` for a metric that failed.
        """

    def forget_device(self, index: int) -> None:
        """Drop the cached handle and GPM sample of a device (after a lifecycle error)."""

    def xid_poll(self) -> list[RawXid]:
        """XID events seen since the last poll: ``[{"index": i, "xid": code, "ts": epoch_s}]``.

        Live: a waiter thread blocks in ``nvmlEventSetWait`` (registered for
        ``nvmlEventTypeXidCriticalError`` on every device) and queues events; this drains the
        queue without blocking. XIDs raised before registration are lost (NVML keeps none).

        Raises:
            NvmlCallError: events cannot be had (live: no event set on this host; raised when a
                try to set one up fails, retried each minute, ``[]`` between the tries).
        """

    def pcie_throughput(self, index: int, period: float | None = None) -> PcieReading | None:
        """Latest ``nvmlDeviceGetPcieThroughput`` reading of a device, polled on its own thread.

        The call blocks ~21 ms per direction (it samples a 20 ms window), so it never runs on the
        sampling thread. Returns ``{"tx_KBps": x, "rx_KBps": y, "ts": epoch_s}`` (KB = 1000 bytes),
        ``None`` before the first poll; raises ``NvmlCallError`` if the last poll failed.
        ``period=seconds`` sets how often the device is polled (GPM GPUs are polled rarely,
        only to cross-check GPM's PCIe figures); the backend's default otherwise.
        """


_PLAIN = frozenset({bool, int, float, str})


@dataclass(slots=True)
class _GpmState:
    """A device's two GPM sample buffers and the two requests that pair them (``gpm_flat``)."""

    ids: tuple[int, ...]
    bufs: list[NvmlAnswer]  # nvmlGpmSample_t: opaque pointers nvidia-ml-py allocated
    reqs: list[tuple[ctypes.Structure, ctypes._CArgObject]]  # (c_nvmlGpmMetricsGet_t, byref of it)
    get: Callable[[NvmlHandle, NvmlAnswer], int]  # C nvmlGpmSampleGet
    metrics: Callable[[ctypes._CArgObject], int]  # C nvmlGpmMetricsGet
    unpack: tuple[int, struct.Struct]
    cur: int = 0
    have_prev: bool = False


def _gpm_results(nv: ModuleType, n: int) -> tuple[int, struct.Struct]:
    """Where the (return code, value) pairs of ``n`` GPM metrics lie in a
    ``nvmlGpmMetricsGet_t`` and the one ``struct`` that reads them all (layout from nvidia-ml-py)."""
    metric = nv.c_nvmlGpmMetric_t
    base, size = nv.c_nvmlGpmMetricsGet_t.metrics.offset, ctypes.sizeof(metric)
    ret_off, val_off = metric.nvmlReturn.offset, metric.value.offset
    fmt, pos = "=", base + ret_off
    for i in range(n):
        r, v = base + i * size + ret_off, base + i * size + val_off
        fmt += "x" * (r - pos) + "I"
        fmt += "x" * (v - r - 4) + "d"
        pos = v + 8
    return base + ret_off, struct.Struct(fmt)


class LiveBackend:
    """NVML through ``pynvml`` (nvidia-ml-py). One instance per process. The collector calls it
    from its one worker thread; the XID waiter and the PCIe throughput poller are threads of
    this backend (NVML itself is thread-safe).

    Args:
        pynvml_module: the ``pynvml`` module (imported on first use when ``None``).
        pcie_poll_seconds: period of the ``nvmlDeviceGetPcieThroughput`` poller (non-GPM GPUs).
    """

    def __init__(self, pynvml_module: ModuleType | None = None, *, pcie_poll_seconds: float = 5.0) -> None:
        self._nvml = pynvml_module
        self._handles: dict[int, NvmlHandle] = {}
        self._gpm_prev: dict[int, _GpmState] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._xid_queue: list[RawXid] = []
        self._xid_thread: threading.Thread | None = None
        self._xid_error: NvmlCallError | None = None
        self._xid_retry_at = 0.0  # monotonic: when to try creating the event set again
        self._pcie_poll_seconds = pcie_poll_seconds
        self._pcie_wanted: dict[int, float] = {}  # device index → poll period (s)
        self._pcie_due: dict[int, float] = {}  # device index → monotonic time of its next poll
        self._pcie_wake = threading.Event()
        self._pcie_latest: dict[int, PcieReading | NvmlCallError] = {}
        self._pcie_thread: threading.Thread | None = None
        self._fast: FastCalls | None = None  # from init()
        self._bound: dict[int, dict[str, BoundCall]] = {}
        self._parts: dict[int, Parts] = {}

    def _lib(self) -> ModuleType:
        if self._nvml is None:
            import pynvml  # deferred: importing is cheap, but the CLI must start without it

            self._nvml = pynvml
        return self._nvml

    def _wrap(self, fn: str, call: Callable[..., NvmlAnswer], *args: NvmlArg, **kwargs: NvmlArg) -> NvmlAnswer:
        nv = self._lib()
        try:
            return call(*args, **kwargs)
        except nv.NVMLError as exc:
            raise NvmlCallError(int(exc.value), fn) from None

    def init(self) -> None:
        nv = self._lib()
        self._wrap("nvmlInit", nv.nvmlInit)
        self._stop.clear()
        from vgpumon.sources.nvml.fastcalls import FastCalls

        # the per-tick calls straight through ctypes (vgpumon.sources.nvml.fastcalls): the same answers
        # as nvidia-ml-py's wrappers, without their per-call Python
        self._fast = FastCalls(nv, NvmlCallError)
        self._bound.clear()
        self._parts.clear()

    def shutdown(self) -> None:
        self._stop.set()
        self._pcie_wake.set()
        for thread in (self._xid_thread, self._pcie_thread):
            if thread is not None:
                thread.join(timeout=3.0)
        self._xid_thread = self._pcie_thread = None
        for index in list(self._gpm_prev):
            self._free_gpm(index)
        self._handles.clear()
        self._bound.clear()
        self._parts.clear()
        self._fast = None
        try:
            self._lib().nvmlShutdown()
        except Exception:  # noqa: BLE001, S110 - shutdown must never raise
            pass

    def begin_tick(self, ts: float) -> float:
        return ts

    def system(self, fn: str, *args: NvmlArg) -> NvmlAnswer:
        call = getattr(self._lib(), fn, None)
        if call is None:
            raise NvmlCallError(NVML_ERROR_FUNCTION_NOT_FOUND, fn)
        return to_plain(self._wrap(fn, call, *args))

    def _handle(self, index: int) -> NvmlHandle:
        handle = self._handles.get(index)
        if handle is None:
            nv = self._lib()
            handle = self._wrap("nvmlDeviceGetHandleByIndex", nv.nvmlDeviceGetHandleByIndex, index)
            self._handles[index] = handle
        return handle

    def bound_calls(self, index: int) -> dict[str, BoundCall]:
        """The per-tick calls of device ``index`` straight through ctypes
        (``vgpumon.sources.nvml.fastcalls``), by nvidia-ml-py name: ``calls[fn](*args, **kwargs)``
        answers as ``device(index, fn, *args, **kwargs)`` does, without its dispatch. Empty
        before ``init()``.

        Raises:
            NvmlCallError: the device's handle cannot be had.
        """
        bound = self._bound.get(index)
        if bound is None:
            if self._fast is None:
                return {}
            bound = self._bound[index] = self._fast.bind(self._handle(index))
        return bound

    def fast_parts(self, index: int, scalar_calls: Sequence[ScalarCall] = ()) -> Parts | None:
        """Device ``index``'s fast-set C functions and out-structs (``nvml_fast.Parts``) for the
        collector's straight-line reader, with an out value for each of ``scalar_calls``
        (``(function, args)``; the collector's plan, the same on every call); ``None`` before
        ``init()``. Dropped with the handle.

        Raises:
            NvmlCallError: the device's handle cannot be had.
        """
        parts = self._parts.get(index)
        if parts is None:
            if self._fast is None:
                return None
            parts = self._parts[index] = self._fast.parts(self._handle(index), scalar_calls)
        return parts

    def device(self, index: int, fn: str, *args: NvmlArg, **kwargs: NvmlArg) -> NvmlAnswer:
        bound = self._bound.get(index)
        fast = None if bound is None else bound.get(fn)
        if fast is not None:
            return fast(*args, **kwargs)
        nv = self._lib()
        call = getattr(nv, fn, None)
        if call is None:  # this nvidia-ml-py has no binding for it
            raise NvmlCallError(NVML_ERROR_FUNCTION_NOT_FOUND, fn)
        handle = self._handles.get(index)
        if handle is None:
            handle = self._handle(index)
        try:
            value = call(handle, *args, **kwargs)
        except nv.NVMLError as exc:
            raise NvmlCallError(int(exc.value), fn) from None
        if value is None or value.__class__ in _PLAIN:
            return value
        return to_plain(value)

    def gpm(self, index: int, metric_ids: Sequence[int]) -> GpmValues | None:
        flat = self.gpm_flat(index, metric_ids)
        if flat is None:
            return None
        out: GpmValues = {}
        for i, metric_id in enumerate(metric_ids):
            code = int(flat[2 * i])  # the metric's nvmlReturn (read as "I")
            out[metric_id] = flat[2 * i + 1] if code == 0 else NvmlCallError(code, "nvmlGpmMetricsGet")
        return out

    def gpm_flat(self, index: int, metric_ids: Sequence[int]) -> tuple[float, ...] | None:
        """``gpm`` without the dict: ``(code, value)`` of each of ``metric_ids`` in turn, flat
        (``flat[2 * i]`` is metric i's ``nvmlReturn``, 0 when ``flat[2 * i + 1]`` holds its value,
        percent or MiB/s); ``None`` for a device's first sample (no pair yet).

        Raises:
            NvmlCallError: ``nvmlGpmSampleGet`` or ``nvmlGpmMetricsGet`` failed as a whole.
        """
        # Two sample buffers and two requests per device, made once: the buffers alternate as
        # "previous" and "current" and each request already points at its pair, so a tick costs
        # one nvmlGpmSampleGet and one nvmlGpmMetricsGet, and the results are read from the
        # request's memory in one unpack (nvidia-ml-py's structs read each field through Python).
        state = self._gpm_prev.get(index)
        if state is None or (state.ids is not metric_ids and state.ids != tuple(metric_ids)):
            state = self._gpm_state(index, tuple(metric_ids))
        handle = self._handles.get(index)
        if handle is None:
            handle = self._handle(index)
        cur = state.cur
        ret = state.get(handle, state.bufs[cur])
        if ret:
            raise NvmlCallError(ret, "nvmlGpmSampleGet")
        state.cur = 1 - cur
        if not state.have_prev:
            state.have_prev = True
            return None
        req, ref = state.reqs[cur]
        ret = state.metrics(ref)
        if ret:
            raise NvmlCallError(ret, "nvmlGpmMetricsGet")
        offset, fmt = state.unpack
        return fmt.unpack_from(req, offset)

    def _gpm_state(self, index: int, metric_ids: tuple[int, ...]) -> _GpmState:
        nv = self._lib()
        self._free_gpm(index)
        bufs = [self._wrap("nvmlGpmSampleAlloc", nv.nvmlGpmSampleAlloc) for _ in range(2)]
        reqs = []
        for first, second in ((bufs[1], bufs[0]), (bufs[0], bufs[1])):  # by the buffer just taken
            req = nv.c_nvmlGpmMetricsGet_t()
            req.version = nv.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = len(metric_ids)
            req.sample1, req.sample2 = first, second
            for i, metric_id in enumerate(metric_ids):
                req.metrics[i].metricId = metric_id
            reqs.append((req, ctypes.byref(req)))
        state = self._gpm_prev[index] = _GpmState(
            ids=metric_ids, bufs=bufs, reqs=reqs,
            get=nv._nvmlGetFunctionPointer("nvmlGpmSampleGet"),
            metrics=nv._nvmlGetFunctionPointer("nvmlGpmMetricsGet"),
            unpack=_gpm_results(nv, len(metric_ids)),
        )
        return state

    def _free_gpm(self, index: int) -> None:
        state = self._gpm_prev.pop(index, None)
        if state is not None:
            for buf in state.bufs:
                try:
                    self._lib().nvmlGpmSampleFree(buf)
                except Exception:  # noqa: BLE001, S110 - a lost device may refuse; nothing to do
                    pass

    def forget_device(self, index: int) -> None:
        self._handles.pop(index, None)
        self._bound.pop(index, None)
        self._parts.pop(index, None)
        self._free_gpm(index)

    # XID events ---------------------------------------------------------------------------------

    def xid_poll(self) -> list[RawXid]:
        if self._xid_thread is None:
            if self._xid_error is not None and time.monotonic() < self._xid_retry_at:
                # no event set on this host: asked again each minute, not each tick; the error
                # was raised when it happened (a raise per tick costs more than the tick's calls)
                return []
            try:
                self._xid_error = None
                self._start_xid_waiter()
            except NvmlCallError as exc:
                self._xid_error, self._xid_retry_at = exc, time.monotonic() + 60.0
                raise
        if self._xid_error is not None:
            raise self._xid_error
        if not self._xid_queue:  # the common tick: nothing queued, no lock taken
            return []
        with self._lock:
            events, self._xid_queue = self._xid_queue, []
        return events

    def _start_xid_waiter(self) -> None:
        nv = self._lib()
        event_set = self._wrap("nvmlEventSetCreate", nv.nvmlEventSetCreate)
        count = self._wrap("nvmlDeviceGetCount", nv.nvmlDeviceGetCount)
        by_address: dict[int | None, int] = {}
        registered = 0
        for index in range(count):
            try:
                handle = self._handle(index)
                self._wrap(
                    "nvmlDeviceRegisterEvents", nv.nvmlDeviceRegisterEvents, handle, nv.nvmlEventTypeXidCriticalError, event_set
                )
            except NvmlCallError:
                continue  # not supported on this device (or it is down): others still report
            by_address[ctypes.cast(handle, ctypes.c_void_p).value] = index
            registered += 1
        if not registered:
            self._xid_error = NvmlCallError(NVML_ERROR_NOT_SUPPORTED, "nvmlDeviceRegisterEvents")
            nv.nvmlEventSetFree(event_set)
        self._xid_thread = threading.Thread(
            target=self._xid_wait_loop, args=(event_set, by_address, registered > 0), name="vgpumon-xid", daemon=True
        )
        self._xid_thread.start()

    def _xid_wait_loop(self, event_set: NvmlAnswer, by_address: dict[int | None, int], active: bool) -> None:
        from vgpumon.base.workers import name_os_thread

        name_os_thread()
        nv = self._lib()
        while active and not self._stop.is_set():
            try:
                # 2 s: each empty wake-up costs ~0.1 ms of CPU (a profile of the agent on the
                # H200 found the waiter at 8 % of the agent's CPU with 0.5 s); stop waits ≤ 2 s.
                data = nv.nvmlEventSetWait_v2(event_set, 2000)
            except nv.NVMLError as exc:
                if int(exc.value) != NVML_ERROR_TIMEOUT:
                    self._stop.wait(1.0)  # a GPU went away mid-wait: retry, do not spin
                continue
            index = by_address.get(ctypes.cast(data.device, ctypes.c_void_p).value)
            with self._lock:
                self._xid_queue.append({"index": index, "xid": int(data.eventData), "ts": time.time()})
        if active:
            try:
                nv.nvmlEventSetFree(event_set)
            except Exception:  # noqa: BLE001, S110 - shutting down
                pass

    # PCIe throughput (pre-Hopper path) ----------------------------------------------------------

    def pcie_throughput(self, index: int, period: float | None = None) -> PcieReading | None:
        with self._lock:
            wanted = period or self._pcie_poll_seconds
            if self._pcie_wanted.get(index) != wanted:
                self._pcie_wanted[index] = wanted
                self._pcie_wake.set()
            latest = self._pcie_latest.get(index)
        if self._pcie_thread is None:
            self._pcie_thread = threading.Thread(target=self._pcie_loop, name="vgpumon-pcie", daemon=True)
            self._pcie_thread.start()
        if isinstance(latest, NvmlCallError):
            raise latest
        return latest

    def _pcie_loop(self) -> None:
        from vgpumon.base.workers import name_os_thread

        name_os_thread()
        nv = self._lib()
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                wanted = dict(self._pcie_wanted)
            for index, period in sorted(wanted.items()):
                if self._pcie_due.get(index, 0.0) > now:
                    continue
                self._pcie_due[index] = now + period
                try:
                    handle = self._handle(index)
                    tx = self._wrap("nvmlDeviceGetPcieThroughput", nv.nvmlDeviceGetPcieThroughput, handle, 0)
                    rx = self._wrap("nvmlDeviceGetPcieThroughput", nv.nvmlDeviceGetPcieThroughput, handle, 1)
                    result: PcieReading | NvmlCallError = {"tx_KBps": int(tx), "rx_KBps": int(rx), "ts": time.time()}
                except NvmlCallError as exc:
                    result = exc
                with self._lock:
                    self._pcie_latest[index] = result
            due = [self._pcie_due[i] for i in wanted if i in self._pcie_due]
            self._pcie_wake.clear()
            timeout = max(0.05, min(due) - time.monotonic()) if due else self._pcie_poll_seconds
            if self._pcie_wake.wait(timeout):
                continue
            if self._stop.is_set():
                break


# --- capture file ---------------------------------------------------------------------------



















