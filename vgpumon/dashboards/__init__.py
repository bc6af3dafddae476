"""Grafana dashboards generated from the catalogue with grafana-foundation-sdk (the Grafana 11.6
build, ``pip install 'vgpumon[dashboards]'``): GPU fleet, GPU host detail, vLLM serving, PCIe
capacity. ``vgpumon dashboards build`` writes them to ``dashboards/``, where they are committed;
a test regenerates them and compares the bytes, and the end-to-end test runs every query of
every panel against a real Prometheus scraping an agent (docs/exporter.md).

This module imports the SDK only when a dashboard is built, so the rest of vgpumon runs without it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol, TypedDict

#: file name → (module, builder function)
DASHBOARDS: dict[str, tuple[str, str]] = {
    "gpu-fleet.json": ("gpu", "fleet"),
    "gpu-host.json": ("gpu", "host"),
    "vllm-serving.json": ("vllm", "serving"),
    "pcie-capacity.json": ("pcie", "capacity"),
}
EXTRA_HINT = "pip install 'vgpumon[dashboards]'"


class Target(TypedDict, total=False):
    """A panel's query, as a dashboard JSON document holds it (the keys read here)."""

    expr: str
    legendFormat: str
    refId: str


class Panel(TypedDict, total=False):
    """A panel of a dashboard JSON document (the keys read here; Grafana's have many more)."""

    type: str
    title: str
    panels: list[Panel]  # a row's
    targets: list[Target]


class Dashboard(TypedDict, total=False):
    """A dashboard JSON document, as far as ``panels`` and ``queries`` read it."""

    panels: list[Panel]


class _Builder(Protocol):
    """A dashboard builder of grafana-foundation-sdk."""

    def build(self) -> object: ...  # the SDK's model, which its JSONEncoder writes


class SdkMissingError(RuntimeError):
    """grafana-foundation-sdk is not installed (or not its 11.6 build)."""


def _builder(module: str, name: str) -> Callable[[], _Builder]:
    import importlib

    try:
        mod = importlib.import_module(f"vgpumon.dashboards.{module}")
    except ImportError as exc:
        raise SdkMissingError(f"building dashboards needs grafana-foundation-sdk ({EXTRA_HINT}): {exc}") from None
    return getattr(mod, name)


def render() -> dict[str, str]:
    """Every dashboard as JSON text (keys sorted, 2-space indent, final newline): file name → text.

    Raises:
        SdkMissingError: the SDK is not installed.
    """
    try:
        from grafana_foundation_sdk.cog.encoder import JSONEncoder
    except ImportError as exc:
        raise SdkMissingError(f"building dashboards needs grafana-foundation-sdk ({EXTRA_HINT}): {exc}") from None
    out = {}
    for filename, (module, name) in DASHBOARDS.items():
        built = _builder(module, name)().build()
        out[filename] = json.dumps(built, cls=JSONEncoder, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    return out


def write(directory: str | Path) -> list[Path]:
    """Write every dashboard into ``directory``; returns the paths written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for filename, text in render().items():
        path = directory / filename
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def panels(doc: Dashboard) -> Iterator[Panel]:
    """The panels of a dashboard JSON document (rows' nested panels included, rows left out)."""
    for p in doc.get("panels", []):
        if p.get("type") == "row":
            yield from p.get("panels", [])
        else:
            yield p


def queries(doc: Dashboard) -> Iterator[tuple[Panel, Target]]:
    """``(panel, target)`` for every Prometheus query of a dashboard JSON document."""
    for p in panels(doc):
        for t in p.get("targets", []):
            if "expr" in t:
                yield p, t


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_RANGES = re.compile(r"\[[^\]]*\]")
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression reads (not functions, keywords, labels or durations)."""
    text = _GROUPING.sub(" ", _STRINGS.sub('""', expr))
    text = re.sub(r"\{[^}]*\}", " ", _RANGES.sub(" ", text))
    names = set()
    for m in _IDENT.finditer(text):
        name, rest = m.group(), text[m.end():].lstrip()
        if rest.startswith("(") or name in _KEYWORDS or name.startswith("$"):
            continue
        if m.start() > 0 and text[m.start() - 1] in "$.0123456789":  # $__interval, 1e5
            continue
        names.add(name)
    return names
