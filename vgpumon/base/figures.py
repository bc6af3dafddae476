"""Tables of figures that fit the console: where a table is wider than the console (an 80-column
terminal), each row is printed as a block of "column  value" lines instead, since rich would
otherwise cut the figures themselves ("59.…", "204…"), which is worse than no table. Shared by
every report that prints figures (diagnose, capacity)."""

from __future__ import annotations

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text


def fits(t: Table, out: Console) -> bool:
    """Whether ``t`` prints whole within ``out``'s width."""
    return Measurement.get(out, out.options.update(max_width=10_000), t).maximum <= out.width


def print_figures(t: Table, out: Console, *, blank_line: bool = True) -> None:
    """``t`` (after a blank line), or, where it does not fit, one block of lines per row: the
    first column's header and value, then each other column's header and value, indented."""
    if blank_line:
        out.print()
    if fits(t, out):
        out.print(t)
        return
    if t.title:
        out.print(Text(str(t.title), style="italic"))
    columns = t.columns
    cells = [list(c.cells) for c in columns]
    label = max(len(str(c.header)) for c in columns[1:])
    for row in range(t.row_count):
        head = Text(f"{columns[0].header} ", style="bold")
        cell = cells[0][row]
        head.append(cell if isinstance(cell, Text) else str(cell))
        out.print(head)
        for column, values in zip(columns[1:], cells[1:]):
            line = Text(f"  {str(column.header):<{label}}  ")
            value = values[row]
            line.append(value if isinstance(value, Text) else Text(str(value)))
            out.print(line)
    if t.caption:
        out.print(Text(str(t.caption), style="dim italic"))
