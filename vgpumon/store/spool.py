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
* **Bounds.** ``max_spool_bytes``, ``max_memory_rows`` and ``max_memory_vllm_rows``. When one is
  exceeded, the oldest raw ticks of that tier are folded into 1-minute rollup rows
  (``vgpumon.store.rollup``) instead of being dropped: the minute keeps min/mean/max/percentiles
  and ``folded_samples`` counts the ticks whose full resolution was lost. Rollup rows are 1/60 of
  the raw ones; they are not bounded. vLLM samples fold too: per server and minute the last
  sample and every change of state are kept (``vllm_repository.fold_rows``).
* **Dead letters.** A row the store refuses for a reason other than being unavailable (a value
  its column cannot hold, a foreign key that no longer exists) is isolated by the agent and
  appended to ``<spool>.dead-letter.jsonl`` beside the spool directory, one JSON line per row with
  the error, and counted (``dead_letters``). Nothing is dropped without a word.

Not thread-safe: the agent uses it from its store thread only.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, cast

from vgpumon.base.files import check_private_dir, make_private_dirs, open_private
from vgpumon.store.codec import GPU_ROW_COLUMNS, ROLLUP_ROW_COLUMNS, TS, reorder
from vgpumon.store.rollup import rollup_rows, split_whole_minutes
from vgpumon.store.vllm_repository import fold_rows as fold_vllm_rows

if TYPE_CHECKING:
    from vgpumon.store.codec import GpuRow, RollupRow
    from vgpumon.store.tables import TickRows
    from vgpumon.store.vllm_schema import VllmRow

log = logging.getLogger(__name__)

RAW = "raw"
ROLLUP = "rollup"
#: A tick's other rows (host samples, XID events, GPU processes) as dicts per table; kept in order
#: with the GPU rows, never folded (they are a few rows a tick).
EXTRA = "extra"
#: vLLM samples, one JSON-able dict each (``vllm_repository.encode_sample``).
VLLM = "vllm"
#: Kinds whose rows are dicts stored as they are (no column list).
_DICT_KINDS = (EXTRA, VLLM)
SPOOL_FORMAT = 1

#: One row of a batch, as its kind says: a ``GpuRow`` (raw), a ``RollupRow`` (rollup), a tick's
#: ``TickRows`` (extra) or an encoded vLLM sample (vllm).
BacklogRow: TypeAlias = "GpuRow | RollupRow | TickRows | VllmRow"
#: Batches as a fold returns them: (kind, rows), oldest first.
Batches: TypeAlias = "list[tuple[str, list[BacklogRow]]]"


@dataclass
class Entry:
    """One batch in the backlog: ``kind`` is ``"raw"`` (``gpu_samples`` rows), ``"rollup"``
    (``gpu_samples_1m`` rows), ``"extra"`` (per tick, table → dict rows of the tick's other
    tables) or ``"vllm"`` (encoded vLLM samples); ``path`` is its spool file, ``None`` in
    memory."""

    kind: str
    rows: list[BacklogRow]
    path: Path | None = None
    size: int = 0


