"""The agent's shared state, declared once: the parts of ``Agent`` (the writer, the sampler, the
tick encoder, the supervision of the other sources) each read and write some of it, and
``Agent.__init__`` sets all of it. Declaring it here gives each part, and the type checker, one
list of what the agent holds; the methods at the bottom are those one part calls of another."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Mapping

if TYPE_CHECKING:
    from vgpumon.agent.stats import AgentStats
    from vgpumon.alerts.runner import RuleRunner
    from vgpumon.base.errors import StoreUnavailableError
    from vgpumon.base.workers import DaemonExecutor, Latch
    from vgpumon.model import GpuIdentity, HostSample, NvmlReading, PcieTopology, Snapshot
    from vgpumon.sources.host import HostSource
    from vgpumon.sources.kubernetes import KubernetesSource
    from vgpumon.sources.nvml import NvmlSource
    from vgpumon.sources.vllm import VllmSource
    from vgpumon.store import Store
    from vgpumon.store.retention import Retention
    from vgpumon.store.spool import Backlog
    from vgpumon.store.tables import TickRows
    from vgpumon.store.vllm_repository import VllmRepository


class AgentState:
    """What the agent holds (set by ``Agent.__init__``; see its docstring for each setting)."""

    source: NvmlSource
    store: Store | None
    hostname: str
    interval: float
    duration: float | None
    paced: bool
    recorded_pace: bool
    flush_interval: float
    monotonic: Callable[[], float]
    clock: Callable[[], float]
    _last_clock: tuple[float, float] | None
    on_tick: Callable[[Snapshot], None] | None
    observers: list[Callable[[Snapshot], None]]
    host: HostSource | None
    sysfs_root: str | None
    host_every: int
    topology: PcieTopology | None
    vllm: VllmSource | None
    vllm_backoff: float
    vllm_backoff_max: float
    vllm_stop_timeout: float
    _vllm_repo: VllmRepository | None
    latest: Snapshot | None
    stats: AgentStats
    _pending: deque[TickRows]
    _gpu_ids: dict[str, int]
    _host_id: int | None
    _registered: tuple[GpuIdentity, ...]
    _writer: asyncio.Task[None] | None
    backlog: Backlog
    retention: Retention | None
    maintenance_every: float
    _last_maintenance: float
    _last_flush: float
    _outage_since: float | None
    _outage_rows: int
    _folded_at_outage: int
    _nvml_exec: DaemonExecutor
    _stopping: Latch
    _host_sample: HostSample | None
    call_deadline: float
    store_deadline: float
    _store_abandoned: bool
    _cut: tuple[float, float] | None
    _loop: asyncio.AbstractEventLoop | None
    _store_exec: DaemonExecutor
    _host_exec: ThreadPoolExecutor
    rules: RuleRunner | None
    kubernetes: KubernetesSource | None
    _last_host: HostSample | None
    _first: tuple[float, float] | None
    _gen: int
    watchdog: str
    _alarm: bool
    _alarm_lock: threading.Lock
    _reading: int | None

    # --- what one part calls of another --------------------------------------------------------
    def _tick_time(self) -> float:
        raise NotImplementedError

    def _take(self, reading: NvmlReading, host: HostSample | None) -> Snapshot:
        raise NotImplementedError

    def _host_due(self) -> bool:
        raise NotImplementedError

    def _past_duration(self, ts: float) -> bool:
        raise NotImplementedError

    def _flush(self) -> None:
        raise NotImplementedError

    def _tick_rows(self, snap: Snapshot) -> TickRows:
        raise NotImplementedError

    def _outage_begins(self, exc: StoreUnavailableError, where: str) -> None:
        raise NotImplementedError

    def _attribute(self, snap: Snapshot) -> Snapshot:
        raise NotImplementedError

    def _rejected_rows(self, ts: float, subject: str, failed: Mapping[str, str]) -> list[dict[str, object]]:
        raise NotImplementedError

    def _register_blocking(self) -> None:
        raise NotImplementedError

    def _run_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop of the run in progress (set by ``run`` before any part needs it)."""
        loop = self._loop
        assert loop is not None, "the agent is not running"
        return loop
