"""A stand-in for libnvidia-ml.so under nvidia-ml-py, for measuring the Python side of a sample on a
machine without a GPU.

nvidia-ml-py looks every C function up on ``pynvml.nvmlLib``; this puts an object there whose
attributes fill the same structs the driver fills (values of the recorded H200, idle), instantly.
Everything above the C call — nvidia-ml-py's wrappers and vgpumon's collector — runs as on the
hardware, so the difference between two ways of sampling is their Python cost. The C time
itself (most of the floor on a real GPU: ~0.24 ms per H200 sample) is absent: figures from here
are for comparing code, never for the docs' claims, which come from the H200 (docs/benchmarks.md).
The tests use it as the process edge under the live backend (``FakeLib.values`` and ``.errors``
change its answers), e.g. to hold the collector's straight-line path to the general one.

Usage: ``install(gpus=1)`` before anything initialises NVML; ``uninstall()`` puts nvidia-ml-py
back as it was.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeAlias

#: A ctypes argument as nvidia-ml-py passes it to a C function: a ``byref`` of one of its
#: structs, an array of them, a ``c_uint``, a string buffer. Their fields are built at run time
#: from nvidia-ml-py's layouts, so no static type names them; the stand-in writes them as C would.
CArg: TypeAlias = Any
#: The stand-in of a C function: the ctypes arguments in, an ``nvmlReturn_t`` out.
CFunction: TypeAlias = Callable[..., int]

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3


def _out(ref: CArg) -> CArg:
    """The object a ``byref(...)`` argument points to."""
    return getattr(ref, "_obj", ref)


class FakeLib:
    """``nvmlLib`` for ``gpus`` H200s; unknown functions answer NOT_SUPPORTED."""

    def __init__(self, gpus: int = 1) -> None:
        self.gpus = gpus
        self.handles = [ctypes.c_void_p(0x1000 + i) for i in range(gpus)]
        #: answers to change, by C function name: a value (a scalar getter's, or a dict of a
        #: struct's fields, or for the process list ``[(pid, usedGpuMemory), ...]``)
        self.values: dict[str, Any] = {}  # each function's own shape, as the comment above says
        #: return codes to answer instead, by C function name (for field values: the entry's)
        self.errors: dict[str, int] = {}

    def __getattr__(self, name: str) -> CFunction:
        def not_supported(*_args: object) -> int:
            return NVML_ERROR_NOT_SUPPORTED

        return not_supported

    # -- library -------------------------------------------------------------------------------
    def nvmlInitWithFlags(self, *_a: object) -> int:
        return NVML_SUCCESS

    def nvmlInit_v2(self, *_a: object) -> int:
        return NVML_SUCCESS

    def nvmlShutdown(self, *_a: object) -> int:
        return NVML_SUCCESS

    def nvmlDeviceGetCount_v2(self, ref: CArg) -> int:
        _out(ref).value = self.gpus
        return NVML_SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: CArg, ref: CArg) -> int:
        i = index.value if hasattr(index, "value") else int(index)
        _out(ref).value = self.handles[i].value
        return NVML_SUCCESS

    def nvmlSystemGetDriverVersion(self, buf: CArg, size: object) -> int:
        buf.value = b"580.159.04"
        return NVML_SUCCESS

    # -- identity ------------------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, handle: CArg, buf: CArg, size: object) -> int:
        buf.value = b"GPU-00000000-0000-4000-8000-%012d" % ((handle.value if hasattr(handle, "value") else handle) - 0x1000)
        return NVML_SUCCESS

    def nvmlDeviceGetName(self, handle: object, buf: CArg, size: object) -> int:
        buf.value = b"NVIDIA H200"
        return NVML_SUCCESS

    def nvmlDeviceGetSerial(self, handle: object, buf: CArg, size: object) -> int:
        buf.value = b"1653724027414"
        return NVML_SUCCESS

    def nvmlDeviceGetPciInfo_v3(self, handle: object, ref: CArg) -> int:
        p = _out(ref)
        p.busId = b"00000000:00:06.0"
        p.busIdLegacy = b"0000:00:06.0"
        return NVML_SUCCESS

    # -- memory, utilization, sensors ----------------------------------------------------------
    def nvmlDeviceGetMemoryInfo(self, handle: object, ref: CArg) -> int:
        m = _out(ref)
        m.total, m.free, m.used = 150754820096, 150754820096 - 644939776, 644939776
        return NVML_SUCCESS

    def nvmlDeviceGetMemoryInfo_v2(self, handle: object, ref: CArg) -> int:
        if "nvmlDeviceGetMemoryInfo_v2" in self.errors:
            return self.errors["nvmlDeviceGetMemoryInfo_v2"]
        m = _out(ref)
        m.total, m.reserved, m.free, m.used = 150754820096, 644939776, 150109880320, 0
        for k, v in self.values.get("nvmlDeviceGetMemoryInfo_v2", {}).items():
            setattr(m, k, v)
        return NVML_SUCCESS

    def nvmlDeviceGetUtilizationRates(self, handle: object, ref: CArg) -> int:
        if "nvmlDeviceGetUtilizationRates" in self.errors:
            return self.errors["nvmlDeviceGetUtilizationRates"]
        u = _out(ref)
        u.gpu, u.memory = 0, 0
        for k, v in self.values.get("nvmlDeviceGetUtilizationRates", {}).items():
            setattr(u, k, v)
        return NVML_SUCCESS

    def _uint(self, value: int) -> CFunction:
        def fn(handle: object, *args: CArg) -> int:
            _out(args[-1]).value = value
            return NVML_SUCCESS

        return fn

    def nvmlDeviceGetTemperature(self, handle: object, sensor: object, ref: CArg) -> int:
        if "nvmlDeviceGetTemperature" in self.errors:
            return self.errors["nvmlDeviceGetTemperature"]
        _out(ref).value = self.values.get("nvmlDeviceGetTemperature", 34)
        return NVML_SUCCESS

    def nvmlDeviceGetPowerUsage(self, handle: object, ref: CArg) -> int:
        if "nvmlDeviceGetPowerUsage" in self.errors:
            return self.errors["nvmlDeviceGetPowerUsage"]
        _out(ref).value = self.values.get("nvmlDeviceGetPowerUsage", 80812)
        return NVML_SUCCESS

    def nvmlDeviceGetClockInfo(self, handle: object, clock: object, ref: CArg) -> int:
        if "nvmlDeviceGetClockInfo" in self.errors:
            return self.errors["nvmlDeviceGetClockInfo"]
        _out(ref).value = self.values.get("nvmlDeviceGetClockInfo", 345)
        return NVML_SUCCESS

    def nvmlDeviceGetMaxClockInfo(self, handle: object, clock: object, ref: CArg) -> int:
        _out(ref).value = 1980
        return NVML_SUCCESS

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: object, ref: CArg) -> int:
        if "nvmlDeviceGetCurrentClocksEventReasons" in self.errors:
            return self.errors["nvmlDeviceGetCurrentClocksEventReasons"]
        _out(ref).value = self.values.get("nvmlDeviceGetCurrentClocksEventReasons", 1)
        return NVML_SUCCESS

    def nvmlDeviceGetPerformanceState(self, handle: object, ref: CArg) -> int:
        if "nvmlDeviceGetPerformanceState" in self.errors:
            return self.errors["nvmlDeviceGetPerformanceState"]
        _out(ref).value = self.values.get("nvmlDeviceGetPerformanceState", 0)
        return NVML_SUCCESS

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: object, ref: CArg) -> int:
        if "nvmlDeviceGetCurrPcieLinkGeneration" in self.errors:
            return self.errors["nvmlDeviceGetCurrPcieLinkGeneration"]
        _out(ref).value = self.values.get("nvmlDeviceGetCurrPcieLinkGeneration", 5)
        return NVML_SUCCESS

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: object, ref: CArg) -> int:
        if "nvmlDeviceGetCurrPcieLinkWidth" in self.errors:
            return self.errors["nvmlDeviceGetCurrPcieLinkWidth"]
        _out(ref).value = self.values.get("nvmlDeviceGetCurrPcieLinkWidth", 16)
        return NVML_SUCCESS

    nvmlDeviceGetMaxPcieLinkGeneration = nvmlDeviceGetCurrPcieLinkGeneration
    nvmlDeviceGetGpuMaxPcieLinkGeneration = nvmlDeviceGetCurrPcieLinkGeneration
    nvmlDeviceGetMaxPcieLinkWidth = nvmlDeviceGetCurrPcieLinkWidth

    def nvmlDeviceGetTemperatureThreshold(self, handle: object, kind: object, ref: CArg) -> int:
        _out(ref).value = 89
        return NVML_SUCCESS

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: object, count: CArg, infos: CArg) -> int:
        if "nvmlDeviceGetComputeRunningProcesses_v3" in self.errors:
            return self.errors["nvmlDeviceGetComputeRunningProcesses_v3"]
        procs = self.values.get("nvmlDeviceGetComputeRunningProcesses_v3", [])
        n = _out(count)
        if len(procs) > n.value:
            n.value = len(procs)
            return 7  # NVML_ERROR_INSUFFICIENT_SIZE
        for i, (pid, used) in enumerate(procs):
            infos[i].pid, infos[i].usedGpuMemory = pid, used
        n.value = len(procs)
        return NVML_SUCCESS

    def nvmlDeviceGetFieldValues(self, handle: object, n: object, ref: CArg) -> int:
        arr = _out(ref)
        for v in arr:
            v.valueType, v.nvmlReturn = 1, self.errors.get("nvmlDeviceGetFieldValues", 0)
            v.value.uiVal = self.values.get("nvmlDeviceGetFieldValues", 38)
        return NVML_SUCCESS

    # -- GPM -----------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, handle: object, ref: CArg) -> int:
        _out(ref).isSupportedDevice = 1
        return NVML_SUCCESS

    def nvmlGpmSampleAlloc(self, ref: object) -> int:
        return NVML_SUCCESS

    def nvmlGpmSampleFree(self, sample: object) -> int:
        return NVML_SUCCESS

    def nvmlGpmSampleGet(self, handle: object, sample: object) -> int:
        return self.errors.get("nvmlGpmSampleGet", NVML_SUCCESS)

    def nvmlGpmMetricsGet(self, ref: CArg) -> int:
        """Every metric 0.0, or ``values["nvmlGpmMetricsGet"][metric id]``: a float, or an int
        return code for that metric alone."""
        req = _out(ref)
        answers = self.values.get("nvmlGpmMetricsGet", {})
        for i in range(req.numMetrics):
            answer = answers.get(req.metrics[i].metricId, 0.0)
            req.metrics[i].nvmlReturn = answer if answer.__class__ is int else 0
            req.metrics[i].value = answer if answer.__class__ is float else 0.0
        return self.errors.get("nvmlGpmMetricsGet", NVML_SUCCESS)


def install(gpus: int = 1) -> ModuleType:
    """Put the stand-in under nvidia-ml-py; returns the ``pynvml`` module."""
    import pynvml

    pynvml.nvmlLib = FakeLib(gpus)
    pynvml._nvmlGetFunctionPointer_cache.clear()
    return pynvml


def uninstall() -> None:
    """Take the stand-in away: nvidia-ml-py loads the real library again on its next init."""
    import pynvml

    pynvml.nvmlLib = None
    pynvml._nvmlLib_refcount = 0
    pynvml._nvmlGetFunctionPointer_cache.clear()
