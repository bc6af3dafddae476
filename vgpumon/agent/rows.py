"""A tick's snapshot encoded as the store's rows, once, on the thread that took it."""



from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Mapping

from vgpumon.catalogue import is_rejection
from vgpumon.model import HostSample, Snapshot
from vgpumon.store.codec import encode_gpu_sample, storable
from vgpumon.store.tables import TickRows

if TYPE_CHECKING:
    pass
from vgpumon.agent.state import AgentState

log = logging.getLogger("vgpumon.agent")


class TickEncoder(AgentState):
    """Encodes each snapshot into ``TickRows`` (a part of ``Agent``: it reads the GPU and host ids
    the writer registered)."""

    def _rejected_rows(self, ts: float, subject: str, failed: Mapping[str, str]) -> list[dict[str, Any]]:
        """``rejected_values`` rows for the values refused at the door (reasons ``rejected: …``)."""
        if self._host_id is None:
            return []
        return [
            {"host_id": self._host_id, "ts": ts, "subject": subject[:160], "field": name[:64], "reason": reason[:255]}
            for name, reason in failed.items()
            if is_rejection(reason)
        ]

    def _tick_rows(self, snap: Snapshot) -> TickRows:
        """The rows one tick writes, per table.

        Every value rejected at the door (or that cannot be encoded) becomes a
        ``rejected_values`` row beside its NULL, so reports can count them; it costs only its
        own field, never its row or the batch.
        """
        ids = self._gpu_ids
        host_id = self._host_id
        rejected: list[dict[str, Any]] = []

        def reject(ts: float, subject: str, failed: Mapping[str, str]) -> None:
            rejected.extend(self._rejected_rows(ts, subject, failed))

        gpu_rows = []
        for s in snap.samples:
            if s.uuid not in ids:
                continue
            failed: dict[str, str] = {}
            gpu_rows.append(encode_gpu_sample(ids[s.uuid], s, failed))
            reject(s.ts, f"gpu:{s.uuid}", {**s.missing, **failed})
        rows: TickRows = {
            "gpu_samples": gpu_rows,
            "xid_events": [
                {"gpu_id": ids[e.uuid], "ts": e.ts, "xid": e.xid, "seq": e.seq} for e in snap.xid_events if e.uuid in ids
            ],
        }
        h: HostSample | None = snap.host
        if h is not None and host_id is not None:
            host_row = {
                "host_id": host_id, "ts": h.ts, "cpu_ratio": h.cpu_ratio,
                "memory_used_bytes": h.memory_used_bytes, "memory_total_bytes": h.memory_total_bytes,
                "load1": h.load1, "load5": h.load5, "load15": h.load15,
            }
            reject(h.ts, "host", {**h.missing, **storable("host_samples", host_row)})
            rows["host_samples"] = [host_row]
            procs = []
            for s in snap.samples:
                for pid, used in s.processes:
                    p = h.processes.get(pid)
                    if p is None or s.uuid not in ids:
                        continue
                    row = {
                        "host_id": host_id, "gpu_id": ids[s.uuid], "ts": s.ts, "pid": pid,
                        "start_time": p.start_time, "name": p.name, "cmdline": p.cmdline, "username": p.username,
                        "container_id": p.container_id, "resolved": p.resolved, "used_gpu_memory_bytes": used,
                        "rss_bytes": p.rss_bytes, "cpu_seconds_total": p.cpu_seconds_total,
                    }
                    reject(s.ts, f"gpu:{s.uuid}", storable("gpu_process_samples", row))
                    procs.append(row)
            rows["gpu_process_samples"] = procs
        rows["rejected_values"] = rejected
        if host_id is not None:
            rows["host_events"] = [
                {"host_id": host_id, "ts": e.ts, "kind": e.kind, "subject": e.subject[:160], "detail": e.detail[:255]}
                for e in snap.events
            ]
        return rows
