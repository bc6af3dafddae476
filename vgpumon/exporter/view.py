"""What the exporter and the API read of the agent, as protocols: the exporter sits below the agent
(docs/architecture.md, "Packages and the direction of imports") and imports none of it, nor any
source: every source's readings and status reach it on the tick's snapshot (``latest``, and each
one ``observers`` are given). ``vgpumon.agent.Agent`` satisfies them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    from vgpumon.model import Snapshot
    from vgpumon.model.topology import PcieTopology
    from vgpumon.store import Store
    from vgpumon.store.spool import Backlog


class AgentView(Protocol):
    """The agent as the exporter and the API see it."""

    hostname: str
    interval: float
    #: a live agent (ticks on the wall clock); ``False`` for a replay, whose ticks carry the
    #: capture's time
    paced: bool
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
