"""Help that fits the terminal: docstrings reflowed into paragraphs that rich wraps at the
terminal's width, example blocks kept as written, flags shown as plain flags.

A docstring's lines break where the source file's line length says, not where the reader's
terminal does; typer (rich markup mode) keeps those breaks after the first paragraph, so an
80-column terminal wrapped each of them again and cut words apart. ``reflow`` joins the lines of
every prose paragraph, keeps indented lines (the examples) one per line, and ``reflow_app``
applies it to every command and group of an app before typer builds its help.
"""

from __future__ import annotations

import inspect
from typing import Any

import typer


def reflow(text: str | None) -> str | None:
    """``text`` with each prose paragraph on one line (rich wraps it at the terminal's width),
    consecutive indented lines (examples) kept as one block, line by line, and a paragraph ending
    in ``:`` followed directly by its block. A ``\\n`` written at a line's end (typer's idiom for
    a line break, ``Examples:\\n``) is one blank-line paragraph break like any other."""
    if text is None:
        return None
    out: list[str] = []
    for para in inspect.cleandoc(text).split("\n\n"):
        lines = [ln.rstrip() for ln in para.strip("\n").splitlines() if ln.strip()]
        if not lines:
            continue
        if all(ln.startswith(" ") for ln in lines):
            block = "\n".join(lines)
            if out and (out[-1].endswith(":") or out[-1].splitlines()[-1].startswith(" ")):
                out[-1] += "\n" + block  # the block under its heading, or the rest of it
            else:
                out.append(block)
            continue
        # prose lines joined; indented lines (a block right under its heading) one per line
        pieces: list[str] = []
        for ln in lines:
            if ln.startswith(" ") or not pieces or pieces[-1].startswith(" "):
                pieces.append(ln if ln.startswith(" ") else ln.strip())
            else:
                pieces[-1] += " " + ln.strip()
        out.append("\n".join(pieces))
    return "\n\n".join(out)


def _reflow_info(info: Any) -> None:
    """One ``CommandInfo`` or ``TyperInfo``: its help, else its callback's docstring."""
    callback = getattr(info, "callback", None)
    text = info.help if isinstance(info.help, str) else (inspect.getdoc(callback) if callback else None)
    if text:
        info.help = reflow(text)


def reflow_app(app: typer.Typer) -> None:
    """Reflow the help of every command and group registered on ``app``, recursively."""
    if isinstance(app.info.help, str):
        app.info.help = reflow(app.info.help)
    for cmd in app.registered_commands:
        _reflow_info(cmd)
    for group in app.registered_groups:
        _reflow_info(group)
        if group.typer_instance is not None:
            reflow_app(group.typer_instance)


def _flags_without_type() -> None:
    """typer ≥ 0.20 writes a flag's type in the help (``--json <bool>``), as if it took a value;
    a flag is shown as the flag alone, as click and every other tool show it."""
    from typer import core

    option = getattr(core, "TyperOption", None)
    original = getattr(option, "display_type_rich", None)
    if option is None or original is None or getattr(original, "_vgpumon_flag_aware", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        if getattr(self, "is_flag", False) and not getattr(self, "count", False):
            return None
        return original(self, ctx)

    display_type_rich._vgpumon_flag_aware = True  # type: ignore[attr-defined]
    option.display_type_rich = display_type_rich


_flags_without_type()
