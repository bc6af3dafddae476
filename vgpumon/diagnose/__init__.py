"""The on-call report of one host (pure data; rendering is ``vgpumon.diagnose.render``).

The window ends at the newest stored sample of the host (not at "now"), so a report on a replayed
capture or on a host whose agent died an hour ago still describes the last data there is; the age
of that data is part of the report, and stale data never hides a known problem.

Findings come from the rule engine (``vgpumon.rules``): the same rules the agent evaluates, at the
end of the window, through the same alert lifecycle (``Engine.evaluate_window``), plus a few
observations of diagnose's own (``vgpumon.diagnose.findings``). The exit status is the verdict:
the worst severity among the firing alerts and those observations, UNKNOWN when nothing worse is
known and the data is missing or stale.

Modules: ``schema`` (the report's shape: ``Report`` and its parts, TypedDicts), ``report``
(``build_report``), ``findings`` (findings and the verdict), ``gpus`` (the per-GPU figures and
health areas), ``context`` (vLLM servers, processes, trends, freshness).
Decisions: docs/diagnose.md.
"""

from typing import TYPE_CHECKING

from vgpumon.base.fmt import iso
from vgpumon.diagnose.findings import SEVERITY_RANK
from vgpumon.diagnose.report import SEVERITY_EXIT, build_report, exit_code, parse_since, resolve_host, unknown_report
from vgpumon.diagnose.schema import Report

if TYPE_CHECKING:  # what ``__getattr__`` loads, as the type checker sees it
    from vgpumon.diagnose.gpus import CUMULATIVE, HEALTH_AREAS, LAST_COLUMNS, NOT_HEALTH, WINDOW_COLUMNS

#: Names of ``vgpumon.diagnose.gpus``, loaded on first use: they need the store (SQLAlchemy),
#: which a report fetched from the agent does not (``vgpumon diagnose HOST`` starts faster).
_FROM_GPUS = frozenset({"CUMULATIVE", "HEALTH_AREAS", "LAST_COLUMNS", "NOT_HEALTH", "WINDOW_COLUMNS"})


def __getattr__(name: str) -> object:
    if name in _FROM_GPUS:
        from vgpumon.diagnose import gpus

        return getattr(gpus, name)
    raise AttributeError(f"module 'vgpumon.diagnose' has no attribute {name!r}")

#: Former name of ``iso`` (``vgpumon db stats`` and older callers).
_iso = iso

__all__ = [
    "CUMULATIVE",
    "HEALTH_AREAS",
    "LAST_COLUMNS",
    "NOT_HEALTH",
    "Report",
    "SEVERITY_EXIT",
    "SEVERITY_RANK",
    "WINDOW_COLUMNS",
    "build_report",
    "exit_code",
    "iso",
    "parse_since",
    "resolve_host",
    "unknown_report",
]
