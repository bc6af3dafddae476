"""Command line: parses, loads the settings, calls a core function, maps outcomes to exit codes.

Exit codes (one table for every command, README and docs/cli.md): 0 OK, 1 WARNING, 2 CRITICAL,
3 UNKNOWN (``diagnose`` only), 64 usage error, 65 bad input file (capture, config file), 69 NVML
or the store unavailable, 70 internal error, 130 interrupted (Ctrl-C; the agent and ``record``
stop cleanly with 0 instead). Every failure is one line on stderr, secrets masked, never a
traceback (except 70, which logs one to report).

Settings-backed options (``--db``, ``--interval``, ``--window``, ...) default to ``None`` here:
``None`` means "not given", and the value comes from the environment, the config file or the
default (``vgpumon.config``), which also validates it and names the option in the error.
"""

from __future__ import annotations

from vgpumon.cli.root import app, main

__all__ = ["app", "main"]
