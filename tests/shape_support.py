"""A JSON document against the TypedDict that declares it (``vgpumon.diagnose.schema.Report``,
``vgpumon.capacity.schema.Review``): mypy checks the code that builds a report, but the values come
from the store and the agent's answer at run time, so the tests hold the document itself to the
declaration — every required key present, no undeclared key, every value of its declared type."""

from __future__ import annotations

import types
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints, is_typeddict


def mismatches(value: Any, declared: Any, path: str = "$") -> list[str]:
    """Where ``value`` (parsed JSON, or the builder's dict) differs from ``declared``: one line per
    difference, ``[]`` when it conforms. JSON has no tuples (a tuple is a list of its length) and
    writes a float without a fraction as an integer; ``bool`` is never taken for a number."""
    if is_typeddict(declared):
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, not an object ({declared.__name__})"]
        hints = get_type_hints(declared)
        out = [f"{path}.{k}: missing ({declared.__name__})" for k in sorted(declared.__required_keys__ - value.keys())]
        out += [f"{path}.{k}: not declared in {declared.__name__}" for k in value if k not in hints]
        for k, v in value.items():
            if k in hints:
                out += mismatches(v, hints[k], f"{path}.{k}")
        return out
    origin, args = get_origin(declared), get_args(declared)
    if origin in (Union, types.UnionType):
        tried = [mismatches(value, arm, path) for arm in args]
        return [] if any(not t for t in tried) else [f"{path}: {value!r:.60} is none of {declared}"]
    if origin is Literal:
        return [] if value in args else [f"{path}: {value!r} is not one of {args}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: {type(value).__name__}, not a list"]
        return [m for i, v in enumerate(value) for m in mismatches(v, args[0], f"{path}[{i}]")]
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            return [f"{path}: {value!r:.60} is not a {len(args)}-tuple"]
        return [m for i, (v, a) in enumerate(zip(value, args)) for m in mismatches(v, a, f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, not an object"]
        return [m for k, v in value.items() for m in [*mismatches(k, args[0], f"{path} key"), *mismatches(v, args[1], f"{path}[{k!r}]")]]
    if declared is type(None):
        return [] if value is None else [f"{path}: {value!r:.60} is not null"]
    if declared is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif declared is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif declared in (str, bool):
        ok = isinstance(value, declared)
    else:
        raise TypeError(f"{path}: no check for {declared!r}")
    return [] if ok else [f"{path}: {value!r:.60} is not {declared.__name__}"]