class Backlog:
    """Ordered backlog of batches not yet stored.

    Args:
        spool_dir: spool directory (created when missing); ``None`` keeps the backlog in memory
            only.
        max_spool_bytes: spool size above which its oldest raw ticks are folded into rollups.
        max_memory_rows: raw rows kept in memory above which the oldest are folded.
        max_memory_vllm_rows: vLLM samples kept in memory above which the oldest are folded
            (default: 2 servers polled every 2 s for an hour; a sample takes about 4 kB here).
    """

    def __init__(
        self,
        spool_dir: Path | None,
        *,
        max_spool_bytes: int = 1 << 30,
        max_memory_rows: int = 8 * 3600,
        max_memory_vllm_rows: int = 3600,
    ) -> None:
        self.spool_dir = spool_dir
        self.max_spool_bytes = max_spool_bytes
        self.max_memory_rows = max_memory_rows
        self.max_memory_vllm_rows = max_memory_vllm_rows
        self._spool: deque[Entry] = deque()
        self._memory: deque[Entry] = deque()
        self._seq = 0
        self.spool_bytes = 0
        #: raw ticks (GPU rows) folded into rollups: resolution lost, never stored raw.
        self.folded_rows = 0
        #: vLLM samples folded away (their server's state changes and last sample per minute kept).
        self.folded_vllm_rows = 0
        #: rows the store refused for a reason other than being unavailable (see ``dead_letter``).
        self.dead_letters = 0
        self.spool_failed = False
        if spool_dir is not None:
            self._load()

    # -- state ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._spool) + len(self._memory)

    @property
    def spooled_rows(self) -> int:
        """Rows (raw, rollup and vLLM) waiting on disk."""
        return sum(len(e.rows) for e in self._spool if e.kind != EXTRA)

    @property
    def memory_rows(self) -> int:
        """Rows (raw, rollup and vLLM) waiting in memory; lost if the process ends."""
        return sum(len(e.rows) for e in self._memory if e.kind != EXTRA)

    @property
    def dead_letter_path(self) -> Path | None:
        """``<spool>.dead-letter.jsonl`` beside the spool directory; ``None`` without a spool."""
        if self.spool_dir is None:
            return None
        return self.spool_dir.with_name(self.spool_dir.name + ".dead-letter.jsonl")

    def unwritable(self) -> str | None:
        """Why the spool could not take a batch now, or ``None`` (it could, or there is no
        spool): the directory, or where it is yet to be made the nearest folder above it, is
        not a folder this process may write in (permissions, a read-only file system, a file in
        the way). Asked at start, so that an operator hears of it before an outage rather than
        during one; nothing is created or written."""
        if self.spool_dir is None:
            return None
        if self.spool_failed:
            return "it could not be read at start"
        at = self.spool_dir
        while not at.exists() and at.parent != at:
            at = at.parent  # made on first use: the nearest folder that exists must take it
        if not at.is_dir():
            return f"{at} is not a directory"
        if not os.access(at, os.W_OK | os.X_OK):
            return f"{at} is not writable by this process"
        return None

    # -- spool files -----------------------------------------------------------------------------

    def _load(self) -> None:
        assert self.spool_dir is not None
        try:
            if not self.spool_dir.exists():
                return  # created on first use: an agent whose store never fails leaves no directory
            check_private_dir(self.spool_dir)  # batches another user could plant or redirect: none read
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
                if kind in _DICT_KINDS:
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

    def _write_file(self, kind: str, rows: list[BacklogRow], name: str) -> Entry:
        assert self.spool_dir is not None
        columns = _columns(kind)
        data = json.dumps({"v": SPOOL_FORMAT, "kind": kind, "columns": columns, "rows": rows}, separators=(",", ":"))
        path = self.spool_dir / name
        tmp = path.with_suffix(".tmp")
        try:
            with os.fdopen(open_private(tmp, "w"), "w") as f:
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

    def _spool_append(self, kind: str, rows: list[BacklogRow]) -> bool:
        if self.spool_dir is None or self.spool_failed:
            return False
        try:
            make_private_dirs(self.spool_dir)
            check_private_dir(self.spool_dir)
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

    def append(self, kind: str, rows: list[BacklogRow]) -> str:
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

    def shrink_head(self, entry: Entry, rows: list[BacklogRow]) -> None:
        """Part of the oldest batch is stored (or dead-lettered): keep only ``rows`` of it, so
        that a replay neither writes nor dead-letters those rows a second time."""
        if len(rows) == len(entry.rows):
            return
        if entry.path is not None:
            try:
                new = self._write_file(entry.kind, rows, entry.path.name)
            except OSError as exc:  # replayed whole: stored rows are skipped by the write
                log.warning("spool file %s not rewritten: %s", entry.path, exc)
                return
            self.spool_bytes += new.size - entry.size
            entry.size = new.size
        entry.rows = list(rows)

    def dead_letter(self, kind: str, row: object, error: BaseException) -> None:
        """Set aside one row the store refused for a reason other than being unavailable.

        The row is appended, as one JSON line with its kind, columns, the error and the time, to
        ``dead_letter_path`` (created when missing) and counted in ``dead_letters``. Without a
        spool, or when that file cannot be written, the row is logged whole instead. ``row`` is
        any row of any kind (a dict row of a tick's tables too): only written out, as JSON.
        """
        self.dead_letters += 1
        doc = {
            "at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "kind": kind,
            "error": f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"[:500],
            "columns": _columns(kind),
            "row": row,
        }
        line = json.dumps(doc, separators=(",", ":"), default=repr)
        path = self.dead_letter_path
        if path is not None:
            try:
                make_private_dirs(path.parent)
                check_private_dir(path.parent, itself=False)
                with os.fdopen(open_private(path, "a"), "a") as f:
                    f.write(line + "\n")
                    f.flush()
                    os.fsync(f.fileno())
                log.error("a %s row the store refuses (%s) was set aside in %s", kind, doc["error"], path)
                return
            except OSError as exc:
                log.error("dead-letter file %s cannot be written (%s)", path, exc)
        log.error("a %s row the store refuses (%s) is dropped: %s", kind, doc["error"], line)

    # -- bounds: fold oldest raw ticks into 1-minute rollups ---------------------------------------

    @staticmethod
    def _fold(kind: str, entries: list[Entry]) -> tuple[Batches, int]:
        """Fold the rows of ``entries`` (all of ``kind``), their newest minute excepted: the next
        ticks may belong to it, and a minute folded twice keeps only its first summary. Returns
        the batches that replace them, oldest first, and how many rows lost their full
        resolution (0: nothing to fold yet)."""
        rows = [r for e in entries for r in e.rows]
        if kind == VLLM:
            kept, count = fold_vllm_rows(cast("list[VllmRow]", rows), keep_last_minute=True)
            return [(VLLM, cast("list[BacklogRow]", kept))], count
        # only raw and vLLM batches are folded (``_bound_memory``, ``_bound_spool``)
        raw = sorted(cast("list[GpuRow]", rows), key=lambda r: r[TS])
        whole, rest = split_whole_minutes(raw, keep_last_minute=True)
        # (each list holds one kind of row: as a list of any kind it is only read)
        out: Batches = [(ROLLUP, cast("list[BacklogRow]", rollup_rows(whole, folded=True)))]
        if rest:
            out.append((RAW, cast("list[BacklogRow]", rest)))
        return out, len(whole)

    def _bound_memory(self) -> None:
        for kind, bound in ((RAW, self.max_memory_rows), (VLLM, self.max_memory_vllm_rows)):
            if sum(len(e.rows) for e in self._memory if e.kind == kind) > bound:
                self._fold_memory(kind, bound)

    def _fold_memory(self, kind: str, bound: int) -> None:
        # fold the oldest batches of this kind worth a quarter of the bound, in whole minutes;
        # other batches keep their place ahead of what is folded
        entries = list(self._memory)
        picked = self._pick([(i, e) for i, e in enumerate(entries) if e.kind == kind], max(bound // 4, 1), lambda e: len(e.rows))
        if picked is None:
            return  # everything is one unfinished minute: nothing to fold yet
        taken, folded, count = picked
        last = taken[-1][0]
        skip = {i for i, _ in taken}
        head = [e for i, e in enumerate(entries[: last + 1]) if i not in skip]
        self._memory = deque(head + [Entry(k, rows) for k, rows in folded if rows] + entries[last + 1 :])
        self._count_folded(kind, count)
        log.warning("in-memory buffer full (%d %s rows): folded %d of them (1-minute resolution kept)", bound, kind, count)

    def _pick(
        self, candidates: list[tuple[int, Entry]], target: int, measure: Callable[[Entry], int]
    ) -> tuple[list[tuple[int, Entry]], Batches, int] | None:
        """The oldest ``candidates`` (position, batch) worth ``target`` (by ``measure``) that fold
        at least one row, with their fold; more are taken while the fold is empty (all in the
        newest, unfinished minute), doubling the amount each try. ``None``: nothing folds."""
        n, goal = 0, target
        for k, (_, e) in enumerate(candidates):
            n += measure(e)
            if n < goal and k + 1 < len(candidates):
                continue
            taken = candidates[: k + 1]
            folded, count = self._fold(e.kind, [x for _, x in taken])
            if count:
                return taken, folded, count
            goal = 2 * n
        return None

    def _count_folded(self, kind: str, count: int) -> None:
        if kind == VLLM:
            self.folded_vllm_rows += count
        else:
            self.folded_rows += count

    def _bound_spool(self) -> None:
        if self.spool_bytes <= self.max_spool_bytes:
            return
        for kind in (RAW, VLLM):  # GPU ticks first: they are most of the spool
            if self._fold_spool(kind, self.max_spool_bytes // 4):
                return

    def _fold_spool(self, kind: str, target: int) -> bool:
        run: list[tuple[int, Entry]] = []  # the oldest contiguous batches of this kind
        for i, e in enumerate(self._spool):
            if e.kind == kind:
                run.append((i, e))
            elif run:
                break
        if not run:
            return False
        picked = self._pick(run, target, lambda e: e.size)
        if picked is None:
            return False
        taken_pairs, folded, count = picked
        taken = [e for _, e in taken_pairs]
        first = taken_pairs[0][0]
        # Names sort in backlog order: a folded file takes the name of the first file it replaces
        # plus "a", the held-back rest the name of the last plus "b"; both sort after everything
        # before and before everything after, however often folds nest.
        assert taken[0].path is not None and taken[-1].path is not None
        names = (taken[0].path.name.split(".")[0] + "a", taken[-1].path.name.split(".")[0] + "b")
        try:
            new = [self._write_file(k, rows, f"{name}.{k}.json") for (k, rows), name in zip(folded, names) if rows]
        except OSError as exc:
            log.error("spool %s cannot be folded (%s)", self.spool_dir, exc)
            return False
        for e in taken:
            self._spool.remove(e)
            self.spool_bytes -= e.size
            if e.path is not None:
                e.path.unlink(missing_ok=True)
        for i, e in enumerate(new):
            self._spool.insert(first + i, e)
            self.spool_bytes += e.size
        self._count_folded(kind, count)
        log.warning("spool over %d bytes: folded %d %s rows (1-minute resolution kept)", self.max_spool_bytes, count, kind)
        return True


def _columns(kind: str) -> tuple[str, ...] | None:
    """Column names of a batch's rows; ``None`` for kinds whose rows are dicts."""
    if kind in _DICT_KINDS:
        return None
    return GPU_ROW_COLUMNS if kind == RAW else ROLLUP_ROW_COLUMNS
