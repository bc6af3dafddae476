"""THE optimisation: the live fast set as a straight-line read per device, generated from the
device's plan and compiled (docs/architecture.md, "The live fast set"). Its answers must be the
general path's (``NvmlSource.fast_path = False``); tests/sources/test_nvml_fast_path.py holds them equal."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Sequence
from types import CodeType
from typing import TypeAlias, cast

from vgpumon.catalogue.door import _PLAIN_HI, _PLAIN_LO, _SENTINEL_FLOOR
from vgpumon.model import GpuIdentity
from vgpumon.sources.nvml.backend import NvmlCallError
from vgpumon.sources.nvml.constants import (
    _GPM_FIELDS,
    _GPM_PCIE,
    _MIB,
    GPM_METRICS,
    NVML_FI_DEV_MEMORY_TEMP,
    NVML_PSTATE_UNKNOWN,
)
from vgpumon.sources.nvml.fastcalls import _INSUFFICIENT_SIZE, CFunction, CStruct, Parts
from vgpumon.sources.nvml.plain import _VALUE_MEMBERS as _FV_MEMBERS
from vgpumon.sources.nvml.reads import (
    _ALWAYS_ASKED,
    _FAST_CALLS,
    _FAST_SCALARS,
    _PSTATE_CALL,
    SampleValues,
    _admit_processes,
    _procs_of,
    _Reader,
    _SourceParts,
    _Watch,
    number_of,
)
from vgpumon.sources.nvml.shapes import NvmlAnswer

#: ``_FastPath._compile``'s code objects by source: plans repeat (each re-probe rebuilds them,
#: identical GPUs share one), so a plan is compiled once
_COMPILED: dict[str, CodeType] = {}

#: ``LiveBackend.gpm_flat``: a GPM device's flat ``(code, value, ...)`` answer, ``None`` the first time.
GpmFlat: TypeAlias = Callable[[int, Sequence[int]], "tuple[float, ...] | None"]
#: A process list as ``(pid, usedGpuMemory)`` pairs, as read, before the door.
Procs: TypeAlias = list[tuple[NvmlAnswer, NvmlAnswer]]
#: ``(field, fn, args, scale, place in the raw answers, lo, hi, how)`` of a plain getter.
_ScalarAdmission: TypeAlias = tuple[str, str, tuple[int, ...], float, int, float, float, int]

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
    (tests/sources/test_nvml_fast_path.py), at a fraction of the Python per value (docs/benchmarks.md,
    "Agent footprint"). Built per device; rebuilt when the device's "not supported" cache or
    reader changes.
    """

    def __init__(self, source: "_SourceParts", r: _Reader, gpu: GpuIdentity, parts: Parts, gpm: GpmFlat | None) -> None:
        self.source, self.r, self.gpu, self.parts = source, r, gpu, parts
        memory, utilization, field_values, processes = parts.memory, parts.utilization, parts.field_values, parts.processes
        if memory is None or utilization is None or field_values is None or processes is None:
            raise ValueError("a fast path needs every fast-set call (``build`` checks)")
        #: ``(C function, struct type, [array], count, byref(count))`` of the process list
        self.processes = processes
        spec, at, h = r.spec, parts.at, parts.handle
        #: ``backend.gpm_flat`` for a GPM device, else ``None``
        self.gpm = gpm

        def kind(field: str, scale: float) -> tuple[float, float, int]:
            """(lo, hi, how to admit): 0 the raw int, 1 float(x), 2 bool(x), 3 ``_Reader.put``."""
            lo, hi, integral, flag = spec[field]
            how = 2 if flag else (0 if scale == 1.0 else 3) if integral else 1
            return lo, hi, how

        cfn, ref, _ = memory
        head: list[tuple[str, CFunction, tuple[object, ...]]] = [("nvmlDeviceGetMemoryInfo", cfn, (h, ref))]
        cfn, ref, _ = utilization
        head.append(("nvmlDeviceGetUtilizationRates", cfn, (h, ref)))
        #: (function, C function, arguments) of each call before GPM and after it
        self.head_calls = tuple(head)
        tail: list[tuple[str, CFunction, tuple[object, ...]]] = []
        self.memtemp_unsupported = ("nvmlDeviceGetFieldValues", ((NVML_FI_DEV_MEMORY_TEMP,),), ()) in r.unsupported
        if not self.memtemp_unsupported:
            cfn, _, entry = field_values
            entry[0].fieldId = NVML_FI_DEV_MEMORY_TEMP
            tail.append(("nvmlDeviceGetFieldValues", cfn, (h, ctypes.c_int32(1), entry)))
        self.fv_entry: CStruct = field_values[2]
        #: admission of each plain getter, in call order: (field, fn, args, scale, place in the
        #: raw answers, lo, hi, how); a getter answered "not supported" is not asked (as ``q``)
        self.scalars: list[_ScalarAdmission] = []
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

    def _compile(self) -> Callable[[SampleValues], None] | None:
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
        ns: dict[str, object] = {  # the generated code's globals
            "W": r.watch, "R": r, "put": r.put, "unpack": self.parts.unpack, "arena": self.parts.arena,
            "processes": self._processes_call, "admit": self._admit, "admit_processes": _admit_processes,
            "GPM": self.gpm, "METRICS": GPM_METRICS, "NvmlCallError": NvmlCallError,
            "SF": _SENTINEL_FLOOR, "PL": _PLAIN_LO, "PH": _PLAIN_HI,
        }

        def const(x: object) -> str:
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

        def call(fn: str, cfn: CFunction, args: tuple[object, ...]) -> None:
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
        cp, _, held, count, count_ref = self.processes
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
        return cast("Callable[[SampleValues], None]", ns["read"])  # the function exec just defined

    @staticmethod
    def build(source: "_SourceParts", r: _Reader, gpu: GpuIdentity) -> "_FastPath | None":
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

    def _admit(self, v: SampleValues, rets: list[int], flat: tuple[float, ...] | None, gpm_error: NvmlCallError | None,
               procs: Procs | None) -> None:
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
        x: float  # each raw reading in turn, or it in base units
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
            limit = number_of(v, "memory_total_bytes", r.memory_limit)
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
                        missing[field] = f"GPM: {NvmlCallError(int(flat[i]), 'nvmlGpmMetricsGet').reason}"
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

    def _processes_call(self, w: "_Watch", gen: int, index: int) -> Procs | None:
        """The compute processes (v3 structs) as ``(pid, usedGpuMemory)``; more than fit: grow as
        nvidia-ml-py does. ``None``: the call answered an error (the general path asks again)."""
        cfn, proc, held, count, count_ref = self.processes
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
