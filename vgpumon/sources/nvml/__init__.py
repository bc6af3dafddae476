"""The NVML source: every GPU read each tick through one choke point, as plain data.

- ``source``: ``NvmlSource``, the tick (and the wedged-read hand-over) over its parts:
  ``lifecycle`` (init, identify, back-off), ``device`` (one device's general reads),
  ``crosscheck`` (GPM's PCIe against ``nvmlDeviceGetPcieThroughput``);
- ``reads``: the choke point (``_Reader``) every call passes;
- ``fastpath``: the optimisation, a generated straight-line read per device;
- ``constants``: NVML's constants, the GPM ids, the collector's limits and errors.
"""

from vgpumon.sources.nvml.constants import CLOCK_STEP_SECONDS, GPM_METRICS, NVML_MEMORY_V2
from vgpumon.sources.nvml.source import NvmlSource

__all__ = ["CLOCK_STEP_SECONDS", "GPM_METRICS", "NVML_MEMORY_V2", "NvmlSource"]
