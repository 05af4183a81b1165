"""The ``kvbench`` command line: one typer app, one module per command group (kvbench/commands/).

Known failures (``KvbenchError``) become one red line and their exit code (2 for bad input);
Ctrl-C exits 130 (SIGTERM 143) after the command has written what it measured; ``--debug`` shows tracebacks.
"""

from __future__ import annotations

import functools
import importlib
import os
import signal
import sys

import typer
from rich.console import Console
from rich.markup import escape

from kvbench import __version__
from kvbench.commands import help_layout
from kvbench.commands.usage_errors import bad_value_line
from kvbench.engine.threads import set_wait_policy
from kvbench.errors import Interrupted, KvbenchError, interrupt_exit_code, sigterm_interrupts
from kvbench.extras import missing_extra
from kvbench.workloads.formats import lines

try:  # typer >= 0.2x vendors click; its exceptions are not click's
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - older typer on real click
    from click import exceptions as click_exceptions

help_layout.install()  # option names whole in --help at 80 columns and through a pipe
app = typer.Typer(
    name="kvbench",
    help="Measure what prefix caching buys an LLM server, and why it is not buying more.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # Every option also reads KVBENCH_<COMMAND>_<OPTION> (click's auto_envvar_prefix): e.g.
    # KVBENCH_RUN_BASE_URL, KVBENCH_TRACE_GEN_SEED; a flag on the command line wins over the variable.
    context_settings={"auto_envvar_prefix": "KVBENCH"},
)

# Each module has ``register(app)``, which adds its commands or sub-app (the top-level words listed).
# main() imports only the module of the word on the command line, so ``kvbench sim`` never imports
# the engine, the server or the report code; the help, or a word not listed, imports them all.
_COMMAND_MODULES = {
    "kvbench.commands.sim": ("sim",),
    "kvbench.commands.memory": ("memory",),
    "kvbench.commands.trace": ("trace",),
    "kvbench.commands.run": ("run",),
    "kvbench.commands.sweep": ("sweep",),
    "kvbench.commands.report": ("report", "compare", "scoreboard"),
    "kvbench.commands.serve": ("serve",),
    "kvbench.commands.break_": ("break",),
    "kvbench.commands.model": ("model",),
    "kvbench.commands.peer": ("peer",),
    "kvbench.commands.explain": ("explain",),
    "kvbench.commands.play": ("play",),
    "kvbench.commands.route": ("route",),
    "kvbench.commands.fleet": ("fleet",),
    "kvbench.commands.bill": ("bill",),
    "kvbench.commands.events": ("events",),
}


@functools.cache
def _register(module: str) -> None:
    """Add ``module``'s commands to ``app``, once per process (main() may run many times in tests)."""
    importlib.import_module(module).register(app)


def _register_for(args: list[str]) -> None:
    """Register the one module that owns the command word in ``args`` (the first word not an
    option: the root has flags only), or every module when there is none or it is unknown."""
    word = next((arg for arg in args if not arg.startswith("-")), None)
    modules = [module for module, words in _COMMAND_MODULES.items() if word in words] or list(
        _COMMAND_MODULES
    )
    for module in modules:
        _register(module)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"kvbench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=_print_version,
        allow_from_autoenv=False,
        help="Print the version and exit.",
    ),
    debug: bool = typer.Option(
        False,
        "--debug",
        allow_from_autoenv=False,
        help="Show the traceback of an error instead of one line "
        "(anywhere on the line; env KVBENCH_DEBUG=1).",
    ),
    max_line_bytes: int = typer.Option(
        lines.DEFAULT_MAX_LINE_BYTES,
        "--max-line-bytes",
        min=1,
        help="Refuse a line of an input file (JSONL, CSV row, ShareGPT conversation) longer than this many "
        "bytes; memory stays proportional to one line (env KVBENCH_MAX_LINE_BYTES).",
    ),
) -> None:
    """Measure what prefix caching buys an LLM server, and why it is not buying more."""
    # --version acts in its callback; main() takes --debug off the line before typer parses it
    del (
        version,
        debug,
    )
    token = lines.set_max_line_bytes(max_line_bytes)  # for this command only: reset when its context closes
    ctx.call_on_close(lambda: lines.reset_max_line_bytes(token))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app and map errors to one line and an exit code."""
    set_wait_policy()  # OpenMP threads that sleep, not spin, while they wait: before anything loads torch
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("KVBENCH_DEBUG") == "1"
    args = [arg for arg in args if arg != "--debug"]
    from kvbench.results.parquet import record_command_line

    record_command_line(["kvbench", *args])
    _register_for(args)
    previous = signal.signal(signal.SIGTERM, sigterm_interrupts)  # every command: unwinds as Ctrl-C, exit 143
    try:
        _run_command(args, debug)
    finally:
        signal.signal(signal.SIGTERM, previous)  # the caller's handler back (tests call main in-process)


def _run_command(args: list[str], debug: bool) -> None:
    """Run the command on ``args``; every way it ends becomes one line and an exit code."""
    err = _error_console()
    command = typer.main.get_command(app)
    try:
        code = command.main(args=args, prog_name="kvbench", standalone_mode=False)
    except (typer.Abort, KeyboardInterrupt):
        _interrupted("")
    except Interrupted as exc:  # the command wrote what it measured; the message says how far it got
        _interrupted(str(exc))
    except click_exceptions.BadParameter as exc:  # a bad option value: one line naming the flag (exit 2)
        line = bad_value_line(exc, args)
        if line is None:
            exc.show()
        else:
            err.print(f"[red]error:[/red] {escape(line)}")
        sys.exit(exc.exit_code)
    except click_exceptions.ClickException as exc:  # usage errors: bad option values, unknown commands
        exc.show()
        sys.exit(exc.exit_code)
    except UnicodeDecodeError as exc:  # a reader met a binary file (the readers name the file when they can)
        if debug:
            raise
        err.print(f"[red]error:[/red] an input file is not UTF-8 text ({exc.reason} at byte {exc.start})")
        sys.exit(2)
    except KvbenchError as exc:
        if debug:
            raise
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        sys.exit(exc.exit_code)
    except ModuleNotFoundError as exc:  # a command reached a module of an extra that is not installed
        if debug:
            raise
        message = missing_extra(exc)
        err.print(f"[red]error:[/red] {escape(message) if message else _unexpected(exc)}")
        sys.exit(1 if message is None else 2)
    except Exception as exc:  # an unexpected failure: still one line unless --debug
        if debug:
            raise
        err.print(f"[red]error:[/red] {_unexpected(exc)}")
        sys.exit(1)
    if code in (130, 143):  # typer turns a KeyboardInterrupt (Ctrl-C, SIGTERM) into exit code 130
        _interrupted("")
    sys.exit(code if isinstance(code, int) else 0)


def _error_console() -> Console:
    """stderr for the one error line: the message is printed as written (escaped, no emoji codes:
    a Rich console turned ``trace.jsonl:100: field`` into ``trace.jsonl💯 field``)."""
    return Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)


def _unexpected(exc: Exception) -> str:
    return f"{escape(type(exc).__name__ + ': ' + str(exc))} [dim](--debug shows the traceback)[/dim]"


def _interrupted(detail: str) -> None:
    """One line (how far the command got, when it knows) and exit 130 (Ctrl-C) or 143 (SIGTERM)."""
    _error_console().print(f"[red]interrupted[/red] {escape(detail)}".rstrip())
    sys.exit(interrupt_exit_code())


if __name__ == "__main__":
    main()
