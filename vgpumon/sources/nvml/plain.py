"""pynvml's answers as plain data: structs as dicts of their fields, so that a capture is JSON and a
replay answers as the hardware did. Used by the live backend and the fast path's fallbacks."""

from __future__ import annotations

import ctypes
from typing import Any

#: ``nvmlValueType_t`` → member of ``nvmlValue_t`` (nvml.h: DOUBLE 0, UNSIGNED_INT 1,
#: UNSIGNED_LONG 2, UNSIGNED_LONG_LONG 3, SIGNED_LONG_LONG 4, SIGNED_INT 5, UNSIGNED_SHORT 6).
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def to_plain(value: Any) -> Any:
    """Convert a pynvml answer into JSON-able plain data (struct → dict of its fields)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, ctypes.Array):
        return [to_plain(v) for v in value]
    if isinstance(value, (ctypes.Structure, ctypes.Union)):
        out: dict[str, Any] = {}
        for name, ctype, *_ in value._fields_:
            if issubclass(ctype, (ctypes._Pointer, ctypes.c_void_p)):
                continue
            member = getattr(value, name)
            if isinstance(member, ctypes.Union) and name == "value" and out.get("valueType") in _VALUE_MEMBERS:
                # nvmlFieldValue_t: the union holds one member, named by valueType; the others
                # reinterpret its bytes (a double read from an integer can be NaN).
                out[name] = to_plain(getattr(member, _VALUE_MEMBERS[out["valueType"]]))
            else:
                out[name] = to_plain(member)
        return out
    if isinstance(value, ctypes._SimpleCData):
        return to_plain(value.value)
    if hasattr(value, "__dict__"):  # pynvml's nvmlFriendlyObject
        return {k: to_plain(v) for k, v in vars(value).items()}
    return repr(value)
