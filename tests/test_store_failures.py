"""Writes that fail for a reason other than "store unavailable", and spool writes that fail:
nothing is dropped without a word, and nothing half-written is left behind."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

# A spool write on a full disk, for real: the child process may write at most 4 KiB per file
# (RLIMIT_FSIZE; SIGXFSZ ignored, so write() fails with EFBIG like it fails with ENOSPC on a full
# disk), then appends a batch of 8 GPU rows × 20 ticks (about 40 kB of JSON) to a spool.
_FULL_DISK_CHILD = textwrap.dedent(
    """
    import resource, signal, sys
    from pathlib import Path
    from vgpumon.store.codec import GPU_ROW_COLUMNS
    from vgpumon.store.spool import RAW, Backlog

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    spool = Path(sys.argv[1])
    spool.mkdir()
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
    backlog = Backlog(spool)
    rows = [tuple(i * 1000 + j for j in range(len(GPU_ROW_COLUMNS))) for i in range(160)]
    print(backlog.append(RAW, rows), len(backlog), backlog.memory_rows)
    """
)


def test_a_failed_spool_write_leaves_no_tmp_file_behind(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    out = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_CHILD, str(spool)], capture_output=True, text=True, timeout=60, check=True
    )
    # the batch is kept in memory (the spool cannot take it) ...
    assert out.stdout.split() == ["memory", "1", "160"], out.stderr
    # ... and the half-written file is gone: a full disk is not made fuller by our leftovers
    assert sorted(p.name for p in spool.iterdir()) == []


def test_a_tmp_file_left_by_a_crash_is_removed_at_start(tmp_path: Path) -> None:
    from vgpumon.store.spool import Backlog

    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "0000000000000003.raw.tmp").write_text('{"v":1,"kind":"raw","col')  # power cut mid-write
    backlog = Backlog(spool)
    assert len(backlog) == 0
    assert list(spool.iterdir()) == []
