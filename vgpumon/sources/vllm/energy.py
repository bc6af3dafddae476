"""Energy per generated token, per vLLM server (docs/vllm.md, "Energy per token").

NVML's energy counter (``energy_joules_total``, read once a minute: the minute set) of each GPU the
server holds, over the interval between two reads, divided by the server's generation tokens over
the same interval. The tokens are the server's own counter (``vllm:generation_tokens_total``, read
at every poll), interpolated linearly to the energy reads' times: a poll every 2 s against reads a
minute apart would otherwise misplace up to 2 s of tokens (3 %) at each end.

* **A GPU shared** with processes outside the server's tree (another server, a notebook): the
  server is charged the share of the GPU's energy its processes hold of the GPU's memory (NVML's
  per-process used memory), and the figure says so. Where NVML reports no per-process memory, the
  share is by process count, said as well.
* **A counter reset** (the energy counter fell: a driver reload) gives no figure for that
  interval, with the reason; the next interval counts from the new reading.
* **An idle interval** (no token generated) gives no figure ("no tokens generated"), never an
  infinite or a zero one: energy spent serving nothing has no per-token cost.

Pure: fed the agent's snapshots (``GpuEnergyLog.observe``) and each poll's token counter
(``EnergyMeter.note_tokens``); reads no clock and no device.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from vgpumon.model import Snapshot

#: seconds of token readings kept per server: two energy reads (a minute apart at the defaults) and slack
_TOKEN_HISTORY_S = 300.0


@dataclass(frozen=True, slots=True)
class EnergyPerToken:
    """One interval's figure, or why there is none.

    Attributes:
        joules_per_token: the server's energy over the interval / its generation tokens; ``None``
            when there is no figure (``note`` says why).
        joules: the server's share of its GPUs' energy over the interval (``None`` without one).
        tokens: generation tokens over the interval (``None`` when not known).
        start, end: the interval (the energy reads' times, epoch seconds).
        note: why there is no figure, or how shared GPUs were split; ``""`` otherwise.
    """

    joules_per_token: float | None
    joules: float | None
    tokens: float | None
    start: float
    end: float
    note: str = ""


class GpuEnergyLog:
    """Each GPU's newest energy read and compute processes, from the agent's snapshots."""

    def __init__(self) -> None:
        self.reads: dict[str, tuple[float, float]] = {}  # uuid → (ts, joules)
        self.processes: dict[str, tuple[tuple[int, int | None], ...]] = {}  # uuid → (pid, used bytes)

    def observe(self, snap: Snapshot) -> None:
        for s in snap.samples:
            if s.energy_joules_total is not None:
                self.reads[s.uuid] = (snap.ts, s.energy_joules_total)
            if s.up:
                self.processes[s.uuid] = s.processes


def memory_shares(gpus: Iterable[str], processes: Mapping[str, Sequence[tuple[int, int | None]]],
                  server_pids: Iterable[int]) -> tuple[dict[str, float], str]:
    """The share of each GPU's energy a server is charged: the memory its processes hold of the
    memory all compute processes hold (1 when it is alone on the GPU), and the words that say
    how a shared GPU was split (``""`` when none was)."""
    mine_pids = set(server_pids)
    shares: dict[str, float] = {}
    notes: list[str] = []
    for uuid in sorted(gpus):
        procs = processes.get(uuid, ())
        mine = [b for p, b in procs if p in mine_pids]
        others = [b for p, b in procs if p not in mine_pids]
        if not others or not mine:
            shares[uuid] = 1.0
            continue
        if all(b is not None for b in mine + others) and sum(b or 0 for b in mine + others) > 0:
            share = sum(b or 0 for b in mine) / sum(b or 0 for b in mine + others)
            how = "by memory held"
        else:
            share = len(mine) / (len(mine) + len(others))
            how = "by process count (NVML reports no per-process memory)"
        shares[uuid] = share
        notes.append(f"{uuid} shared with {len(others)} other process(es): {share * 100:.0f} % charged, {how}")
    return shares, "; ".join(notes)


class EnergyMeter:
    """One server's energy per generated token, interval by interval (see the module docstring)."""

    def __init__(self) -> None:
        self._times: list[float] = []
        self._totals: list[float] = []
        self._base: dict[str, tuple[float, float]] | None = None
        self.last: EnergyPerToken | None = None

    def note_tokens(self, ts: float, total: float | None) -> None:
        """The server's generation-token counter at a poll (``None``: not read)."""
        if total is None:
            return
        if self._totals and total < self._totals[-1]:  # the counter went back: a new count from here
            self._times, self._totals = [], []
        self._times.append(ts)
        self._totals.append(total)
        cut = bisect.bisect_left(self._times, ts - _TOKEN_HISTORY_S)
        if cut:
            del self._times[:cut], self._totals[:cut]

    def _tokens_at(self, ts: float) -> float | None:
        i = bisect.bisect_left(self._times, ts)
        if i < len(self._times) and self._times[i] == ts:
            return self._totals[i]
        if i == 0 or i == len(self._times):
            return None  # outside what was read
        t0, t1, v0, v1 = self._times[i - 1], self._times[i], self._totals[i - 1], self._totals[i]
        return v0 + (v1 - v0) * (ts - t0) / (t1 - t0)

    def step(self, reads: Mapping[str, tuple[float, float]], shares: Mapping[str, float], shared: str = "") -> EnergyPerToken | None:
        """Take the newest energy read of each of the server's GPUs (uuid → (ts, joules)); returns
        the interval's figure when every GPU has a read newer than the previous interval's end and
        the token counter was read on both sides of it, else ``None`` (``last`` keeps the newest)."""
        if not reads:
            return None
        base = self._base
        if base is None or set(base) != set(reads):  # the first reads, or the server's GPUs changed
            self._base = dict(reads)
            return None
        if any(reads[u][0] <= base[u][0] for u in reads):
            return None  # not every GPU read again yet
        start, end = max(ts for ts, _ in base.values()), max(ts for ts, _ in reads.values())
        before, after = self._tokens_at(start), self._tokens_at(end)
        if after is None and self._times and end > self._times[-1]:
            return None  # the poll after the read is still to come
        self._base = dict(reads)
        reset = sorted(u for u in reads if reads[u][1] < base[u][1])
        if reset:
            return self._set(EnergyPerToken(None, None, None, start, end, f"energy counter reset on {', '.join(reset)}"))
        joules = sum(shares.get(u, 1.0) * (reads[u][1] - base[u][1]) for u in reads)
        if before is None or after is None:
            return self._set(EnergyPerToken(None, joules, None, start, end, "token counter not read over the interval"))
        tokens = after - before
        if tokens <= 0:
            return self._set(EnergyPerToken(None, joules, 0.0, start, end, "no tokens generated"))
        return self._set(EnergyPerToken(joules / tokens, joules, tokens, start, end, shared))

    def _set(self, e: EnergyPerToken) -> EnergyPerToken:
        self.last = e
        return e
