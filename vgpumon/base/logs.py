"""Logging and error lines shared by every command and the agent's own process.

Kept in ``base`` so that a command that only reads (``diagnose``, ``capacity``, ``db``) sets up its
logging without importing the agent (a quarter of a second of imports it never uses).
"""

from __future__ import annotations

import logging
import sys
from typing import NoReturn

from vgpumon.base.errors import ExitCode
from vgpumon.base.masking import MaskingFormatter

log = logging.getLogger("vgpumon")


def setup_logging(level: str) -> None:
    """Log to stderr at ``level`` through the masking formatter (no password in any line)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(MaskingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper()))
    # Alembic narrates every migration step at INFO; one line from vgpumon.store.migrate says it.
    logging.getLogger("alembic").setLevel(max(logging.WARNING, root.level))


def one_line(text: str) -> str:
    """An error message on one line (its lines joined with "; ")."""
    # "Value error, " is pydantic's prefix, which typer passes on for enum options
    return "; ".join(s.strip() for s in text.strip().splitlines() if s.strip()).replace("Value error, ", "")


def exit_internal_error() -> NoReturn:
    """Log the exception being handled as an internal error and exit 70 (``vgpumon`` and the
    agent's own process alike)."""
    if not logging.getLogger().handlers:
        setup_logging("warning")
    log.exception("internal error")
    sys.exit(ExitCode.SOFTWARE)
