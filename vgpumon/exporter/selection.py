"""The metric selection file: which families ``/metrics`` serves, one per line, editable like
dcgm-exporter's counters CSV.

Each line is ``name, type, help``. A family whose line is missing or commented out (``#``) is not
served. ``exporters/metrics.csv`` lists every family of the catalogue; it is generated
(``python -m vgpumon.exporter.selection > exporters/metrics.csv``; a test keeps it equal), and an
operator copies it, comments out lines and passes the copy with ``vgpumon agent --metrics-file``.
Unlike dcgm-exporter's file, ours cannot add fields: a name the catalogue does not know, or a
type that is not the catalogue's, is an error naming the line, not a silently empty series.
"""

from __future__ import annotations

import sys
from pathlib import Path

from vgpumon.base.files import FileRefused, read_small_file
from vgpumon.catalogue import families

HEADER = """\
# vgpumon metric selection: one metric family per line, "name, type, help".
# A family whose line is missing or starts with '#' is not served on /metrics.
# Generated from the field catalogue (python -m vgpumon.exporter.selection); copy it, comment
# out what you do not want, and start the agent with --metrics-file PATH.
"""


class SelectionError(ValueError):
    """A selection file that names a family the catalogue does not have, or misstates its type."""


def render_selection() -> str:
    """The selection file that serves every family (the content of ``exporters/metrics.csv``)."""
    lines = [HEADER.rstrip("\n")]
    lines += [f"{name}, {type_}, {help_}" for name, (type_, help_) in families().items()]
    return "\n".join(lines) + "\n"


def parse_selection(text: str, *, source: str = "selection file") -> frozenset[str]:
    """The family names a selection file serves.

    Raises:
        SelectionError: a line names a family the catalogue does not export, or gives a type
            other than the catalogue's (the message names the line), or no line names a family
            (an empty or wholly commented-out file would serve an empty ``/metrics``: Prometheus
            would scrape nothing, and every dashboard would be blank without an error).
    """
    known = families()
    chosen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        name = parts[0]
        if name not in known:
            raise SelectionError(f"{source} line {number}: {name!r} is not a vgpumon metric (docs/metrics.md lists them)")
        if len(parts) > 1 and parts[1] and parts[1] != known[name][0]:
            raise SelectionError(f"{source} line {number}: {name} is a {known[name][0]}, not a {parts[1]}")
        chosen.add(name)
    if not chosen:
        raise SelectionError(f"{source} selects no metric family: /metrics would serve nothing (to serve no /metrics, use --listen off)")
    return frozenset(chosen)


def read_selection(path: Path) -> frozenset[str]:
    """``parse_selection`` of a file.

    Raises:
        SelectionError: the file cannot be read or holds a wrong line.
    """
    try:
        text = read_small_file(path).decode("utf-8")
    except (OSError, UnicodeDecodeError, FileRefused) as exc:
        raise SelectionError(f"cannot read the metric selection file {path}: {exc}") from None
    return parse_selection(text, source=str(path))


if __name__ == "__main__":  # pragma: no cover - the generator of exporters/metrics.csv
    sys.stdout.write(render_selection())
