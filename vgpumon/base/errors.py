"""Domain errors and the exit-code table shared by every command.

The table follows the monitoring-plugin convention that on-call tooling already reads
(0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN) and ``sysexits.h`` for everything else, so that a
usage error (64) is never mistaken for CRITICAL (2). Each code means one thing in every command;
README.md and docs/cli.md hold the table.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Process exit codes of every ``vgpumon`` command (documented in README.md)."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3  # diagnose only: no data, host unknown, store unreachable
    USAGE = 64  # EX_USAGE: a bad option, argument, environment variable
    DATAERR = 65  # EX_DATAERR: an input file (capture, config file) is missing or malformed
    UNAVAILABLE = 69  # EX_UNAVAILABLE: no NVIDIA driver / library, or the store cannot be used
    SOFTWARE = 70  # EX_SOFTWARE: unexpected internal error
    IOERR = 74  # EX_IOERR: the output could not be written (disk full, a closed terminal)
    TEMPFAIL = 75  # EX_TEMPFAIL: the store is unreachable or not answering now; try again later
    INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C (every command but the agent, which stops cleanly: 0)


class VgpumonError(Exception):
    """Base of errors that the CLI turns into one clear line and an exit code."""

    exit_code: ExitCode = ExitCode.SOFTWARE


class UsageError(VgpumonError):
    """An option, argument or environment variable has a value vgpumon cannot use."""

    exit_code = ExitCode.USAGE


class ConfigFileError(VgpumonError):
    """The config file is missing, unreadable, not TOML, or holds an invalid setting."""

    exit_code = ExitCode.DATAERR


class NvmlUnavailableError(VgpumonError):
    """NVML cannot be used on this host at all (library missing, driver not loaded, ...)."""

    exit_code = ExitCode.UNAVAILABLE


class CaptureFormatError(VgpumonError):
    """A capture file cannot be read (missing, not a vgpumon capture, truncated, wrong version,
    fields of the wrong type, no ticks)."""

    exit_code = ExitCode.DATAERR


class OutputError(VgpumonError):
    """A file the command was asked to write cannot be written (a missing directory, no
    permission, a full disk): the output was not made, whatever else went right."""

    exit_code = ExitCode.IOERR


class StoreUnavailableError(VgpumonError):
    """The store (database) cannot be opened, queried or written: unreachable, timed out,
    read-only, full, of a newer schema, or holding something else. ``diagnose`` reports it as
    UNKNOWN (3); every other command exits 69, or 75 for a store that is only out of reach for
    now (``StoreUnreachableError``)."""

    exit_code = ExitCode.UNAVAILABLE


class StoreUnreachableError(StoreUnavailableError):
    """The store cannot be reached or does not answer now (connection refused, a timeout, a
    server shutting down or full of connections, a SQLite file locked by another writer): a
    condition that passes, unlike a wrong password, a missing database or a newer schema. Exit 75
    (``EX_TEMPFAIL``), so that a supervisor restarts the agent (the systemd unit does; it does not
    restart on 69)."""

    exit_code = ExitCode.TEMPFAIL
