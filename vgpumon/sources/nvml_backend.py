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
import datetime as _dt
import gzip
import io
import itertools
import json
import math
import socket
import struct
import threading
import time
import zlib
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Mapping, Protocol, Sequence

from vgpumon.base.errors import CaptureFormatError
from vgpumon.model.gpu import GPU_LOST_REASON
from vgpumon.sources.nvml_plain import to_plain

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

    def system(self, fn: str, *args: Any) -> Any:
        """Call a device-less NVML function (``nvmlSystemGet*``, ``nvmlDeviceGetCount``)."""

    def device(self, index: int, fn: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``fn(handle_of(index), *args, **kwargs)``; raises ``NvmlCallError``."""

    def gpm(self, index: int, metric_ids: Sequence[int]) -> dict[int, Any] | None:
        """Take a GPM sample and compute ``metric_ids`` over it and the previous one.

        Returns ``None`` for the first sample of a device (no pair yet), else metric id → value
        (in NVML's unit: percent or MiB/s) or ``NvmlCallError`` for a metric that failed.
        """

    def forget_device(self, index: int) -> None:
        """Drop the cached handle and GPM sample of a device (after a lifecycle error)."""

    def xid_poll(self) -> list[dict[str, Any]]:
        """XID events seen since the last poll: ``[{"index": i, "xid": code, "ts": epoch_s}]``.

        Live: a waiter thread blocks in ``nvmlEventSetWait`` (registered for
        ``nvmlEventTypeXidCriticalError`` on every device) and queues events; this drains the
        queue without blocking. XIDs raised before registration are lost (NVML keeps none).

        Raises:
            NvmlCallError: events cannot be had (live: no event set on this host; raised when a
                try to set one up fails, retried each minute, ``[]`` between the tries).
        """

    def pcie_throughput(self, index: int, **kwargs: Any) -> dict[str, Any] | None:
        """Latest ``nvmlDeviceGetPcieThroughput`` reading of a device, polled on its own thread.

        The call blocks ~21 ms per direction (it samples a 20 ms window), so it never runs on the
        sampling thread. Returns ``{"tx_KBps": x, "rx_KBps": y, "ts": epoch_s}`` (KB = 1000 bytes),
        ``None`` before the first poll; raises ``NvmlCallError`` if the last poll failed.
        ``period=seconds`` sets how often the device is polled (GPM GPUs are polled rarely,
        only to cross-check GPM's PCIe figures); the backend's default otherwise.
        """


_PLAIN = frozenset({bool, int, float, str})
def _gpm_results(nv: Any, n: int) -> tuple[int, struct.Struct]:
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

    def __init__(self, pynvml_module: Any = None, *, pcie_poll_seconds: float = 5.0) -> None:
        self._nvml = pynvml_module
        self._handles: dict[int, Any] = {}
        self._gpm_prev: dict[int, Any] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._xid_queue: list[dict[str, Any]] = []
        self._xid_thread: threading.Thread | None = None
        self._xid_error: NvmlCallError | None = None
        self._xid_retry_at = 0.0  # monotonic: when to try creating the event set again
        self._pcie_poll_seconds = pcie_poll_seconds
        self._pcie_wanted: dict[int, float] = {}  # device index → poll period (s)
        self._pcie_due: dict[int, float] = {}  # device index → monotonic time of its next poll
        self._pcie_wake = threading.Event()
        self._pcie_latest: dict[int, Any] = {}
        self._pcie_thread: threading.Thread | None = None
        self._fast: Any = None  # vgpumon.sources.nvml_fast.FastCalls, from init()
        self._bound: dict[int, dict[str, Any]] = {}
        self._parts: dict[int, Any] = {}  # index → nvml_fast.Parts

    def _lib(self) -> Any:
        if self._nvml is None:
            import pynvml  # deferred: importing is cheap, but the CLI must start without it

            self._nvml = pynvml
        return self._nvml

    def _wrap(self, fn: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        nv = self._lib()
        try:
            return call(*args, **kwargs)
        except nv.NVMLError as exc:
            raise NvmlCallError(int(exc.value), fn) from None

    def init(self) -> None:
        nv = self._lib()
        self._wrap("nvmlInit", nv.nvmlInit)
        self._stop.clear()
        from vgpumon.sources.nvml_fast import FastCalls

        # the per-tick calls straight through ctypes (vgpumon.sources.nvml_fast): the same answers
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

    def system(self, fn: str, *args: Any) -> Any:
        call = getattr(self._lib(), fn, None)
        if call is None:
            raise NvmlCallError(NVML_ERROR_FUNCTION_NOT_FOUND, fn)
        return to_plain(self._wrap(fn, call, *args))

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            nv = self._lib()
            handle = self._wrap("nvmlDeviceGetHandleByIndex", nv.nvmlDeviceGetHandleByIndex, index)
            self._handles[index] = handle
        return handle

    def bound_calls(self, index: int) -> dict[str, Any]:
        """The per-tick calls of device ``index`` straight through ctypes
        (``vgpumon.sources.nvml_fast``), by nvidia-ml-py name: ``calls[fn](*args, **kwargs)``
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

    def fast_parts(self, index: int, scalar_calls: Sequence[tuple[str, tuple[Any, ...]]] = ()) -> Any:
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

    def device(self, index: int, fn: str, *args: Any, **kwargs: Any) -> Any:
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

    def gpm(self, index: int, metric_ids: Sequence[int]) -> dict[int, Any] | None:
        flat = self.gpm_flat(index, metric_ids)
        if flat is None:
            return None
        out: dict[int, Any] = {}
        for i, metric_id in enumerate(metric_ids):
            code = flat[2 * i]
            out[metric_id] = flat[2 * i + 1] if code == 0 else NvmlCallError(code, "nvmlGpmMetricsGet")
        return out

    def gpm_flat(self, index: int, metric_ids: Sequence[int]) -> tuple[Any, ...] | None:
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
        if state is None or (state["ids"] is not metric_ids and state["ids"] != tuple(metric_ids)):
            state = self._gpm_state(index, tuple(metric_ids))
        handle = self._handles.get(index)
        if handle is None:
            handle = self._handle(index)
        cur = state["cur"]
        ret = state["get"](handle, state["bufs"][cur])
        if ret:
            raise NvmlCallError(ret, "nvmlGpmSampleGet")
        state["cur"] = 1 - cur
        if not state["have_prev"]:
            state["have_prev"] = True
            return None
        req, ref = state["reqs"][cur]
        ret = state["metrics"](ref)
        if ret:
            raise NvmlCallError(ret, "nvmlGpmMetricsGet")
        offset, fmt = state["unpack"]
        return fmt.unpack_from(req, offset)

    def _gpm_state(self, index: int, metric_ids: tuple[int, ...]) -> dict[str, Any]:
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
        state = self._gpm_prev[index] = {
            "ids": metric_ids, "bufs": bufs, "reqs": reqs, "cur": 0, "have_prev": False,
            "get": nv._nvmlGetFunctionPointer("nvmlGpmSampleGet"),
            "metrics": nv._nvmlGetFunctionPointer("nvmlGpmMetricsGet"),
            "unpack": _gpm_results(nv, len(metric_ids)),
        }
        return state

    def _free_gpm(self, index: int) -> None:
        state = self._gpm_prev.pop(index, None)
        if state is not None:
            for buf in state["bufs"]:
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

    def xid_poll(self) -> list[dict[str, Any]]:
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

    def _xid_wait_loop(self, event_set: Any, by_address: dict[int | None, int], active: bool) -> None:
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

    def pcie_throughput(self, index: int, period: float | None = None) -> dict[str, Any] | None:
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
                    result: Any = {"tx_KBps": int(tx), "rx_KBps": int(rx), "ts": time.time()}
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

MASKED_HOST = "masked-host"


def _masked(fn: str, scope: Any, value: Any) -> Any:
    """Replace identifying answers (UUID, serial) with stable neutral ones per device index."""
    if fn == "nvmlDeviceGetUUID" and isinstance(value, str):
        return f"GPU-00000000-0000-4000-8000-{int(scope):012d}"
    if fn == "nvmlDeviceGetSerial" and isinstance(value, str):
        return f"{int(scope):013d}"
    return value


def _open_text(path: Path, mode: str) -> IO[str]:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, mode + "b"), encoding="utf-8")  # type: ignore[arg-type]
    return open(path, mode, encoding="utf-8")


#: A call that took this long or more carries its duration in a capture (``"d"``, seconds); a
#: replay reproduces durations of ``REPLAY_DELAY_MIN_S`` or more (a slow or wedged call), not the
#: microseconds of ordinary calls.
RECORD_DURATION_MIN_S = 0.001
REPLAY_DELAY_MIN_S = 0.01


def _timed(outcome: dict[str, Any], t0: float) -> dict[str, Any]:
    took = time.perf_counter() - t0
    if took >= RECORD_DURATION_MIN_S:
        outcome["d"] = round(took, 6)
    return outcome


def _encode_outcome(value: Any = None, error: NvmlCallError | None = None) -> dict[str, Any]:
    if error is not None:
        return {"e": error.code}
    return {"v": value}


class RecordingBackend:
    """Wraps a backend and writes every call's answer per tick to a capture file.

    Args:
        inner: the backend that really answers (``LiveBackend`` on hardware).
        path: capture file; ``.gz`` compresses.
        mask: replace GPU UUIDs, serials and the host name with neutral values.
        meta: extra header fields (interval, command line, ...).
    """

    def __init__(
        self,
        inner: NvmlBackend,
        path: str | Path,
        *,
        mask: bool = False,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self._inner = inner
        self._mask = mask
        self._file = _open_text(Path(path), "w")
        header = {
            "vgpumon_capture": CAPTURE_FORMAT_VERSION,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "host": MASKED_HOST if mask else socket.gethostname(),
            "masked": mask,
            **(meta or {}),
        }
        self._file.write(json.dumps(header) + "\n")
        self._tick = -1
        self._ts: float | None = None
        self._calls: list[list[Any]] = []
        self.ticks_written = 0

    def _flush_tick(self) -> None:
        if self._calls or self._tick == -1:
            line = {"tick": self._tick, "ts": self._ts, "calls": self._calls}
            self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
            if self._tick >= 0:
                self.ticks_written += 1
        self._calls = []

    def _record(self, scope: Any, fn: str, args: Sequence[Any], kwargs: Mapping[str, Any], call: Any) -> Any:
        t0 = time.perf_counter()
        try:
            value = call()
        except NvmlCallError as exc:
            self._calls.append([scope, fn, list(args), dict(kwargs), _timed(_encode_outcome(error=exc), t0)])
            raise
        stored = _masked(fn, scope, value) if self._mask else value
        if fn == "gpm" and value is not None:
            stored = {
                str(k): ({"e": v.code} if isinstance(v, NvmlCallError) else v) for k, v in value.items()
            }
        self._calls.append([scope, fn, list(args), dict(kwargs), _timed(_encode_outcome(stored), t0)])
        return _masked(fn, scope, value) if self._mask else value

    def init(self) -> None:
        self._record("sys", "nvmlInit", (), {}, self._inner.init)

    def shutdown(self) -> None:
        # The file stays open: a re-initialisation mid-run (driver reload) shuts NVML down and
        # starts it again within one capture. ``close()`` ends the capture.
        self._inner.shutdown()

    def close(self) -> None:
        """Write the pending tick and close the file (idempotent)."""
        if not self._file.closed:
            self._flush_tick()
            self._file.close()

    def begin_tick(self, ts: float) -> float:
        ts = self._inner.begin_tick(ts)
        self._flush_tick()
        self._tick += 1
        self._ts = ts
        return ts

    def system(self, fn: str, *args: Any) -> Any:
        return self._record("sys", fn, args, {}, lambda: self._inner.system(fn, *args))

    def device(self, index: int, fn: str, *args: Any, **kwargs: Any) -> Any:
        return self._record(index, fn, args, kwargs, lambda: self._inner.device(index, fn, *args, **kwargs))

    def gpm(self, index: int, metric_ids: Sequence[int]) -> dict[int, Any] | None:
        return self._record(index, "gpm", [list(metric_ids)], {}, lambda: self._inner.gpm(index, metric_ids))

    def forget_device(self, index: int) -> None:
        self._inner.forget_device(index)

    def xid_poll(self) -> list[dict[str, Any]]:
        return self._record("sys", "xid_poll", (), {}, self._inner.xid_poll)

    def pcie_throughput(self, index: int, **kwargs: Any) -> dict[str, Any] | None:
        return self._record(index, "pcie_throughput", (), kwargs, lambda: self._inner.pcie_throughput(index, **kwargs))


def _key(scope: Any, fn: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    return json.dumps([scope, fn, list(args), dict(kwargs)], separators=(",", ":"), sort_keys=True)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _shape_error(tick: Any) -> str | None:
    """What is wrong with the shape of one tick line, ``None`` when nothing is."""
    if not isinstance(tick, dict):
        return "not a JSON object"
    if not _is_int(tick.get("tick")):
        return '"tick" is not an integer'
    if tick["tick"] >= 0 and not _is_number(tick.get("ts")):
        return '"ts" is not a number of seconds'
    calls = tick.get("calls")
    if not isinstance(calls, list):
        return '"calls" is not a list'
    for call in calls:
        if not (isinstance(call, list) and len(call) == 5):
            return "a call is not [scope, function, args, kwargs, outcome]"
        scope, fn, args, kwargs, outcome = call
        if not (scope == "sys" or _is_int(scope)) or not isinstance(fn, str):
            return "a call's scope or function name has the wrong type"
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            return f"{fn}: args or kwargs have the wrong type"
        if not isinstance(outcome, dict) or not (("v" in outcome) ^ ("e" in outcome)):
            return f"{fn}: outcome is not {{\"v\": value}} or {{\"e\": code}}"
        if "d" in outcome and not _is_number(outcome["d"]):
            return f"{fn}: duration is not a number of seconds"
        if "e" in outcome and not _is_int(outcome["e"]):
            return f"{fn}: error code is not an integer"
    return None


def _check_header(path: Path, first: str | None) -> dict[str, Any]:
    if not first or not first.strip():
        raise CaptureFormatError(f"{path} is empty, not a vgpumon capture")
    try:
        header = json.loads(first)
    except (json.JSONDecodeError, RecursionError):
        raise CaptureFormatError(f"{path} is not a vgpumon capture (line 1 is not JSON)") from None
    if not isinstance(header, dict) or "vgpumon_capture" not in header:
        raise CaptureFormatError(f"{path} is not a vgpumon capture (no header)")
    if header["vgpumon_capture"] != CAPTURE_FORMAT_VERSION:
        raise CaptureFormatError(
            f"{path} has capture format {header['vgpumon_capture']!r}, this vgpumon reads {CAPTURE_FORMAT_VERSION}"
        )
    if "slow_every" in header and not (_is_int(header["slow_every"]) and header["slow_every"] >= 1):
        raise CaptureFormatError(f"{path}:1: header \"slow_every\" is not a positive integer")
    return header


def _read_error(path: Path, exc: BaseException, where: str = "") -> CaptureFormatError:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
    return CaptureFormatError(f"cannot read capture {path}{where}: {reason}")


#: The longest capture line read (characters). A recorded tick of 8 GPUs is about 40 kB and the
#: init block a few hundred; a longer line is not a vgpumon capture's, and reading it whole (a
#: multi-gigabyte file without a newline) would end in MemoryError instead of a clear error.
MAX_LINE_CHARS = 64 << 20


def _line(path: Path, f: IO[str], n: int) -> str:
    """Line ``n`` of an open capture ('' at the end), at most ``MAX_LINE_CHARS`` long.

    Raises:
        CaptureFormatError: the line is longer.
    """
    line = f.readline(MAX_LINE_CHARS + 1)
    if len(line) > MAX_LINE_CHARS:
        raise CaptureFormatError(
            f"{path}:{n}: a capture line over {MAX_LINE_CHARS >> 20} Mi characters: not a vgpumon capture, or damaged"
        )
    return line


def _tick_lines(path: Path, f: IO[str]) -> Iterator[dict[str, Any]]:
    """The ticks of an open capture after its header line, one line at a time, each checked for
    its shape; a capture without a single tick is an error too (a header only: the recording was
    stopped at once)."""
    n = 1
    seen = False
    try:
        while line := _line(path, f, n + 1):
            n += 1
            if not line.strip():
                continue
            try:
                tick = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                raise CaptureFormatError(f"{path}:{n}: malformed capture line (not JSON)") from None
            problem = _shape_error(tick)
            if problem:
                raise CaptureFormatError(f"{path}:{n}: malformed capture line ({problem})")
            seen = seen or tick["tick"] >= 0
            yield tick
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as exc:
        raise _read_error(path, exc, f" after line {n}") from None
    if not seen:
        raise CaptureFormatError(f"{path} holds no ticks (a header only: was the recording stopped at once?)")


def iter_capture(path: str | Path) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
    """Open a capture and read it as it is consumed: its header now, its ticks one line at a time.

    Replaying a capture this way takes the memory of one tick, whatever its length (an 8-GPU
    hour read whole took about 290 MB).

    Returns:
        ``(header, ticks)``; ``ticks`` yields in file order, the init block (``tick == -1``)
        first, and closes the file when exhausted (or garbage-collected).

    Raises:
        CaptureFormatError: the file is missing or unreadable, not a vgpumon capture or of an
            unknown format version; while iterating, a line that is not JSON or has fields of
            the wrong type (its number is named), a truncated file, or no tick at all.
    """
    path = Path(path)
    try:
        f = _open_text(path, "r")
        first = _line(path, f, 1) or None
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as exc:
        raise _read_error(path, exc) from None
    try:
        header = _check_header(path, first)
    except CaptureFormatError:
        f.close()
        raise

    def ticks() -> Iterator[dict[str, Any]]:
        with f:
            yield from _tick_lines(path, f)

    return header, ticks()


def read_capture(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Read a whole capture file into memory (``iter_capture`` streams it instead).

    Returns:
        ``(header, ticks)``; ``ticks`` in file order, the init block (``tick == -1``) first.

    Raises:
        CaptureFormatError: as ``iter_capture``, for the whole file at once.
    """
    header, ticks = iter_capture(path)
    return header, list(ticks)


class ReplayBackend:
    """Answers NVML calls from a capture, one recorded tick per ``begin_tick``.

    A call is answered from the current tick's recorded answers for the same function and
    arguments (in recorded order when made several times), else from the init block; a call
    the capture never saw raises ``NvmlCallError(NOT_IN_CAPTURE)``.

    The capture is read as the replay goes (``iter_capture``), one tick at a time, so a replay's
    memory does not grow with its length; a malformed line therefore surfaces when the replay
    reaches it (``begin_tick`` raises ``CaptureFormatError``). ``replays_time`` tells the agent
    that tick times come from the capture.

    Args:
        path: capture file written by ``RecordingBackend`` (``vgpumon record``).
        ticks: ticks (with ``header``) instead of ``path``, for derived scenarios; any iterable,
            consumed once, the init block (``tick == -1``) first when there is one.
    """

    replays_time = True

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        header: Mapping[str, Any] | None = None,
        ticks: Iterable[Mapping[str, Any]] | None = None,
    ) -> None:
        if path is not None:
            header, ticks = iter_capture(path)
        if header is None or ticks is None:
            raise ValueError("ReplayBackend needs a path or header and ticks")
        self.header = dict(header)
        stream = iter(ticks)
        first = next(stream, None)
        self._init: dict[str, list[dict[str, Any]]] = {}
        if first is not None and first["tick"] < 0:
            self._init = self._index(first["calls"])
            first = next(stream, None)
        # The first tick is read now, so that a capture without ticks, or whose first tick is
        # malformed, is refused before the caller creates anything (a store); later lines are
        # read as the replay reaches them.
        if first is not None:
            stream = itertools.chain([first], stream)
        self._ticks: Iterator[Mapping[str, Any]] = (t for t in stream if t["tick"] >= 0)
        self._current: dict[str, list[dict[str, Any]]] = {}

    @staticmethod
    def _index(calls: Sequence[Sequence[Any]]) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for scope, fn, args, kwargs, outcome in calls:
            out.setdefault(_key(scope, fn, args, kwargs), []).append(outcome)
        return out

    def _answer(self, scope: Any, fn: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        key = _key(scope, fn, args, kwargs)
        queue = self._current.get(key) or self._init.get(key)
        if not queue:
            raise NvmlCallError(NOT_IN_CAPTURE, fn)
        outcome = queue.pop(0) if len(queue) > 1 else queue[0]
        delay = outcome.get("d")
        if isinstance(delay, (int, float)) and delay >= REPLAY_DELAY_MIN_S:
            time.sleep(delay)  # a slow or wedged call, as recorded (or as a scenario made it)
        if "e" in outcome:
            raise NvmlCallError(int(outcome["e"]), fn)
        return outcome["v"]

    def init(self) -> None:
        self._answer("sys", "nvmlInit", (), {})

    def shutdown(self) -> None:
        pass

    def begin_tick(self, ts: float) -> float:
        try:
            tick = next(self._ticks)
        except StopIteration:
            raise EndOfCapture from None
        self._current = self._index(tick["calls"])
        return float(tick["ts"])

    def system(self, fn: str, *args: Any) -> Any:
        return self._answer("sys", fn, args, {})

    def device(self, index: int, fn: str, *args: Any, **kwargs: Any) -> Any:
        return self._answer(index, fn, args, kwargs)

    def gpm(self, index: int, metric_ids: Sequence[int]) -> dict[int, Any] | None:
        raw = self._answer(index, "gpm", [list(metric_ids)], {})
        if raw is None:
            return None
        return {
            int(k): (NvmlCallError(int(v["e"]), "nvmlGpmMetricsGet") if isinstance(v, dict) else v)
            for k, v in raw.items()
        }

    def forget_device(self, index: int) -> None:
        pass

    def xid_poll(self) -> list[dict[str, Any]]:
        return list(self._answer("sys", "xid_poll", (), {}) or [])

    def pcie_throughput(self, index: int, **kwargs: Any) -> dict[str, Any] | None:
        try:
            return self._answer(index, "pcie_throughput", (), kwargs)
        except NvmlCallError as exc:
            if exc.code != NOT_IN_CAPTURE:
                raise
        # ``period`` is how often the live backend polls, not part of the answer: a capture
        # recorded while the cross-check polled at another cadence answers the same
        prefix = _key(index, "pcie_throughput", (), {})[:-3]  # the key without its "{}]"
        for key in self._current:
            if key.startswith(prefix):
                return self._answer(index, "pcie_throughput", (), json.loads(key)[3])
        raise NvmlCallError(NOT_IN_CAPTURE, "pcie_throughput")
