"""Host fields (``host_samples``): psutil's view of the machine the GPUs sit in."""

from __future__ import annotations

from vgpumon.catalogue.core import INT64, LOAD, RATIO, Encoding, Field

_HOST_MEMORY_MAX = float(2**50)  # 1 PiB: above any host, below every sentinel


#: A GPU process's command line as stored, shown and served (masked first): at most this many
#: characters, the rest cut off with an ellipsis. Any local user chooses it (up to 2 MiB on
#: Linux), and it is stored with every tick of every GPU that process uses; a real
#: ``vllm serve`` with its options is a few hundred characters.
COMMAND_LINE_LENGTH = 4096

def _host(name: str, kind: str, unit: str, help: str, source: str, encoding: Encoding, **kw: object) -> Field:
    return Field(name=name, table="host_samples", kind=kind, unit=unit, help=help, source=source, cadence="host",
                 encoding=encoding, **kw)  # type: ignore[arg-type]


def _load(minutes: int) -> Field:
    return _host(
        f"load{minutes}", "gauge", "load", f"Load average over {minutes} minute{'s' if minutes > 1 else ''}.",
        f"os.getloadavg()[{ {1: 0, 5: 1, 15: 2}[minutes]}]", LOAD, lo=0, hi=1e6,
        prometheus=f"vgpumon_host_load{minutes}", display="number", label=f"load {minutes}m",
    )


HOST: tuple[Field, ...] = (
    _host(
        "cpu_ratio", "gauge", "ratio", "Share of all CPUs busy since the previous host sample.",
        "psutil.cpu_percent(interval=None) / 100", RATIO, lo=0, hi=1, prometheus="vgpumon_host_cpu_ratio",
        label="CPU busy", note="None on the first sample (no interval yet)",
    ),
    _host(
        "memory_used_bytes", "gauge", "bytes", "Host memory that cannot be reclaimed without swapping (total − available).",
        "psutil.virtual_memory() total − available", INT64, lo=0, hi=_HOST_MEMORY_MAX,
        prometheus="vgpumon_host_memory_used_bytes", label="host memory used",
    ),
    _host(
        "memory_total_bytes", "gauge", "bytes", "Host physical memory.", "psutil.virtual_memory().total", INT64,
        lo=0, hi=_HOST_MEMORY_MAX, prometheus="vgpumon_host_memory_total_bytes", label="host memory total",
    ),
    _load(1),
    _load(5),
    _load(15),
)
