"""The per-tick calls made straight through ctypes (``vgpumon.sources.nvml_fast``) answer what
nvidia-ml-py's wrappers answer, on this machine's GPUs and driver.

For every GPU and every fast-set call, both are asked back to back and their plain answers
compared: equal, except the fields that move between two reads (a field value's timestamp and
latency; memory used/free while something allocates). Exit status 1 on a difference.

Usage: python3 bench/fast_equivalence.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vgpumon.sources.nvml_backend import LiveBackend, to_plain  # noqa: E402

CALLS = [
    ("nvmlDeviceGetMemoryInfo", (), {"version": None}),
    ("nvmlDeviceGetUtilizationRates", (), {}),
    ("nvmlDeviceGetTemperature", (0,), {}),
    ("nvmlDeviceGetPowerUsage", (), {}),
    ("nvmlDeviceGetClockInfo", (1,), {}),
    ("nvmlDeviceGetClockInfo", (2,), {}),
    ("nvmlDeviceGetCurrentClocksEventReasons", (), {}),
    ("nvmlDeviceGetPerformanceState", (), {}),
    ("nvmlDeviceGetFanSpeed", (), {}),
    ("nvmlDeviceGetCurrPcieLinkGeneration", (), {}),
    ("nvmlDeviceGetCurrPcieLinkWidth", (), {}),
    ("nvmlDeviceGetComputeRunningProcesses", (), {}),
    ("nvmlDeviceGetFieldValues", ((82,),), {}),
]
MOVING = {"timestamp", "latencyUsec", "used", "free"}


def strip(value):
    if isinstance(value, dict):
        return {k: strip(v) for k, v in value.items() if k not in MOVING}
    if isinstance(value, (list, tuple)):
        return [strip(v) for v in value]
    return value


def main() -> int:
    import pynvml as nv

    backend = LiveBackend()
    backend.init()
    bad = 0
    try:
        for index in range(nv.nvmlDeviceGetCount()):
            fast = backend.bound_calls(index)
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            for fn, args, kwargs in CALLS:
                if fn == "nvmlDeviceGetMemoryInfo":
                    kwargs = {"version": nv.nvmlMemory_v2}
                if fn == "nvmlDeviceGetFieldValues":
                    args = ([82],)
                try:
                    want = ("ok", to_plain(getattr(nv, fn)(handle, *args, **kwargs)))
                except nv.NVMLError as exc:
                    want = ("error", int(exc.value))
                try:
                    got = ("ok", fast[fn](*args, **kwargs)) if fn in fast else ("n/a", None)
                except Exception as exc:  # noqa: BLE001 - reported
                    got = ("error", getattr(exc, "code", repr(exc)))
                same = got[0] == "n/a" or strip(got) == strip(want)
                bad += not same
                print(f"GPU {index} {fn}{args}: {'same' if same else 'DIFFERENT'}  fast={got}  nvidia-ml-py={want}")
    finally:
        backend.shutdown()
    print(f"{bad} difference(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
