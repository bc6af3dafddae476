"""Another local user cannot make the agent (root, on every GPU host) write through their links
or into their files. Tried as that user would: the dead-letter file, a spool batch's temporary
name, the spool directory and the SQLite store pre-made as a symbolic link to a file of root's,
or as a directory or file of theirs. Before: root appended its refused rows to the link's target
(``/tmp/x.dead-letter.jsonl -> /etc/...``), truncated and overwrote the target of a planted
``<seq>.raw.tmp``, and wrote batches into a spool directory the other user owned. Now each is
refused with one line naming the path, the rows stay in memory or in the log, and the target is
untouched (docs/security.md, "Files" and "Attacker trial")."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from vgpumon.base.errors import StoreUnavailableError
from vgpumon.base.files import UnsafePath, open_private
from vgpumon.store import open_store
from vgpumon.store.codec import GPU_ROW_COLUMNS
from vgpumon.store.spool import RAW, Backlog

ROWS = [tuple(i * 1000 + j for j in range(len(GPU_ROW_COLUMNS))) for i in range(2)]
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="another user's files need root to make")


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.write_text("root's own\n")
    victim.chmod(0o600)
    return victim


def test_a_planted_link_at_the_dead_letter_path_is_not_followed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    victim = _victim(tmp_path)
    (tmp_path / "spool.dead-letter.jsonl").symlink_to(victim)
    backlog = Backlog(tmp_path / "spool")
    with caplog.at_level(logging.ERROR):
        backlog.dead_letter(RAW, ROWS[0], ValueError("refused"))
    assert victim.read_text() == "root's own\n"
    assert backlog.dead_letters == 1
    assert "is a symbolic link, not a regular file; not written" in caplog.text
    assert "is dropped" in caplog.text  # the row is in the log instead, not lost without a word


def test_a_planted_link_at_a_batch_s_temporary_name_is_not_truncated(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o750)
    backlog = Backlog(spool)
    (spool / "0000000000000000.raw.tmp").symlink_to(victim)  # after the start: its stale-file sweep is past
    assert backlog.append(RAW, ROWS) == "memory"
    assert victim.read_text() == "root's own\n"
    assert backlog.memory_rows == len(ROWS)


def test_open_private_refuses_a_fifo_and_a_device_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/null")):
        with pytest.raises(UnsafePath, match="not a regular file"):
            os.close(open_private(path, "a"))


def test_a_world_writable_spool_directory_is_not_used(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    spool.chmod(0o777)
    backlog = Backlog(spool)
    assert backlog.append(RAW, ROWS) == "memory"
    assert list(spool.iterdir()) == []


@as_root
def test_another_user_s_spool_directory_is_neither_read_nor_written(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o755)
    os.chown(spool, NOBODY, NOBODY)
    backlog = Backlog(spool)
    assert backlog.spool_failed  # refused at start, before any batch of theirs is read
    assert backlog.append(RAW, ROWS) == "memory"
    assert list(spool.iterdir()) == []


@as_root
def test_another_user_s_file_at_the_dead_letter_path_is_not_written(tmp_path: Path) -> None:
    theirs = tmp_path / "spool.dead-letter.jsonl"
    theirs.write_text("")
    os.chown(theirs, NOBODY, NOBODY)
    Backlog(tmp_path / "spool").dead_letter(RAW, ROWS[0], ValueError("refused"))
    assert theirs.read_text() == ""  # they would read every row set aside


@as_root
def test_a_store_path_that_is_another_user_s_link_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "made-by-root.db"  # where the link points: a file root would create
    link = tmp_path / "vgpumon.db"
    link.symlink_to(target)
    os.lchown(link, NOBODY, NOBODY)
    with pytest.raises(StoreUnavailableError, match="vgpumon.db is a symbolic link of uid 65534"):
        open_store(f"sqlite:///{link}")
    assert not target.exists()
