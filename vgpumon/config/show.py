"""The effective settings as plain data, for ``vgpumon config show``: secrets masked, durations as
text, each value with where it came from, and each setting's description."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import SecretStr

from vgpumon.base.durations import format_duration
from vgpumon.base.masking import MASK, mask_secrets
from vgpumon.config.settings import Settings, leaves


def settings_document(settings: Settings, *, with_origins: bool = False) -> dict[str, Any]:
    """The effective settings as plain data with secrets masked, durations as text (``72h``).

    Args:
        settings: from ``load_settings``.
        with_origins: also return each value's origin (``{"value": ..., "from": ...}``).

    Returns:
        ``{"log_level": ..., "store": {...}, ...}``; ``None`` where a setting is unset.
    """
    doc: dict[str, Any] = {}
    origins = settings.origins
    for leaf in leaves(Settings):
        obj: Any = settings
        for k in leaf:
            obj = getattr(obj, k)
        value = _plain(obj)
        node = doc
        for k in leaf[:-1]:
            node = node.setdefault(k, {})
        node[leaf[-1]] = {"value": value, "from": origins.get(".".join(leaf), "default")} if with_origins else value
    return doc


def _field(leaf: tuple[str, ...]) -> Any:
    model: Any = Settings
    info = None
    for k in leaf:
        info = model.model_fields[k]
        model = info.annotation
    return info


def _plain(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, SecretStr):
        return MASK
    if isinstance(value, float):  # every float setting is a duration (intervals, timeouts, windows)
        return format_duration(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, str):
        return mask_secrets(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def field_descriptions() -> dict[str, str]:
    """Dotted setting path → its description (for ``config show`` and the docs)."""
    return {".".join(leaf): (_field(leaf).description or "") for leaf in leaves(Settings)}
