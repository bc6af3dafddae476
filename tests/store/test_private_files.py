"""What the agent writes is private whatever umask it was started under: the store (with its
write-ahead log and shared-memory file), the migration lock, the spool and its batches, the
dead-letter file. Under ``umask 000`` they used to be 0644 (the store, the dead-letter file) and
0666 (the lock): any local user could read GPU processes' command lines and the rows the store
refused. Decision and modes: docs/security.md, "Files"."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

# The agent's own writers, in a process started under umask 000: the store is opened (created,
# migrated under its lock) and kept open while the modes are read (its -wal and -shm exist then),
# a batch goes to the spool, a refused row to the dead-letter file.
_CHILD = textwrap.dedent(
    """
    import json, os, stat, sys
    from pathlib import Path
    os.umask(0)
    from vgpumon.store import open_store
    from vgpumon.store.codec import GPU_ROW_COLUMNS
    from vgpumon.store.spool import RAW, Backlog

    root = Path(sys.argv[1])
    store = open_store(f"sqlite:///{root}/lib/vgpumon/vgpumon.db")
    with store.engine.connect() as conn:
        conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS probe (x)")
        conn.exec_driver_sql("INSERT INTO probe VALUES (1)")
        conn.commit()
        backlog = Backlog(root / "spool" / "batches")
        rows = [tuple(i * 1000 + j for j in range(len(GPU_ROW_COLUMNS))) for i in range(3)]
        where = backlog.append(RAW, rows)
        backlog.dead_letter(RAW, rows[0], ValueError("refused"))
        modes = {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in sorted(root.rglob("*"))}
    print(json.dumps({"where": where, "modes": modes}))
    """
)


def test_files_and_directories_the_agent_creates_are_private_under_umask_000(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    modes = doc["modes"]
    assert doc["where"] == "spool"
    made = {
        "lib", "lib/vgpumon", "lib/vgpumon/vgpumon.db", "lib/vgpumon/vgpumon.db-wal", "lib/vgpumon/vgpumon.db-shm",
        "lib/vgpumon/vgpumon.db.migrate.lock", "spool", "spool/batches", "spool/batches.dead-letter.jsonl",
    }
    assert made <= set(modes), sorted(modes)
    batches = [k for k in modes if k.startswith("spool/batches/")]
    assert len(batches) == 1 and batches[0].endswith(".raw.json"), batches
    shown = {k: oct(m) for k, m in modes.items()}
    for name, mode in modes.items():
        assert mode & stat.S_IRWXO == 0, f"{name} is {oct(mode)}: others may read or write it ({shown})"
        assert mode & stat.S_IWGRP == 0, f"{name} is {oct(mode)}: its group may write it ({shown})"
    assert all(modes[k] == 0o750 for k in ("lib", "lib/vgpumon", "spool", "spool/batches")), shown
    assert all(modes[k] == 0o640 for k in made | set(batches) if not (tmp_path / k).is_dir()), shown


def test_an_existing_store_keeps_the_mode_its_operator_gave_it(tmp_path: Path) -> None:
    """The modes are for what the agent creates: a store an operator made 0600 (or 0660 for a
    group that writes it too) is opened as it is, not widened or narrowed."""
    from vgpumon.store import open_store

    db = tmp_path / "store.db"
    db.touch()
    db.chmod(0o600)
    open_store(f"sqlite:///{db}").engine.dispose()
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
