"""What the exporter and the API read of the agent, as protocols: the exporter sits below the agent
(docs/architecture.md, "Packages and the direction of imports") and imports none of it, nor any
source. ``vgpumon.agent.Agent`` and ``vgpumon.sources.vllm.VllmSource`` satisfy them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping, Protocol, Sequence

if TYPE_CHECKING:
    from vgpumon.model import Snapshot
    from vgpumon.model.topology import PcieTopology
    from vgpumon.model.vllm import ServerSample
    from vgpumon.store import Store
    from vgpumon.store.spool import Backlog


class DiscoveredProcess(Protocol):
    """A vLLM server found in the process table (``VllmProcess``), as the API's stacks read it."""

    @property
    def pid(self) -> int: ...

    @property
    def engine_pids(self) -> Sequence[int]: ...


class VllmView(Protocol):
    """The vLLM source's newest sample per server and its poll cadence."""

    @property
    def servers(self) -> Mapping[tuple[str, int], ServerSample | None]: ...

    @property
    def interval(self) -> float: ...

    def discovered(self) -> Mapping[str, DiscoveredProcess]: ...

    def clock(self) -> float: ...


class HostSourceView(Protocol):
    """The host source's values refused at the door, per field."""

    @property
    def rejected(self) -> Mapping[str, int]: ...


class AgentView(Protocol):
    """The agent as the exporter and the API see it."""

    hostname: str
    interval: float
    #: a live agent (ticks on the wall clock); ``False`` for a replay, whose ticks carry the
    #: capture's time
    paced: bool
    # read-only (properties): the agent holds its own sources, which satisfy these views
    @property
    def vllm(self) -> VllmView | None: ...

    @property
    def host(self) -> HostSourceView | None: ...

    @property
    def stats(self) -> object:
        """``AgentStats``, which lives above the exporter: opaque here, its counters are read by
        name (collector._STATS)."""
    backlog: Backlog
    topology: PcieTopology | None
    latest: Snapshot | None
    store: Store | None
    observers: list[Callable[[Snapshot], None]]

    def monotonic(self) -> float: ...
