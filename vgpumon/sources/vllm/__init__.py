"""vLLM source: discovery (``discovery``), ``/metrics`` reading across versions (``metrics``),
interval figures (``derive``), KV fragmentation (``kv``), per-server state (``state``), the poll
of one server (``scrape``), the GPU activity behind the prewarm figure (``activity``) and the
asynchronous source that ties them together (``source``). See docs/vllm.md."""

from vgpumon.model import InstanceIdentity, ServerSample, ServerState
from vgpumon.sources.vllm.activity import GpuActivityLog
from vgpumon.sources.vllm.discovery import NoProcesses, PsutilProcessTable, VllmProcess
from vgpumon.sources.vllm.source import VllmSource

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
