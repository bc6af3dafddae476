"""How an outcome reaches the user: one masked line on stderr, and what stdout has become
(a reader gone, a full disk) when a command ends."""

from __future__ import annotations

import errno
import os
import sys

import typer

from vgpumon.base.masking import mask_secrets


def _echo_err(line: str) -> None:
    typer.echo(mask_secrets(line), err=True)


def _one_line(text: str) -> str:
    from vgpumon.base.logs import one_line

    return one_line(text)


#: Errors writing the output (stdout on a full disk, a gone terminal): one line, exit 74.
_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EIO, errno.EPIPE, errno.EDQUOT})


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush at exit cannot fail
    again (a traceback after the one line)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _stdout_file() -> tuple[int, int] | None:
    """(device, inode) of what file descriptor 1 is now; ``None`` where it cannot be told."""
    try:
        st = os.fstat(1)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _reader_gone(stdout_was: tuple[int, int] | None) -> bool:
    """Rich met a closed pipe: it pointed stdout, which was something else, at /dev/null."""
    try:
        null = os.stat(os.devnull)
    except OSError:
        return False
    now = _stdout_file()
    return stdout_was is not None and now != stdout_was and now == (null.st_dev, null.st_ino)
