"""The per-tick NVML calls, straight to libnvidia-ml through ctypes.

nvidia-ml-py wraps every call in Python that allocates its out-struct, looks the C function up,
and hands back structs whose every field read goes through an overridden ``__getattribute__``;
for a sample of a dozen cheap getters (2–10 µs each in C on the H200, FACTS §1) that Python is a
large share of the cost. The calls the collector makes every tick are made here instead: the C
function looked up once, the out-struct allocated once per device and reused, fields read through
plain ctypes structs with nvidia-ml-py's own layouts (``_fields_`` copied), values returned as the
same plain data ``to_plain`` gives for nvidia-ml-py's answer — so captures and replays do not
change. Every other call goes through nvidia-ml-py as before.

Only ``LiveBackend`` uses this; it falls back to nvidia-ml-py for a call whose C function this
driver lacks.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TypeAlias

from vgpumon.sources.nvml.plain import _VALUE_MEMBERS, to_plain
from vgpumon.sources.nvml.shapes import NvmlAnswer, NvmlHandle

#: A C function of libnvidia-ml (from nvidia-ml-py's ``_nvmlGetFunctionPointer``): it answers
#: an ``nvmlReturn_t``, 0 on success, and writes its results through its out-arguments.
CFunction: TypeAlias = Callable[..., int]
#: A fast call bound to one device: answers as ``LiveBackend.device(index, fn, ...)`` would.
BoundCall: TypeAlias = Callable[..., NvmlAnswer]
#: A plain-getter call of the straight-line reader's plan: ``(function, args)``.
ScalarCall: TypeAlias = tuple[str, tuple[int, ...]]
#: A ctypes struct, struct class or array built here at run time with nvidia-ml-py's layouts
#: (``_plain_copy``): its fields exist only at run time, so no static type can name them.
CStruct: TypeAlias = Any
#: A ``ctypes.byref`` of an out-argument.
CRef: TypeAlias = "ctypes._CArgObject"

#: nvml.h ``NVML_ERROR_INSUFFICIENT_SIZE``: the process list needs a larger array.
_INSUFFICIENT_SIZE = 7
_NOT_AVAILABLE_U64 = 0xFFFF_FFFF_FFFF_FFFF


def _plain_copy(name: str, struct: CStruct, base: type = ctypes.Structure) -> CStruct:
    """A plain ctypes struct (or union) with ``struct``'s layout: field reads without
    nvidia-ml-py's ``__getattribute__``."""
    fields = []
    for f in struct._fields_:
        fname, ftype = f[0], f[1]
        if isinstance(ftype, type) and issubclass(ftype, (ctypes.Structure, ctypes.Union)) and hasattr(ftype, "_fields_"):
            ftype = _plain_copy(f"{name}_{fname}", ftype, ctypes.Union if issubclass(ftype, ctypes.Union) else ctypes.Structure)
        fields.append((fname, ftype, *f[2:]))
    return type(name, (base,), {"_fields_": fields, **({"_pack_": struct._pack_} if hasattr(struct, "_pack_") else {})})


