"""vgpumon: GPU fleet telemetry and diagnostics for LLM inference hosts."""

__version__ = "0.1.0"
