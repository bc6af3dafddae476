"""Defaults that work on a laptop and on a GPU host, overridable by ``VGPUMON_*`` variables."""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

import platformdirs


def default_db_url() -> str:
    """``$VGPUMON_DB``, else a SQLite file under the user's data directory
    (``~/.local/share/vgpumon/vgpumon.db`` on Linux)."""
    env = os.environ.get("VGPUMON_DB")
    if env:
        return env
    return f"sqlite:///{Path(platformdirs.user_data_dir('vgpumon')) / 'vgpumon.db'}"


def default_hostname() -> str:
    """The name this host is stored under: ``$VGPUMON_HOSTNAME`` or the system host name."""
    return os.environ.get("VGPUMON_HOSTNAME") or socket.gethostname()


def default_spool_dir(db_url: str) -> Path:
    """``$VGPUMON_SPOOL``, else a directory per store URL under the user's state directory
    (``~/.local/state/vgpumon/spool/<hash>`` on Linux): rows spooled for one store are never
    replayed into another. Put it on a different disk than a SQLite store (docs/store.md)."""
    env = os.environ.get("VGPUMON_SPOOL")
    if env:
        return Path(env)
    digest = hashlib.sha256(db_url.encode()).hexdigest()[:12]
    return Path(platformdirs.user_state_dir("vgpumon")) / "spool" / digest
