"""The defaults that depend on the machine and the user: where the store, the spool and the
config file live (platformdirs' directories) and the host name. Filled in by ``load_settings``
where a setting is unset."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

import platformdirs


def default_db_url() -> str:
    """The store when none is configured: a SQLite file under the user's data directory
    (``~/.local/share/vgpumon/vgpumon.db`` on Linux)."""
    return f"sqlite:///{Path(platformdirs.user_data_dir('vgpumon')) / 'vgpumon.db'}"


def default_hostname() -> str:
    """The system host name (what the agent stores under when ``agent.hostname`` is unset)."""
    return socket.gethostname()


def default_spool_dir(db_url: str) -> Path:
    """A spool directory per store URL under the user's state directory
    (``~/.local/state/vgpumon/spool/<hash>`` on Linux): rows spooled for one store are never
    replayed into another. Put it on a different disk than a SQLite store (docs/store.md)."""
    digest = hashlib.sha256(db_url.encode()).hexdigest()[:12]
    return Path(platformdirs.user_state_dir("vgpumon")) / "spool" / digest


def default_config_file() -> Path:
    """``config.toml`` under the user's config directory (``~/.config/vgpumon/`` on Linux)."""
    return Path(platformdirs.user_config_dir("vgpumon")) / "config.toml"