class FastCalls:
    """The fast-set calls of one library instance, bound per device.

    Args:
        nv: the ``pynvml`` module, initialised (its library loaded).
        error: ``error(code, fn)`` builds the exception raised for an NVML return code.

    ``bind(handle)[fn](*args, **kwargs)`` answers like ``LiveBackend.device(index, fn, ...)``
    would, for the functions this driver has; each bound device gets its own out-structs, so a
    call abandoned while stuck (a wedged GPU) may still write into its own, never into another
    device's.
    """

    def __init__(self, nv: ModuleType, error: Callable[[int, str], Exception]) -> None:
        self.nv = nv
        self.error = error
        get = nv._nvmlGetFunctionPointer
        self._mem_v2 = _plain_copy("MemoryV2", nv.c_nvmlMemory_v2_t)
        self._util = _plain_copy("Utilization", nv.c_nvmlUtilization_t)
        self._proc = _plain_copy("ProcessInfoV3", nv.c_nvmlProcessInfo_v3_t)
        self._field = _plain_copy("FieldValue", nv.c_nvmlFieldValue_t)
        self._makers: list[tuple[str, Callable[[str, CFunction, NvmlHandle], BoundCall], CFunction]] = []
        self._scalar_types: dict[str, tuple[CFunction, type[ctypes.c_uint | ctypes.c_ulonglong]]] = {}
        scalars: dict[str, type[ctypes.c_uint | ctypes.c_ulonglong]] = {
            "nvmlDeviceGetPowerUsage": ctypes.c_uint,
            "nvmlDeviceGetTemperature": ctypes.c_uint,
            "nvmlDeviceGetClockInfo": ctypes.c_uint,
            "nvmlDeviceGetCurrentClocksEventReasons": ctypes.c_ulonglong,
            "nvmlDeviceGetPerformanceState": ctypes.c_uint,
            "nvmlDeviceGetFanSpeed": ctypes.c_uint,
            "nvmlDeviceGetCurrPcieLinkGeneration": ctypes.c_uint,
            "nvmlDeviceGetCurrPcieLinkWidth": ctypes.c_uint,
        }
        for fn, ctype in scalars.items():
            try:
                cfn = get(fn)
            except nv.NVMLError:
                continue  # this driver lacks it: nvidia-ml-py's wrapper answers
            self._makers.append((fn, self._scalar_maker(ctype), cfn))
            self._scalar_types[fn] = (cfn, ctype)
        for fn, cname, make in (
            ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2", self._memory_v2),
            ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetUtilizationRates", self._utilization),
            ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v3", self._processes),
            ("nvmlDeviceGetFieldValues", "nvmlDeviceGetFieldValues", self._field_values),
        ):
            try:
                self._makers.append((fn, make, get(cname)))
            except nv.NVMLError:
                continue

    def bind(self, handle: NvmlHandle) -> dict[str, BoundCall]:
        """The fast calls of one device (its ``nvmlDevice_t``), by nvidia-ml-py function name."""
        return {fn: make(fn, cfn, handle) for fn, make, cfn in self._makers}

    def parts(self, handle: NvmlHandle, scalar_calls: Sequence[ScalarCall] = ()) -> Parts:
        """The C functions and out-structs of one device's fast set, for a reader in straight-line
        code (``vgpumon.sources.nvml._FastPath``); each device gets structs of its own.

        Args:
            handle: the device's ``nvmlDevice_t``.
            scalar_calls: ``(function, args)`` of each plain-getter call the reader makes per
                tick (e.g. ``nvmlDeviceGetClockInfo`` twice, for two clocks); each gets an out
                value of its own, ``scalars[(function, args)]``. A function this driver lacks is
                left out.

        Every out-struct and out-scalar lies in one buffer (``Parts.arena``), so that after a
        tick's calls ``Parts.read()`` returns every raw answer in one tuple (one ``unpack_from``)
        instead of one Python attribute read per value; ``Parts.at[name]`` is a value's place in
        that tuple (names in ``Parts``)."""
        cfns = {fn: cfn for fn, _, cfn in self._makers}
        scalars = [(fn, args) for fn, args in scalar_calls if fn in self._scalar_types]
        # (name, ctypes type) of every out-parameter, laid out in one structure
        layout: list[tuple[str, CStruct]] = [
            ("memory", self._mem_v2), ("utilization", self._util), ("field_value", self._field * 1),
            ("count", ctypes.c_uint),
        ]
        layout += [(f"scalar{i}", self._scalar_types[fn][1]) for i, (fn, _) in enumerate(scalars)]
        arena_type: CStruct = type("FastArena", (ctypes.Structure,), {"_fields_": layout})
        arena = arena_type()
        types = dict(layout)

        def out(name: str) -> CStruct:
            return types[name].from_buffer(arena, getattr(arena_type, name).offset)

        # the raw answers read in one go: (name, offset in the arena, struct code)
        mem, util, fv = self._mem_v2, self._util, self._field
        reads: list[tuple[str | ScalarCall, int, str]] = [
            ("memory.total", arena_type.memory.offset + mem.total.offset, "Q"),
            ("memory.reserved", arena_type.memory.offset + mem.reserved.offset, "Q"),
            ("memory.used", arena_type.memory.offset + mem.used.offset, "Q"),
            ("utilization.gpu", arena_type.utilization.offset + util.gpu.offset, "I"),
            ("utilization.memory", arena_type.utilization.offset + util.memory.offset, "I"),
            ("field_value.valueType", arena_type.field_value.offset + fv.valueType.offset, "I"),
            ("field_value.nvmlReturn", arena_type.field_value.offset + fv.nvmlReturn.offset, "I"),
            # the union's uiVal (every member starts at its first byte), meaningful when valueType is 1
            ("field_value.uiVal", arena_type.field_value.offset + fv.value.offset, "I"),
            ("count", arena_type.count.offset, "I"),
        ]
        reads += [(key, getattr(arena_type, f"scalar{i}").offset, "Q" if ctypes.sizeof(self._scalar_types[key[0]][1]) == 8 else "I")
                  for i, key in enumerate(scalars)]
        reads.sort(key=lambda x: x[1])
        fmt, pos = "=", 0
        for _name, offset, code in reads:
            fmt += "x" * (offset - pos) + code
            pos = offset + struct.calcsize("=" + code)
        parts = Parts(handle, arena, struct.Struct(fmt).unpack_from, {name: i for i, (name, _, _) in enumerate(reads)})
        cfn = cfns.get("nvmlDeviceGetMemoryInfo")
        if cfn is not None:
            m = out("memory")
            m.version = self.nv.nvmlMemory_v2
            parts.memory = (cfn, ctypes.byref(m), m)
        cfn = cfns.get("nvmlDeviceGetUtilizationRates")
        if cfn is not None:
            u = out("utilization")
            parts.utilization = (cfn, ctypes.byref(u), u)
        cfn = cfns.get("nvmlDeviceGetFieldValues")
        if cfn is not None:
            entry = out("field_value")  # an array of one: the call takes an array
            parts.field_values = (cfn, self._field, entry)
        cfn = cfns.get("nvmlDeviceGetComputeRunningProcesses")
        if cfn is not None:
            count = out("count")
            parts.processes = (cfn, self._proc, [(self._proc * 32)()], count, ctypes.byref(count))
        for i, (fn, args) in enumerate(scalars):
            o = out(f"scalar{i}")
            parts.scalars[(fn, args)] = (self._scalar_types[fn][0], ctypes.byref(o), o)
        return parts

    def _scalar_maker(self, ctype: type[ctypes.c_uint | ctypes.c_ulonglong]) -> Callable[[str, CFunction, NvmlHandle], BoundCall]:
        def make(fn: str, cfn: CFunction, handle: NvmlHandle) -> BoundCall:
            return self._scalar(fn, cfn, handle, ctype)

        return make

    def _scalar(self, fn: str, cfn: CFunction, handle: NvmlHandle, ctype: type[ctypes.c_uint | ctypes.c_ulonglong]) -> BoundCall:
        error, out = self.error, ctype()
        ref = ctypes.byref(out)

        def call(*args: int) -> int:
            ret = cfn(handle, *args, ref)
            if ret:
                raise error(ret, fn)
            return out.value

        return call

    def _memory_v2(self, fn: str, cfn: CFunction, handle: NvmlHandle) -> BoundCall:
        error, m = self.error, self._mem_v2()
        m.version = self.nv.nvmlMemory_v2
        ref = ctypes.byref(m)
        generic = getattr(self.nv, fn)

        def call(*args: object, **kwargs: object) -> NvmlAnswer:
            if not kwargs.get("version"):  # v1: rare (drivers without v2), through nvidia-ml-py
                return to_plain(generic(handle, *args, **kwargs))
            ret = cfn(handle, ref)
            if ret:
                raise error(ret, fn)
            return {"version": m.version, "total": m.total, "reserved": m.reserved, "free": m.free, "used": m.used}

        return call

    def _utilization(self, fn: str, cfn: CFunction, handle: NvmlHandle) -> BoundCall:
        error, u = self.error, self._util()
        ref = ctypes.byref(u)

        def call() -> dict[str, int]:
            ret = cfn(handle, ref)
            if ret:
                raise error(ret, fn)
            return {"gpu": u.gpu, "memory": u.memory}

        return call

    def _processes(self, fn: str, cfn: CFunction, handle: NvmlHandle) -> BoundCall:
        error, proc = self.error, self._proc
        held = [(proc * 32)()]

        def call() -> list[dict[str, int | None]]:
            arr = held[0]
            count = ctypes.c_uint(len(arr))
            ret = cfn(handle, ctypes.byref(count), arr)
            if ret == _INSUFFICIENT_SIZE:  # more processes than slots: grow as nvidia-ml-py does
                arr = held[0] = (proc * (count.value * 2 + 5))()
                count = ctypes.c_uint(len(arr))
                ret = cfn(handle, ctypes.byref(count), arr)
            if ret:
                raise error(ret, fn)
            out = []
            for i in range(count.value):
                p = arr[i]
                used = p.usedGpuMemory
                out.append(
                    {"pid": p.pid, "usedGpuMemory": None if used == _NOT_AVAILABLE_U64 else used,
                     "gpuInstanceId": p.gpuInstanceId, "computeInstanceId": p.computeInstanceId}
                )
            return out

        return call

    def _field_values(self, fn: str, cfn: CFunction, handle: NvmlHandle) -> BoundCall:
        error, field = self.error, self._field
        arrays: dict[tuple[int, ...], CStruct] = {}

        def call(ids: Sequence[int]) -> list[dict[str, NvmlAnswer]]:
            key = tuple(ids)
            arr = arrays.get(key)
            if arr is None:
                arr = arrays[key] = (field * len(key))()
                for i, fid in enumerate(key):
                    arr[i].fieldId = fid
            ret = cfn(handle, ctypes.c_int32(len(arr)), arr)
            if ret:
                raise error(ret, fn)
            out = []
            for v in arr:
                vt = v.valueType
                member = _VALUE_MEMBERS.get(vt)
                out.append(
                    {"fieldId": v.fieldId, "scopeId": v.scopeId, "timestamp": v.timestamp, "latencyUsec": v.latencyUsec,
                     "valueType": vt, "nvmlReturn": v.nvmlReturn,
                     "value": getattr(v.value, member) if member else None}
                )
            return out

        return call


