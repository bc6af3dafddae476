"""The ``vgpumon`` console script and ``python -m vgpumon``: signals first, then the CLI
(``vgpumon.base.signals`` says why the order matters)."""

from __future__ import annotations

import sys

from vgpumon.base import signals


def main() -> None:
    """Console-script entry point: the stop signals' handlers, then the CLI."""
    signals.exec_allowed = True
    argv = sys.argv[1:]
    signals.install_signal_handlers(argv)
    try:
        from vgpumon.cli import main as cli_main
    except Exception as exc:
        if not signals.caused_by_interrupt(exc):
            raise
        signals.exit_interrupted(argv)
    except KeyboardInterrupt:
        signals.exit_interrupted(argv)
    try:
        cli_main(argv)
    finally:
        # a Ctrl-C raised inside code that a library built with exec() of a string, and caught,
        # stays noted as unhandled and would turn any exit into -2 (``signals.exit_interrupted``
        # says why); an exec() of a string clears the note
        exec("")  # noqa: S102 - an empty string of our own


if __name__ == "__main__":
    main()
