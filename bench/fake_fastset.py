"""``fake_nvml.FakeLib`` with the fast-set calls answered by C (``bench/fake_fastset.c``,
compiled here with the system's C compiler on first use): on a machine without a GPU, a
sample then costs what its Python and ctypes side cost, the driver's own time left out. For
comparing code (vgpumon against bare nvidia-ml-py making the same calls); never a figure for
the docs' claims, which come from the H200.

Usage: ``install(gpus)`` instead of ``fake_nvml.install(gpus)``.
"""

from __future__ import annotations

import ctypes
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from vgpumon.testing.fake_nvml import FakeLib

C_FUNCTIONS = (
    "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo", "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetPerformanceState", "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetFieldValues", "nvmlGpmSampleGet", "nvmlGpmMetricsGet",
)


def _library() -> ctypes.CDLL:
    src = Path(__file__).with_name("fake_fastset.c")
    out = Path(tempfile.gettempdir()) / "vgpumon-fake-fastset.so"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return ctypes.CDLL(str(out))


class CFastLib(FakeLib):
    """``FakeLib`` whose fast-set functions are C functions (start-up calls stay in Python)."""

    def __init__(self, gpus: int = 1) -> None:
        super().__init__(gpus)
        lib = _library()
        for name in C_FUNCTIONS:
            self.__dict__[name] = getattr(lib, name)


def install(gpus: int = 1) -> Any:
    """Put the stand-in under nvidia-ml-py; returns the ``pynvml`` module."""
    import pynvml

    pynvml.nvmlLib = CFastLib(gpus)
    pynvml._nvmlGetFunctionPointer_cache.clear()
    return pynvml