class Parts:
    """One device's fast-set C functions with their out-structs: ``(cfn, ref, struct)`` for
    memory (v2, version set) and utilization, ``(cfn, struct type, entry)`` for one field value,
    ``(cfn, struct type, [array], count, byref(count))`` for the process list (the array grows
    when too small; ``count`` is set to its length before each call), and
    ``scalars[(fn, args)] = (cfn, ref, out)`` for the plain-getter calls. ``None``: this driver lacks it.

    Every out-parameter but the process array lies in ``arena``; ``read()`` returns all their
    raw values at once, ``at[name]`` giving each one's place: ``memory.total``,
    ``memory.reserved``, ``memory.used``, ``utilization.gpu``, ``utilization.memory``,
    ``field_value.valueType``, ``field_value.nvmlReturn``, ``field_value.uiVal``, ``count``
    and each scalar call by its ``(function, args)``."""

    __slots__ = ("handle", "arena", "memory", "utilization", "field_values", "processes", "scalars", "unpack", "at")

    def __init__(
        self,
        handle: NvmlHandle,
        arena: ctypes.Structure,
        unpack: Callable[[ctypes.Structure], tuple[int, ...]],
        at: dict[str | ScalarCall, int],
    ) -> None:
        self.handle = handle
        self.arena = arena
        self.memory: tuple[CFunction, CRef, CStruct] | None = None
        self.utilization: tuple[CFunction, CRef, CStruct] | None = None
        self.field_values: tuple[CFunction, CStruct, CStruct] | None = None
        self.processes: tuple[CFunction, CStruct, list[CStruct], ctypes.c_uint, CRef] | None = None
        self.scalars: dict[ScalarCall, tuple[CFunction, CRef, ctypes.c_uint | ctypes.c_ulonglong]] = {}
        self.unpack = unpack
        self.at = at

    def read(self) -> tuple[int, ...]:
        """Every raw answer in the arena, as the last calls left them (places in ``at``)."""
        return self.unpack(self.arena)
