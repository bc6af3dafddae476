"""The ``vgpumon`` app: its own options, its commands in the order the help lists them, and
``main``, which maps every outcome to the exit-code table (``vgpumon.cli``)."""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional, cast

import typer

from vgpumon import __version__
from vgpumon.base.errors import ExitCode, UsageError, VgpumonError
from vgpumon.base.masking import mask_secrets
from vgpumon.cli.agent import agent, record
from vgpumon.cli.capacity import capacity
from vgpumon.cli.config import config_app
from vgpumon.cli.dashboards import dashboards_app
from vgpumon.cli.db import db_app
from vgpumon.cli.demo import demo
from vgpumon.cli.diagnose import diagnose
from vgpumon.cli.helptext import reflow_app
from vgpumon.cli.outcomes import _OUTPUT_ERRNOS, _one_line, _reader_gone, _silence_stdout, _stdout_file
from vgpumon.cli.rules import rules_app
from vgpumon.cli.top import top

# typer ≥ 0.20 vendors click as ``typer._click``; older releases use click itself. Take the
# exception classes from typer's public BadParameter so that both work.
_USAGE_ERROR = cast("type[Exception]", next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError"))
_CLICK_EXCEPTION = cast("type[Exception]", next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"))


app = typer.Typer(
    name="vgpumon",
    help=(
        "GPU fleet telemetry and diagnostics for LLM inference hosts.\n\n"
        "Run `vgpumon agent` on each GPU host to sample NVML into a store; run "
        "`vgpumon diagnose <host>` to read what the store says about a host. Settings come from "
        "flags, VGPUMON_* variables and a TOML config file (`vgpumon config show`)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class LogLevel(str, Enum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


def _version(value: bool) -> None:
    if value:
        typer.echo(f"vgpumon {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    config: Annotated[
        Optional[Path],
        # readable=False: an unreadable file is the loader's to say (65, like VGPUMON_CONFIG's), not Click's usage error
        typer.Option("--config", help="TOML config file (default: $VGPUMON_CONFIG, else config.toml under the user's config directory).", show_default=False,
                     readable=False),
    ] = None,
    log_level: Annotated[Optional[LogLevel], typer.Option("--log-level", help="How much to log on stderr (default warning; VGPUMON_LOG_LEVEL).")] = None,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    if log_level is None:
        _check_log_level_env()
    ctx.obj = {"config": config, "log_level": log_level.value if log_level else None}


def _check_log_level_env() -> None:
    """VGPUMON_LOG_LEVEL checked at the door, for every command: those that read no settings
    (``rules list``, ``rules build``, ``dashboards build``) would otherwise take a typo silently.
    Its message is the settings' own (``vgpumon.config``), so every command says the same."""
    value = os.environ.get("VGPUMON_LOG_LEVEL", "")
    levels = [level.value for level in LogLevel]
    if value and value not in levels:  # an empty one is unset, as for every VGPUMON_* variable
        names = ", ".join(repr(n) for n in levels[:-1]) + f" or {levels[-1]!r}"
        raise UsageError(f"invalid VGPUMON_LOG_LEVEL: Input should be {names} (got {value[:40]!r})")


# the commands and groups, in the order the help lists them
app.command()(agent)
app.command()(record)
app.command()(diagnose)
app.command()(top)
app.command()(capacity)
app.command()(demo)
app.add_typer(db_app)
app.add_typer(config_app)
app.add_typer(dashboards_app)
app.add_typer(rules_app)
reflow_app(app)  # every help paragraph wrapped by the terminal, not where its docstring broke


def _names_no_command(argv: list[str]) -> bool:
    """``vgpumon`` or ``vgpumon db`` alone: a group without its command (typer shows the help)."""
    if any(a in ("--help", "-h", "--version") for a in argv):
        return False
    words = [a for a in argv if not a.startswith("-")]
    groups = {g.name or (g.typer_instance.info.name if g.typer_instance else None) for g in app.registered_groups}
    return not words or (len(words) == 1 and words[0] in groups)


def main(argv: list[str] | None = None) -> None:
    """Runs the app on ``argv`` (default: ``sys.argv[1:]``) and maps every outcome to the
    exit-code table, printing one line on stderr for each failure. Ctrl-C exits 130, or 0 in the
    commands that stop cleanly on it (``vgpumon.base.signals``)."""
    from vgpumon.base.signals import ROOT_OPTIONS, caused_by_interrupt, exit_interrupted, install_signal_handlers

    argv = sys.argv[1:] if argv is None else list(argv)
    install_signal_handlers(argv)
    stdout_was = _stdout_file()
    try:
        try:
            rv = app(args=argv, prog_name="vgpumon", standalone_mode=False)
        except SystemExit as exc:
            # typer exits 1 when the reader of stdout goes away (`vgpumon rules list | head`),
            # after wrapping stdout to pacify its last flush, and rich (the help) after pointing
            # stdout at /dev/null: not a WARNING, the output was taken
            if exc.code == 1 and (type(sys.stdout).__name__ == "PacifyFlushWrapper" or _reader_gone(stdout_was)):
                # the help a bare group shows (`vgpumon | head`) answers 64, as when read whole
                sys.exit(ExitCode.USAGE if _names_no_command(argv) else ExitCode.OK)
            raise
        if rv == ExitCode.INTERRUPTED:  # typer turns KeyboardInterrupt into Exit(130)
            exit_interrupted(argv)
    except _USAGE_ERROR as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # `vgpumon`, `vgpumon db`: the help is the answer
            try:
                exc.show()  # type: ignore[attr-defined]
            except SystemExit:  # the reader went away (`vgpumon | head -1`): the same answer
                pass
            sys.exit(ExitCode.USAGE)
        ctx = getattr(exc, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        name = getattr(exc, "option_name", None)
        if type(exc).__name__ == "NoSuchOption" and name in ROOT_OPTIONS and ctx is not None and ctx.parent is not None:
            # `vgpumon agent --log-level info`: an option of vgpumon itself, given after the command
            print(f"vgpumon: {name} is an option of vgpumon itself: give it before the command "
                  f"(vgpumon {name} … {ctx.command_path.partition(' ')[2]} …)", file=sys.stderr)
            sys.exit(ExitCode.USAGE)
        print(f"vgpumon: {mask_secrets(_one_line(exc.format_message()))}{hint}", file=sys.stderr)  # type: ignore[attr-defined]
        sys.exit(ExitCode.USAGE)
    except (typer.Abort, KeyboardInterrupt):  # the agent's loop handles a stop once it runs: this is before
        exit_interrupted(argv)
    except VgpumonError as exc:
        print(f"vgpumon: {mask_secrets(_one_line(str(exc)))}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except BrokenPipeError:  # `vgpumon … | head`: the reader had enough; not a failure
        _silence_stdout()
        sys.exit(ExitCode.OK)
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRNOS:
            raise
        _silence_stdout()
        print(f"vgpumon: cannot write the output: {exc.strerror or exc}", file=sys.stderr)
        sys.exit(ExitCode.IOERR)
    except _CLICK_EXCEPTION as exc:
        print(f"vgpumon: {mask_secrets(_one_line(exc.format_message()))}", file=sys.stderr)  # type: ignore[attr-defined]
        sys.exit(ExitCode.USAGE)
    except Exception as exc:  # noqa: BLE001 - the one place an unexpected error becomes exit 70
        if caused_by_interrupt(exc):  # Ctrl-C inside an import's class creation (Python 3.11)
            exit_interrupted(argv)
        from vgpumon.base.logs import exit_internal_error

        exit_internal_error()
    sys.exit(int(rv) if isinstance(rv, int) else 0)
