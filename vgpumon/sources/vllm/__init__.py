"""vLLM source: discovery (``discovery``), ``/metrics`` reading across versions (``metrics``),
interval figures (``derive``), KV fragmentation (``kv``), per-server state (``state``) and the
asynchronous scraper that ties them together (``source``). See docs/vllm.md."""

from vgpumon.model import InstanceIdentity, ServerSample, ServerState
from vgpumon.sources.vllm.discovery import NoProcesses, PsutilProcessTable, VllmProcess
from vgpumon.sources.vllm.source import GpuActivityLog, VllmSource

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
