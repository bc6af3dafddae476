"""vLLM source: discovery (``discovery``), ``/metrics`` reading across versions (``metrics``),
interval figures (``derive``), KV fragmentation (``kv``), per-server state (``state``) and the
asynchronous scraper that ties them together (``source``). See docs/vllm.md."""

from vgpumon.sources.vllm.discovery import NoProcesses, PsutilProcessTable, VllmProcess
from vgpumon.sources.vllm.source import GpuActivityLog, InstanceIdentity, ServerSample, VllmSource
from vgpumon.sources.vllm.state import ServerState

__all__ = [
    "GpuActivityLog",
    "InstanceIdentity",
    "NoProcesses",
    "PsutilProcessTable",
    "ServerSample",
    "ServerState",
    "VllmProcess",
    "VllmSource",
]
