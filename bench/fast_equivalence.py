"""The per-tick calls made straight through ctypes (``vgpumon.sources.nvml.fastcalls``) answer what
nvidia-ml-py's wrappers answer, on this machine's GPUs and driver.

For every GPU and every fast-set call, both are asked back to back and their plain answers
compared: equal, except the fields that move between two reads (a field value's timestamp and
latency; memory used/free while something allocates). Then the collector reads ticks alternately
through its straight-line path (``nvml._FastPath``) and its general path: the same fields must
be present, with the same reasons for the missing ones, and the values that do not move between
two ticks (total memory, link, P-state, process IDs) equal. Exit status 1 on a difference.

Usage: python3 bench/fast_equivalence.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vgpumon.sources.nvml.backend import LiveBackend  # noqa: E402
from vgpumon.sources.nvml.plain import to_plain  # noqa: E402

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
        bad += arena(backend, nv)
    finally:
        backend.shutdown()
    bad += paths()
    print(f"{bad} difference(s)")
    return 1 if bad else 0


def arena(backend, nv) -> int:
    """The straight-line path's one-buffer read (``nvml_fast.Parts.read``) against nvidia-ml-py:
    each value that does not move between two reads, read both ways back to back."""
    import ctypes

    from vgpumon.sources.nvml.reads import _FAST_CALLS

    bad = 0
    for index in range(nv.nvmlDeviceGetCount()):
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        parts = backend.fast_parts(index, _FAST_CALLS)
        h = parts.handle
        rets = {"memory": parts.memory[0](h, parts.memory[1]), "utilization": parts.utilization[0](h, parts.utilization[1])}
        entry = parts.field_values[2]
        entry[0].fieldId = 82
        rets["field_value"] = parts.field_values[0](h, ctypes.c_int32(1), entry)
        for (fn, args), (cfn, ref, _) in parts.scalars.items():
            rets[(fn, args)] = cfn(h, *args, ref)
        raw, at = parts.read(), parts.at
        mem = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
        util = nv.nvmlDeviceGetUtilizationRates(handle)
        fv = nv.nvmlDeviceGetFieldValues(handle, [82])[0]
        checks = [("memory.total", mem.total), ("memory.reserved", mem.reserved),
                  ("utilization.memory", util.memory), ("field_value.valueType", fv.valueType),
                  ("field_value.nvmlReturn", fv.nvmlReturn)]
        if fv.valueType == 1:
            checks.append(("field_value.uiVal", fv.value.uiVal))
        for (fn, args) in parts.scalars:
            if rets[(fn, args)]:
                continue  # not supported here: nothing to compare
            if fn in ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo"):
                continue  # they move between two reads
            checks.append(((fn, args), getattr(nv, fn)(handle, *args)))
        for name, want in checks:
            got = raw[at[name]]
            same = got == want
            bad += not same
            print(f"GPU {index} arena {name}: {'same' if same else 'DIFFERENT'}  fast={got}  nvidia-ml-py={want}")
    return bad


STILL = ("memory_total_bytes", "performance_state", "pcie_link_gen_current", "pcie_link_width_current", "activity_source")
#: Read by GPM, whose figures move between two ticks. Ticks 50 ms apart also make the H200 answer
#: NaN for DRAM_BW_UTIL on every second read (the door refuses it), whichever path reads: their
#: presence and reasons are not compared either.
GPM_FIELDS = ("sm_active_ratio", "sm_occupancy_ratio", "tensor_active_ratio", "dram_active_ratio",
              "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second")


def paths(pairs: int = 10) -> int:
    """Ticks alternately through the straight-line and the general path; differences counted."""
    import dataclasses
    import time

    from vgpumon.sources.nvml import NvmlSource

    src = NvmlSource(LiveBackend(), slow_every=10**6)
    src.start()
    bad = 0
    try:
        for _ in range(3):
            src.sample()
        for _ in range(pairs):
            got = {}
            for fast in (True, False):
                src.fast_path = fast
                got[fast] = src.sample().samples
                time.sleep(0.05)
            for a, b in zip(got[True], got[False]):
                skip = ("ts", "missing", *GPM_FIELDS)
                names = [f.name for f in dataclasses.fields(a) if f.name not in skip]
                da = {f: getattr(a, f) for f in names}
                db = {f: getattr(b, f) for f in names}
                present = {f for f, x in da.items() if x is not None} ^ {f for f, x in db.items() if x is not None}
                still = [f for f in STILL if da[f] != db[f]]
                pids = [p for p, _ in a.processes] != [p for p, _ in b.processes]
                reasons = (a.missing.keys() ^ b.missing.keys()) - set(GPM_FIELDS)
                if present or still or pids or reasons:
                    bad += 1
                    print(f"GPU {a.index} paths DIFFERENT: present only in one {sorted(present)}, moved {still}, "
                          f"pids {pids}, missing {sorted(reasons)}")
        print(f"straight-line path against the general path: {pairs} pairs of ticks, {bad} difference(s)"
              f" (served: {sum(fp is not None for fp in src._fast.values())} of {len(src.gpus)} GPUs)")
    finally:
        src.close()
    return bad


if __name__ == "__main__":
    sys.exit(main())
