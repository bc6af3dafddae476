"""Supervision of the agent's other sources: the vLLM source's task, restarted with back-off, and
the Kubernetes attribution of each snapshot."""



from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from vgpumon.base.pacing import sleep_unless
from vgpumon.model import Snapshot

if TYPE_CHECKING:
    from vgpumon.sources.vllm import ServerSample
from vgpumon.agent.state import AgentState

log = logging.getLogger("vgpumon.agent")


class Supervision(AgentState):
    """The vLLM task and the kubelet's attribution (a part of ``Agent``)."""

    def _take_vllm(self, samples: list[ServerSample]) -> None:
        """Queue a poll's samples with the GPU rows (next flush, same backlog)."""
        self.stats.vllm_samples += len(samples)
        if self.store is None or self._host_id is None or not samples:
            return
        from vgpumon.store.vllm_repository import VllmRepository

        self._pending.append(
            {
                "vllm_samples": [VllmRepository.encode_sample(self._host_id, s) for s in samples],
                "rejected_values": [
                    r for s in samples for r in self._rejected_rows(s.ts, f"vllm:{s.instance.url}", s.rejected)
                ],
            }
        )

    async def _run_vllm(self, stop: asyncio.Event) -> None:
        """Run the vLLM source until ``stop``; restart it with back-off whenever it fails."""
        assert self.vllm is not None
        failures = 0
        try:
            while not stop.is_set():
                try:
                    async for samples in self.vllm.run(stop):
                        failures = 0
                        self._take_vllm(samples)
                except Exception as exc:  # noqa: BLE001 - the vLLM source must never take the GPU sampling down
                    failures += 1
                    self.stats.vllm_restarts += 1
                    delay = min(self.vllm_backoff * 2 ** (failures - 1), self.vllm_backoff_max)
                    log.error(
                        "vLLM source failed (%s: %s); restart %d in %.1f s",
                        type(exc).__name__, exc, self.stats.vllm_restarts, delay, exc_info=exc,
                    )
                    await sleep_unless(stop, delay)
        finally:
            try:
                await self.vllm.close()
            except Exception:  # noqa: BLE001 - closing must not cost the GPU rows their drain
                log.exception("closing the vLLM source failed")

    async def _stop_vllm(self, task: asyncio.Task[None]) -> None:
        """Let the vLLM task end its poll (its requests have timeouts, a process-table read may
        not), for at most ``vllm_stop_timeout`` seconds; then cancel it. Never raises: the GPU
        rows are drained after this whatever the source did."""
        done, _ = await asyncio.wait({task}, timeout=self.vllm_stop_timeout)
        if not done:
            log.error("vLLM source did not stop within %.0f s; cancelled", self.vllm_stop_timeout)
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)
        elif not task.cancelled() and task.exception() is not None:  # supervised already: a bug
            log.error("vLLM source ended with an error", exc_info=task.exception())

    def _attribute(self, snap: Snapshot) -> Snapshot:
        """The snapshot with the kubelet's newest allocations attached (pod, namespace, container
        of its GPUs and GPU processes); unchanged while there are none (no kubelet). The source's
        status is put beside NVML's when the snapshot is built."""
        from vgpumon.sources.kubernetes import attach

        assert self.kubernetes is not None  # _last_host: the newest host sample, kept by _take
        return attach(snap, self.kubernetes.current(), host=self._last_host)
