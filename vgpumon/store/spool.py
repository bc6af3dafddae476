"""Where ticks wait while the store is unreachable: a spool on local disk, then a bounded buffer
in memory, in one ordered backlog.

* **Spool.** One file per batch in its own directory, written to a temporary name, fsynced and
  renamed, so a crash leaves whole batches only; files are named by a sequence number and replayed
  in that order; a file is deleted only after its rows are committed. It survives an agent
  restart, and a file replayed twice (crash between commit and delete) is harmless because writes
  skip rows already stored. Files record their column names, so a newer agent replays an older
  agent's spool.
* **Memory.** When the spool cannot be written (disk full, read-only, no permission), batches are
  kept in memory; from then on new batches also go to memory until it has drained, so that the
  backlog stays in time order (spool first, then memory).
* **Bounds.** ``max_spool_bytes`` and ``max_memory_rows``. When one is exceeded, the oldest raw
  ticks of that tier are folded into 1-minute rollup rows (``vgpumon.store.rollup``) instead of
  being dropped: the minute keeps min/mean/max/percentiles and ``folded_samples`` counts the ticks
  whose full resolution was lost. Rollup rows are 1/60 of the raw ones; they are not bounded.

Not thread-safe: the agent uses it from its store thread only.
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vgpumon.store.codec import GPU_ROW_COLUMNS, ROLLUP_ROW_COLUMNS, TS, reorder
from vgpumon.store.rollup import rollup_rows, split_whole_minutes

log = logging.getLogger(__name__)

RAW = "raw"
ROLLUP = "rollup"
#: A tick's other rows (host samples, XID events, GPU processes) as dicts per table; kept in order
#: with the GPU rows, never folded (they are a few rows a tick).
EXTRA = "extra"
SPOOL_FORMAT = 1


@dataclass
class Entry:
    """One batch in the backlog: ``kind`` is ``"raw"`` (``gpu_samples`` rows), ``"rollup"``
    (``gpu_samples_1m`` rows) or ``"extra"`` (per tick, table → dict rows of the tick's other
    tables); ``path`` is its spool file, ``None`` in memory."""

    kind: str
    rows: list[Any]
    path: Path | None = None
    size: int = 0


class Backlog:
    """Ordered backlog of batches not yet stored.

    Args:
        spool_dir: spool directory (created when missing); ``None`` keeps the backlog in memory
            only.
        max_spool_bytes: spool size above which its oldest raw ticks are folded into rollups.
        max_memory_rows: raw rows kept in memory above which the oldest are folded.
    """

    def __init__(self, spool_dir: Path | None, *, max_spool_bytes: int = 1 << 30, max_memory_rows: int = 8 * 3600) -> None:
        self.spool_dir = spool_dir
        self.max_spool_bytes = max_spool_bytes
        self.max_memory_rows = max_memory_rows
        self._spool: deque[Entry] = deque()
        self._memory: deque[Entry] = deque()
        self._seq = 0
        self.spool_bytes = 0
        #: raw ticks (GPU rows) folded into rollups: resolution lost, never stored raw.
        self.folded_rows = 0
        self.spool_failed = False
        if spool_dir is not None:
            self._load()

    # -- state ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._spool) + len(self._memory)

    @property
    def spooled_rows(self) -> int:
        """Rows (raw and rollup) waiting on disk."""
        return sum(len(e.rows) for e in self._spool if e.kind != EXTRA)

    @property
    def memory_rows(self) -> int:
        """Rows (raw and rollup) waiting in memory; lost if the process ends."""
        return sum(len(e.rows) for e in self._memory if e.kind != EXTRA)

    # -- spool files -----------------------------------------------------------------------------

    def _load(self) -> None:
        assert self.spool_dir is not None
        if not self.spool_dir.exists():
            return  # created on first use: an agent whose store never fails leaves no directory
        try:
            names = sorted(p for p in self.spool_dir.iterdir() if p.suffix == ".json")
            for stale in self.spool_dir.glob("*.tmp"):  # a write cut short by a crash: never a batch
                stale.unlink(missing_ok=True)
        except OSError as exc:
            log.error("spool %s unusable (%s): the backlog stays in memory", self.spool_dir, exc)
            self.spool_failed = True
            return
        for path in names:
            try:
                doc = json.loads(path.read_text())
                kind = doc["kind"]
                if kind == EXTRA:
                    rows = doc["rows"]
                else:
                    target = GPU_ROW_COLUMNS if kind == RAW else ROLLUP_ROW_COLUMNS
                    rows = reorder(doc["rows"], doc["columns"], target)
            except (OSError, ValueError, KeyError) as exc:
                log.error("spool file %s unreadable (%s): moved aside", path, exc)
                path.rename(path.with_suffix(".bad"))
                continue
            size = path.stat().st_size
            self._spool.append(Entry(kind, rows, path, size))
            self.spool_bytes += size
            self._seq = max(self._seq, int(path.name[:16]) + 1)

    def _write_file(self, kind: str, rows: list[Any], name: str) -> Entry:
        assert self.spool_dir is not None
        columns = None if kind == EXTRA else GPU_ROW_COLUMNS if kind == RAW else ROLLUP_ROW_COLUMNS
        data = json.dumps({"v": SPOOL_FORMAT, "kind": kind, "columns": columns, "rows": rows}, separators=(",", ":"))
        path = self.spool_dir / name
        tmp = path.with_suffix(".tmp")
        try:
            with open(tmp, "w") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())  # a spooled batch must survive a power loss as well as a crash
            os.replace(tmp, path)
        except BaseException:
            # a full disk fails the write or the fsync half-way: the partial file is no batch, and
            # leaving it would hold the very space the next attempt needs
            tmp.unlink(missing_ok=True)
            raise
        return Entry(kind, rows, path, len(data))

    def _spool_append(self, kind: str, rows: list[tuple[Any, ...]]) -> bool:
        if self.spool_dir is None or self.spool_failed:
            return False
        try:
            self.spool_dir.mkdir(parents=True, exist_ok=True)
            entry = self._write_file(kind, rows, f"{self._seq:016d}.{kind}.json")
        except OSError as exc:
            log.error("spool %s cannot be written (%s): holding ticks in memory (bounded)", self.spool_dir, exc)
            self.spool_failed = True
            return False
        self._seq += 1
        self._spool.append(entry)
        self.spool_bytes += entry.size
        return True

    # -- public ------------------------------------------------------------------------------

    def append(self, kind: str, rows: list[tuple[Any, ...]]) -> str:
        """Add a batch at the new end. Returns where it went: ``"spool"`` or ``"memory"``."""
        if not rows:
            return "memory"
        if not self._memory and self._spool_append(kind, rows):
            self._bound_spool()
            return "spool"
        self._memory.append(Entry(kind, list(rows)))
        self._bound_memory()
        return "memory"

    def peek(self) -> Entry | None:
        """The oldest batch, or ``None`` when the backlog is empty."""
        if self._spool:
            return self._spool[0]
        if self._memory:
            return self._memory[0]
        return None

    def ack(self, entry: Entry) -> None:
        """The oldest batch is stored: forget it (delete its spool file)."""
        if self._spool and self._spool[0] is entry:
            self._spool.popleft()
            self.spool_bytes -= entry.size
            if entry.path is not None:
                try:
                    entry.path.unlink()
                except OSError as exc:  # replayed again next start: harmless, writes skip duplicates
                    log.warning("spool file %s not removed: %s", entry.path, exc)
            if not self._spool and self.spool_failed:
                self.spool_failed = False  # the disk may be back: try it again for new batches
        elif self._memory and self._memory[0] is entry:
            self._memory.popleft()
        else:
            raise ValueError("ack of a batch that is not the oldest")

    # -- bounds: fold oldest raw ticks into 1-minute rollups ---------------------------------------

    @staticmethod
    def _fold(entries: list[Entry], more_follow: bool) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], int]:
        raw = sorted((r for e in entries for r in e.rows), key=lambda r: r[TS])
        whole, rest = split_whole_minutes(raw, keep_last_minute=more_follow)
        return rollup_rows(whole, folded=True), rest, len(whole)

    def _bound_memory(self) -> None:
        raw_rows = sum(len(e.rows) for e in self._memory if e.kind == RAW)
        if raw_rows <= self.max_memory_rows:
            return
        # fold the oldest raw batches worth a quarter of the bound, in whole minutes
        target = max(self.max_memory_rows // 4, 1)
        taken: list[Entry] = []
        n = 0
        rollups: list[Entry] = []
        while self._memory and n < target:
            e = self._memory.popleft()
            if e.kind != RAW:  # rollups and extra rows keep their place ahead of what is folded
                rollups.append(e)
                continue
            taken.append(e)
            n += len(e.rows)
        more = any(e.kind == RAW for e in self._memory)
        folded, rest, count = self._fold(taken, more)
        if count == 0:  # everything taken is one unfinished minute: keep it, nothing to fold yet
            self._memory.extendleft(reversed(rollups + taken))
            return
        head = rollups + [Entry(ROLLUP, folded)]
        if rest:
            head.append(Entry(RAW, rest))
        self._memory.extendleft(reversed(head))
        self.folded_rows += count
        log.warning("in-memory buffer full (%d rows): folded %d raw ticks into 1-minute rollups", self.max_memory_rows, count)

    def _bound_spool(self) -> None:
        if self.spool_bytes <= self.max_spool_bytes:
            return
        target = self.max_spool_bytes // 4
        taken: list[Entry] = []
        size = 0
        for e in list(self._spool):
            if e.kind != RAW:
                if taken:
                    break  # fold only contiguous raw batches, keeping order
                continue
            taken.append(e)
            size += e.size
            if size >= target:
                break
        if not taken:
            return
        last = self._spool.index(taken[-1])
        more = any(e.kind == RAW for e in list(self._spool)[last + 1 :])
        folded, rest, count = self._fold(taken, more)
        if count == 0:
            return
        first = self._spool.index(taken[0])
        # Names sort in backlog order: a folded file takes the name of the first file it replaces
        # plus "a", the held-back rest the name of the last plus "b"; both sort after everything
        # before and before everything after, however often folds nest.
        assert taken[0].path is not None and taken[-1].path is not None
        first_name = taken[0].path.name.split(".")[0]
        last_name = taken[-1].path.name.split(".")[0]
        try:
            new = [self._write_file(ROLLUP, folded, f"{first_name}a.{ROLLUP}.json")]
            if rest:
                new.append(self._write_file(RAW, rest, f"{last_name}b.{RAW}.json"))
        except OSError as exc:
            log.error("spool %s cannot be folded (%s)", self.spool_dir, exc)
            return
        for e in taken:
            self._spool.remove(e)
            self.spool_bytes -= e.size
            if e.path is not None:
                e.path.unlink(missing_ok=True)
        for i, e in enumerate(new):
            self._spool.insert(first + i, e)
            self.spool_bytes += e.size
        self.folded_rows += count
        log.warning("spool over %d bytes: folded %d raw ticks into 1-minute rollups", self.max_spool_bytes, count)
