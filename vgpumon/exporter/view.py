"""What the exporter and the API read of the agent, as protocols: the exporter sits below the agent
(docs/architecture.md, "Packages and the direction of imports") and imports none of it, nor any
source. ``vgpumon.agent.Agent`` and ``vgpumon.sources.vllm.VllmSource`` satisfy them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

if TYPE_CHECKING:
    from vgpumon.model import Snapshot
    from vgpumon.model.topology import PcieTopology
    from vgpumon.model.vllm import ServerSample
    from vgpumon.store import Store
    from vgpumon.store.spool import Backlog


class VllmView(Protocol):
    """The vLLM source's newest sample per server and its poll cadence."""

    servers: Mapping[str, ServerSample | None]
    interval: float
    discovered: Any

    def clock(self) -> float: ...


class HostSourceView(Protocol):
    """The host source's values refused at the door, per field."""

    rejected: Mapping[str, int]


class AgentView(Protocol):
    """The agent as the exporter and the API see it."""

    hostname: str
    interval: float
    vllm: VllmView | None
    host: HostSourceView | None
    stats: Any  # ``AgentStats``: its counters are read by name (collector._STATS)
    backlog: Backlog
    topology: PcieTopology | None
    latest: Snapshot | None
    store: Store | None
    observers: list[Callable[[Snapshot], None]]

    def monotonic(self) -> float: ...
