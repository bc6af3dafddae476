"""Files given on the command line are read as what they claim to be: a regular file of bounded
size. ``--config /dev/zero`` used to read until memory ran out, a FIFO hung the command; both
are now one line (exit 65, the caller's error class).

Files the agent creates are private whatever umask it was started under (``PRIVATE_FILE_MODE``,
``PRIVATE_DIR_MODE``; docs/security.md, "Files")."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

#: A settings file or a metric selection is a few kilobytes; this leaves room for comments.
SMALL_FILE_LIMIT = 1 << 20


class FileRefused(ValueError):
    """The path names something that is not a regular file, or one larger than allowed."""


def open_regular(path: Path | str) -> int:
    """A read-only descriptor of the regular file ``path`` (blocking, as files are): opened
    without blocking, so that a FIFO's open does not wait for a writer, and checked on the
    descriptor (no race with a rename).

    Raises:
        FileRefused: a device, FIFO, socket or directory (the descriptor is closed).
        OSError: it cannot be opened (missing, no permission).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a character device" if stat.S_ISCHR(st.st_mode)
                    else "a block device" if stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                    else "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file")
            raise FileRefused(f"{path} is {kind}, not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_small_file(path: Path | str, limit: int = SMALL_FILE_LIMIT) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    Opened without blocking (a FIFO's open would wait for a writer) and checked on the open
    descriptor (no race with a rename): a device, FIFO, socket or directory is refused, as is a
    file over ``limit`` bytes, before anything is read.

    Raises:
        FileRefused: not a regular file, or over the limit.
        OSError: it cannot be opened or read (missing, no permission).
    """
    fd = open_regular(path)
    try:
        st = os.fstat(fd)
        if st.st_size > limit:
            raise FileRefused(f"{path} is {st.st_size} bytes; at most {limit} are read")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # grew while read (a file written meanwhile)
            raise FileRefused(f"{path} is over {limit} bytes; at most {limit} are read")
        return b"".join(chunks)
    finally:
        os.close(fd)


#: What the agent writes (the SQLite store and its journals, the spool's batches, the
#: dead-letter file, the migration lock) holds GPU process command lines, host facts and rows
#: not yet stored: read and written by its owner, read by its group (an on-call group that runs
#: ``vgpumon diagnose --db``), nothing for others, whatever the umask it was started under.
PRIVATE_FILE_MODE = 0o640
#: The directories it creates for them: the same, with the group allowed in.
PRIVATE_DIR_MODE = 0o750


def make_private_dirs(path: Path) -> None:
    """``mkdir -p path``, each directory it creates ``PRIVATE_DIR_MODE`` or narrower (a umask can
    only take rights away from the mode asked for); existing ones are left as they are.

    Raises:
        OSError: a directory cannot be created.
    """
    missing = []
    at = path
    while not at.exists() and at.parent != at:
        missing.append(at)
        at = at.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:
            if not d.is_dir():
                raise
            # made meanwhile by another process


class UnsafePath(PermissionError):
    """A path the agent would write through is not the agent's own: a symbolic link, a file or a
    directory another user owns or may write in, a FIFO or a device where a file belongs.
    An ``OSError``, so that every caller that copes with an unwritable path copes with it."""


def _trusted(uid: int) -> bool:
    return uid in (0, os.geteuid())


def _kind(mode: int) -> str:
    return ("a symbolic link" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a directory" if stat.S_ISDIR(mode) else "not a regular file")


def check_private_dir(path: Path, *, itself: bool = True) -> None:
    """Refuse a directory the agent writes into (``itself``), or the directories above a file it
    writes (``itself=False``), when another user could put something of theirs in the way: every
    directory on the path, and every symbolic link met, must belong to root or to this user; one
    that others may write in must be sticky (``/tmp``: others cannot rename what is not theirs),
    and the directory itself may not be writable by others at all (they could plant batches).

    Run as root, the agent once followed a link another user had left where its spool or
    dead-letter file was to be (``/tmp/x.dead-letter.jsonl -> /etc/shadow``) and wrote there.

    Raises:
        UnsafePath: it names which part and why.
        OSError: a part of it cannot be looked at (missing parents are fine: they are made).
    """
    path = Path(os.path.abspath(path))
    chains = [path]
    real = Path(os.path.realpath(path))
    if real != path:
        chains.append(real)
    for chain in chains:
        for i, at in enumerate([chain, *chain.parents]):
            try:
                st = os.lstat(at)
            except FileNotFoundError:
                continue  # made by make_private_dirs, with this user as its owner
            if not _trusted(st.st_uid):
                raise UnsafePath(f"{at} belongs to uid {st.st_uid}, not to this user or root")
            if stat.S_ISLNK(st.st_mode):
                continue  # its target is on the resolved chain
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafePath(f"{at} is {_kind(st.st_mode)}, not a directory")
            others_write = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            if others_write and i == 0 and itself:
                raise UnsafePath(f"{at} may be written by other users (mode {stat.S_IMODE(st.st_mode):04o})")
            if others_write and not st.st_mode & stat.S_ISVTX:
                raise UnsafePath(f"{at} may be written by other users and is not sticky (mode {stat.S_IMODE(st.st_mode):04o})")


def open_private(path: Path | str, mode: str = "w") -> int:
    """A file descriptor of ``path`` opened for writing (``"w"``: truncated, ``"a"``: appended,
    ``"x"``: created, failing if it exists); created ``PRIVATE_FILE_MODE`` when it does not
    exist (the umask can only narrow it). An existing file keeps its mode: an operator's
    choice. Wrap it with ``os.fdopen``.

    What is there already must be a regular file of this user's (or root's) with no other
    name: a symbolic link is not followed, a FIFO does not block the open, another user's file
    is not written (they would read what the agent puts in it), and each is refused before a
    byte is written or truncated.

    Raises:
        UnsafePath: a symbolic link, not a regular file, another user's, or hard-linked.
        OSError: it cannot be opened or created.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    flags |= {"w": 0, "a": os.O_APPEND, "x": os.O_EXCL}[mode]
    try:
        fd = os.open(path, flags, PRIVATE_FILE_MODE)
    except OSError as exc:
        # a symbolic link: ELOOP (O_NOFOLLOW), EACCES in a sticky directory; ENXIO: a FIFO nobody
        # reads (O_NONBLOCK)
        if exc.errno not in (errno.ELOOP, errno.EACCES, errno.ENXIO):
            raise
        try:
            st = os.lstat(path)
        except OSError:
            raise exc from None
        if stat.S_ISREG(st.st_mode):
            raise
        raise UnsafePath(f"{path} is {_kind(st.st_mode)}, not a regular file; not written") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{path} is {_kind(st.st_mode)}, not a regular file; not written")
        if not _trusted(st.st_uid):
            raise UnsafePath(f"{path} belongs to uid {st.st_uid}, not to this user or root; not written")
        if st.st_nlink > 1:
            raise UnsafePath(f"{path} has {st.st_nlink} names (a hard link); not written")
        os.set_blocking(fd, True)
        if mode == "w":
            os.ftruncate(fd, 0)  # only now: a file refused above is left as it was
    except BaseException:
        os.close(fd)
        raise
    return fd
