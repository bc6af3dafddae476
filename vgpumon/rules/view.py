"""What a rule sees of one host at one evaluation time: lazy, cached reads of the store.

Every window ends at ``at`` (the evaluation time: the agent's newest stored tick, or the end of
``diagnose``'s window), so the agent and ``diagnose`` read the same data for the same time. A
read is made once per evaluation however many rules need it.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from vgpumon.model import fingerprint
from vgpumon.store import Store, StoredGpu


class HostView:
    """The stored data of one host as of ``at``.

    Args:
        store: an open store.
        hostname: the host as stored.
        at: evaluation time (epoch seconds); windows are ``[at − length, at]``.
        wall: "now" for the silence rule: the wall clock in a live agent, ``at`` otherwise (a
            replay or a post-mortem is not silent because it is old).
        active: fingerprints of the alerts now pending or firing: a rule clears at a lower
            threshold than it fires at while its alert is active (hysteresis).
    """

    def __init__(self, store: Store, hostname: str, at: float, *, wall: float | None = None, active: frozenset[str] = frozenset()) -> None:
        self.store = store
        self.hostname = hostname
        self.at = at
        self.wall = at if wall is None else wall
        self.active = active
        self._cache: dict[Any, Any] = {}

    def _memo(self, key: Any, load: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = load()
        return self._cache[key]

    def is_active(self, rule: str, labels: dict[str, str]) -> bool:
        """The rule's alert on this subject is pending or firing now."""
        return fingerprint(rule, labels) in self.active

    # -- GPUs ------------------------------------------------------------------------------------

    @property
    def gpus(self) -> list[StoredGpu]:
        """GPUs registered for the host (every GPU its agent ever found), by index."""
        return self._memo("gpus", lambda: self.store.gpus_of(self.hostname))

    def window(self, seconds: float, columns: Sequence[str], aggregates: Sequence[str] = ("min", "mean", "max", "count")) -> dict[int, dict[str, Any]]:
        """Per GPU, aggregates of raw columns over ``[at − seconds, at]`` (one query for all)."""
        key = ("window", seconds, tuple(columns), tuple(aggregates))
        ids = [g.id for g in self.gpus]
        return self._memo(key, lambda: self.store.window_aggregates_many(ids, self.at - seconds, self.at, columns, aggregates))

    def latest(self, columns: Sequence[str]) -> dict[int, dict[str, Any]]:
        """Per GPU, its newest row at or before ``at`` (``ts`` and the columns)."""
        ids = [g.id for g in self.gpus]
        return self._memo(("latest", tuple(columns)), lambda: self.store.latest(ids, columns, until=self.at))

    def last_values(self, gpu_id: int, columns: Sequence[str]) -> dict[str, tuple[float, Any] | None]:
        """Newest non-NULL value of each column at or before ``at`` (counters and latched flags
        the slow set reads every few ticks)."""
        return self._memo(("last", gpu_id, tuple(columns)), lambda: self.store.last_values(gpu_id, self.at, columns))

    def percentiles(self, gpu_id: int, seconds: float, columns: Sequence[str], quantiles: Sequence[float]) -> dict[str, dict[float, float | None]]:
        key = ("pct", gpu_id, seconds, tuple(columns), tuple(quantiles))
        return self._memo(key, lambda: self.store.window_percentiles(gpu_id, self.at - seconds, self.at, columns, quantiles))

    def series(self, gpu_id: int, seconds: float, columns: Sequence[str]) -> list[dict[str, Any]]:
        key = ("series", gpu_id, seconds, tuple(columns))
        return self._memo(key, lambda: self.store.series(gpu_id, self.at - seconds, self.at, columns))

    def summed(self, gpu_ids: Sequence[int], seconds: float, columns: Sequence[str]) -> list[dict[str, Any]]:
        key = ("summed", tuple(gpu_ids), seconds, tuple(columns))
        return self._memo(key, lambda: self.store.summed_series(gpu_ids, self.at - seconds, self.at, columns))

    def rollups(self, gpu_id: int, seconds: float, columns: Sequence[str]) -> list[dict[str, Any]]:
        key = ("rollups", gpu_id, seconds, tuple(columns))
        return self._memo(key, lambda: self.store.rollup_series(gpu_id, self.at - seconds, self.at, columns))

    def xids(self, seconds: float) -> list[tuple[float, int, int]]:
        return self._memo(("xids", seconds), lambda: self.store.host_xid_events(self.hostname, self.at - seconds, self.at))

    def events(self, seconds: float) -> list[dict[str, Any]]:
        return self._memo(("events", seconds), lambda: self.store.gpu_events(self.hostname, self.at - seconds, self.at))

    def process_memory(self, seconds: float) -> list[dict[str, Any]]:
        ids = [g.id for g in self.gpus]
        return self._memo(("procmem", seconds), lambda: self.store.process_memory_series(ids, self.at - seconds, self.at))

    def rejections(self, seconds: float) -> dict[str, dict[str, tuple[int, str]]]:
        return self._memo(("rejected", seconds), lambda: self.store.rejections(self.hostname, self.at - seconds, self.at))

    @property
    def topology(self) -> Any:
        return self._memo("topology", lambda: self.store.topology(self.hostname))

    @property
    def newest_host_sample(self) -> float | None:
        return self._memo("host_newest", lambda: self.store.newest_host_sample(self.hostname))

    # -- vLLM ------------------------------------------------------------------------------------

    @property
    def _vllm(self) -> Any:
        from vgpumon.store.vllm_repository import VllmRepository

        return self._memo("vllm_repo", lambda: VllmRepository(self.store.engine))

    @property
    def vllm_instances(self) -> list[dict[str, Any]]:
        """Server starts of the host that began at or before ``at``, oldest first."""
        return self._memo("vllm", lambda: [i for i in self._vllm.instances(self.hostname) if i["first_seen"] <= self.at])

    def vllm_samples(self, instance_id: int, seconds: float | None) -> list[dict[str, Any]]:
        """Polls of one start in ``[at − seconds, at]`` (``None``: since the start)."""
        start = None if seconds is None else self.at - seconds
        return self._memo(("vllm_s", instance_id, seconds), lambda: self._vllm.samples(instance_id, start, self.at))

    def vllm_engine_samples(self, instance_id: int, seconds: float) -> list[dict[str, Any]]:
        return self._memo(("vllm_e", instance_id, seconds), lambda: self._vllm.engine_samples(instance_id, self.at - seconds, self.at))

    def vllm_gpu_map(self, instance_id: int) -> list[dict[str, Any]]:
        return self._memo(("vllm_g", instance_id), lambda: self._vllm.gpu_map(instance_id))
