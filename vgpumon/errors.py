"""Domain errors and the exit-code table shared by every command.

The table follows the monitoring-plugin convention that on-call tooling already reads
(0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN) and ``sysexits.h`` for everything else, so that a
usage error (64) is never mistaken for CRITICAL (2).
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Process exit codes of every ``vgpumon`` command (documented in README.md)."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3
    USAGE = 64  # EX_USAGE
    DATAERR = 65  # EX_DATAERR: an input file (capture) is malformed
    UNAVAILABLE = 69  # EX_UNAVAILABLE: no NVIDIA driver / library on this host
    SOFTWARE = 70  # EX_SOFTWARE: unexpected internal error


class VgpumonError(Exception):
    """Base of errors that the CLI turns into one clear line and an exit code."""

    exit_code: ExitCode = ExitCode.SOFTWARE


class NvmlUnavailableError(VgpumonError):
    """NVML cannot be used on this host at all (library missing, driver not loaded, ...)."""

    exit_code = ExitCode.UNAVAILABLE


class CaptureFormatError(VgpumonError):
    """A capture file cannot be read (not a vgpumon capture, truncated, wrong version)."""

    exit_code = ExitCode.DATAERR


class StoreUnavailableError(VgpumonError):
    """The store (database) cannot be opened or queried."""

    exit_code = ExitCode.UNKNOWN
