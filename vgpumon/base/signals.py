"""Stop signals from the first moment: the console script (``vgpumon.__main__``) installs these
handlers before it imports the CLI, and the agent's lean process keeps them until its event loop
takes the signals over.

Importing the CLI (typer, pydantic, and for the agent SQLAlchemy, aiohttp, pynvml) takes a few
hundred milliseconds; a Ctrl-C in that time used to print a ``KeyboardInterrupt`` traceback, and
a SIGTERM killed the agent with 143. This module imports nothing of vgpumon and nothing heavy: it decides from the
command line whether Ctrl-C means "stop cleanly" (``agent`` and ``record``: exit 0, as the README
documents) or "interrupted" (every other command: 130), routes SIGTERM of the agent to the same
path; ``vgpumon.__main__`` only then imports ``vgpumon.cli``.
"""

from __future__ import annotations

import signal
import sys
from typing import NoReturn

#: Commands that stop cleanly on SIGINT/SIGTERM (exit 0): they sample until told to stop.
STOP_CLEANLY = frozenset({"agent", "record"})
#: True when this process is the console script's (``vgpumon.__main__.main``), not a library call:
#: only then may ``vgpumon agent`` replace the process with its lean one (``vgpumon.agent.process``).
exec_allowed = False
#: Root options that take a value (so that the value is not read as the command name).
_ROOT_OPTIONS_WITH_VALUE = frozenset({"--config", "--log-level"})
#: Every option of ``vgpumon`` itself (given before the command).
ROOT_OPTIONS = _ROOT_OPTIONS_WITH_VALUE | {"--version"}


def command_of(argv: list[str]) -> str | None:
    """The subcommand named on a command line (``["--config", "x", "agent"]`` → ``"agent"``);
    ``None`` when there is none."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _ROOT_OPTIONS_WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def stops_cleanly(argv: list[str]) -> bool:
    """True when ``argv`` runs a command that treats Ctrl-C and SIGTERM as "stop" (exit 0)."""
    return command_of(argv) in STOP_CLEANLY


#: Set by ``ask_stop``: SIGINT/SIGTERM came before the agent's event loop took the signals over.
#: The ``KeyboardInterrupt`` the handler raises is lost where Python ignores exceptions (a weakref
#: callback such as SQLAlchemy's, a ``__del__``): the flag is not, and the loop stops at once.
_stop_asked = False


def ask_stop(signum: int, frame: object) -> None:
    """Signal handler of the commands that stop cleanly, until the event loop takes over: note
    the stop, then raise ``KeyboardInterrupt`` as Python's default SIGINT handler does."""
    global _stop_asked
    _stop_asked = True
    raise KeyboardInterrupt


def quiet_lost_interrupts(args: "sys.UnraisableHookArgs") -> None:
    """``sys.unraisablehook`` of the commands that stop cleanly: a ``KeyboardInterrupt`` that
    Python cannot raise (it came inside a weakref callback or a ``__del__``) is the stop
    ``ask_stop`` noted, not a traceback for the user; anything else is reported as usual."""
    if isinstance(args.exc_value, KeyboardInterrupt):
        return
    sys.__unraisablehook__(args)


def say_stopped_while_starting(argv: list[str]) -> None:
    """One line on stderr for an agent or recorder stopped before it took a tick: it ends
    without its summary line otherwise, and the user cannot tell that it ran at all."""
    command = command_of(argv)
    if command in STOP_CLEANLY:
        print(f"vgpumon {command}: stopped while starting, before the first tick", file=sys.stderr)


def exit_interrupted(argv: list[str]) -> NoReturn:
    """The end of a run stopped before its command got going: 0 for the commands that stop
    cleanly (saying so), 130 for the others."""
    say_stopped_while_starting(argv)
    # CPython (3.11 to 3.13) notes a KeyboardInterrupt that escapes code run by exec() of a
    # string as unhandled, even when a caller catches it, and at exit then kills the process
    # with SIGINT (exit -2) whatever sys.exit said. dataclasses, namedtuple and pydantic build
    # their methods that way, so a Ctrl-C during the imports lands there now and then. Every
    # exec() of a string clears the note before it runs: this one leaves it cleared.
    exec("")  # noqa: S102 - an empty string of our own
    sys.exit(0 if stops_cleanly(argv) else 130)


def stop_asked() -> bool:
    """A stop signal came before the event loop took the signals over (``ask_stop``)."""
    return _stop_asked


def caused_by_interrupt(exc: BaseException | None) -> bool:
    """True when a ``KeyboardInterrupt`` (Ctrl-C, or SIGTERM of the agent) lies in ``exc``'s
    chain of causes and contexts.

    Python 3.11 wraps an exception raised inside ``__set_name__`` in ``RuntimeError("Error
    calling __set_name__ …")``, so a Ctrl-C that lands while pydantic's dataclasses are being
    created (typer imports pydantic lazily, while parsing the command line) arrives as a
    ``RuntimeError`` whose cause is the interrupt. It is still the user's stop, not an internal
    error."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def no_alarm(*_: object) -> None:
    """SIGALRM's handler outside a paced run's reads (the CLI before the exec, the lean agent's
    whole life: ``agent_main.ignore_alarms``): nothing to do."""


def install_signal_handlers(argv: list[str]) -> None:
    """SIGTERM raises ``KeyboardInterrupt`` for the commands that stop cleanly, like Ctrl-C, until
    the agent's event loop takes both signals over, and either is noted (``stop_asked``) in case
    the exception is lost; SIGALRM does nothing; other commands keep SIGTERM's and SIGALRM's
    defaults.

    A SIGINT ignored by the parent (``vgpumon agent &`` in a script) is taken over too: the event
    loop's handler stops the agent on SIGINT later in any case, as a Go exporter's
    ``signal.Notify`` would, so it does from the first moment rather than only after start-up."""
    if stops_cleanly(argv):
        signal.signal(signal.SIGTERM, ask_stop)
        signal.signal(signal.SIGINT, ask_stop)
        sys.unraisablehook = quiet_lost_interrupts
    # SIGALRM's default action would end the agent while it starts (the lean process keeps this
    # for its whole life: ``agent.process.ignore_alarms``); every command takes it over, last, so
    # that its handler in /proc/PID/status (SigCgt) says "vgpumon's own handlers are in place" to
    # a supervisor or a test (a Ctrl-C before that lands in the interpreter's start-up, where no
    # program can catch it: Python's exit then is -2, not 130)
    signal.signal(signal.SIGALRM, no_alarm)
