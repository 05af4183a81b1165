"""``kvbench break EXPERIMENT``: reproduce the classic ways a prefix cache breaks, and measure the damage.

Each experiment (one module in ``kvbench/breaks/``) serves a broken and a correct variant on the
same requests, prints a table ending in a one-line verdict, and writes Parquet like any run
(``results/break-NAME-TIME.parquet``: one row per request, run columns plus ``experiment`` and
``variant``). ``kvbench break --list`` describes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from kvbench.breaks import EXPERIMENTS
from kvbench.commands import options as opt
from kvbench.commands.break_experiment import run_configured
from kvbench.commands.common import make_console
from kvbench.commands.signature import OptionGroup, with_options
from kvbench.errors import InputError
from kvbench.run.config import EngineKind
from kvbench.run.scenario import parse_int_list

break_app = typer.Typer(
    help="Reproduce the classic ways a prefix cache breaks (broken vs correct, same trace) and measure "
    "the damage. --list describes the experiments.",
    no_args_is_help=False,
)
# The experiment modules import the engine (torch): they are imported inside the commands, so that
# every other kvbench command starts fast.

ModelPath = Annotated[
    Path | None,
    typer.Option("--model", help="Local Hugging Face checkpoint (default: the built-in random Llama)."),
]
Device = opt.Device  # checked while the flags are parsed, as run's
Out = Annotated[
    Path | None, typer.Option(help="Output FILE: the Parquet file (default results/break-NAME-TIME.parquet).")
]
Seed = Annotated[int, typer.Option(help="Workload seed.")]
BlockSize = Annotated[int, typer.Option(min=1, help="Tokens per cache block.")]
MaxTokens = Annotated[int | None, typer.Option(help="Output tokens per request (default: the experiment's).")]
Engine = Annotated[
    EngineKind,
    typer.Option(
        help="The in-process engine the variants run on: copy (a tensor per block) or paged (one KV pool, "
        "block tables)."
    ),
]
SystemTokens = Annotated[int | None, typer.Option(help="Shared system prompt, tokens.")]
QuestionTokens = Annotated[int | None, typer.Option(help="Unique question per request, tokens.")]
# The options every experiment ends with (see with_options), read as one BreakFlags.
MACHINE: OptionGroup = {
    "model": (ModelPath, None),
    "device": (Device, "cpu"),
    "out": (Out, None),
    "engine": (Engine, EngineKind.COPY),
    "threads": (opt.Threads, None),
}


def _on_engine(experiment: str, engine: EngineKind) -> None:
    """Refuse an experiment the engine cannot run (its spec's ``unsupported_breaks``), in one line."""
    if (why := engine.spec.unsupported_breaks.get(experiment)) is not None:
        raise InputError(f"kvbench break {experiment} --engine {engine.value}: {why}")


def list_experiments(
    ctx: typer.Context,
    list_: Annotated[bool, typer.Option("--list", help="Describe the experiments and exit.")] = False,
) -> None:
    """Reproduce the classic ways a prefix cache breaks, and measure the damage."""
    if not list_ and ctx.invoked_subcommand is not None:
        return
    if not list_:
        typer.echo(ctx.get_help())
        raise typer.Exit(2)  # as bare `kvbench` does: no experiment named is a usage error
    table = Table(
        title="kvbench break: experiments (kvbench break NAME --help for flags)", title_justify="left"
    )
    for column in ("experiment", "what breaks", "what it shows", "defaults"):
        table.add_column(column)
    for info in EXPERIMENTS:
        table.add_row(info.name, info.breaks, info.shows, info.default_size)
    make_console().print(table)
    raise typer.Exit()


def _option(kind: Any, help_text: str, default: Any = None, *names: str, **option: Any) -> tuple[Any, Any]:
    """One experiment's own option, for an :data:`OptionGroup`: ``(Annotated[kind, typer.Option(...)],
    default)``."""
    return Annotated[kind, typer.Option(*names, help=help_text, **option)], default


def _requests(help_text: str) -> tuple[Any, Any]:
    return _option(int | None, help_text, None, "--requests", "--num-requests", min=1)


# The shared-prefix trace options of timestamp and views, and the options most experiments end with.
_SHARED_PREFIX: OptionGroup = {
    "system_tokens": (SystemTokens, None),
    "question_tokens": (QuestionTokens, None),
}
_BLOCKS_AND_SEED: OptionGroup = {"block_size": (BlockSize, 16), "seed": (Seed, 0)}
_TIMESTAMP: OptionGroup = {
    "requests": _requests("Requests per variant (the first is cold)."),
    **_SHARED_PREFIX,
    "max_tokens": (MaxTokens, None),
    **_BLOCKS_AND_SEED,
}
_HEAD_FIRST: OptionGroup = {
    "scenarios": _option(
        str | None,
        "Comma-separated scenario files (default: scenarios/multi_prefix_zipf.toml and "
        "multi_prefix_rr.toml).",
    ),
    "sizes": _option(str | None, "Cache sizes in blocks (default: each scenario's)."),
    "sim_requests": _option(int | None, "Simulate only the first N requests."),
    "engine_requests": _option(int | None, "Requests served on the engine per order."),
    "engine_size": _option(int | None, "Engine cache size in blocks (default: largest gap)."),
    "max_tokens": (MaxTokens, None),
}
_VIEWS: OptionGroup = {
    "requests": _requests("Requests per variant."),
    **_SHARED_PREFIX,
    "max_tokens": (MaxTokens, None),
    "cache_size": _option(str, "Cache size in bytes (16MiB, 1GiB, ...).", "16MiB"),
    **_BLOCKS_AND_SEED,
    "plot": _option(Path | None, "Also write a PNG of KV bytes per request here."),
}
_TINY_HASH: OptionGroup = {
    "bits": _option(int | None, "Bits kept of every block key (8..256)."),
    "requests": _requests("Requests per run."),
    "prefixes": _option(int | None, "Shared system prompts (Zipf popularity)."),
    "prefix_tokens": _option(int | None, "Tokens per system prompt."),
    "unique_tokens": _option(int | None, "Unique tokens per request."),
    "max_tokens": (MaxTokens, None),
    **_BLOCKS_AND_SEED,
}
_SHARED_SALT: OptionGroup = {
    "trials": _option(int | None, "Private prompts, each guessed right and wrong once."),
    "prompt_tokens": _option(int | None, "Tokens per prompt."),
    "max_tokens": (MaxTokens, None),
    "alpha": _option(float | None, "Significance level for calling it a leak."),
    **_BLOCKS_AND_SEED,
}


@with_options(_TIMESTAMP, MACHINE)
def timestamp_command(**options: Any) -> None:
    """'Current time: <now>' first in the system prompt vs last vs absent: hit rate and TTFT."""
    from kvbench.breaks import timestamp

    run_configured(
        timestamp.EXPERIMENT,
        timestamp.TimestampConfig,
        timestamp.run_timestamp,
        [timestamp.timestamp_table],
        options,
    )


@with_options(_HEAD_FIRST, MACHINE)
def head_first_command(**options: Any) -> None:
    """Blocks released head before tail: simulated hit rate per size, then TTFT on the engine."""
    from kvbench.breaks import head_first

    scenarios, sizes = options["scenarios"], options["sizes"]
    paths = head_first.scenario_paths([p for p in scenarios.split(",") if p.strip()] if scenarios else None)
    for path in paths:
        if not path.exists():
            raise InputError(f"--scenarios: {path}: no such file")
    run_configured(
        head_first.EXPERIMENT,
        head_first.HeadFirstConfig,
        lambda loaded, config, _, progress: head_first.run_head_first(loaded, config, progress),
        [head_first.sweep_table, head_first.engine_table],
        {
            **options,
            "scenarios": paths,
            "sizes": tuple(parse_int_list(sizes, "--sizes")) if sizes is not None else None,
        },
    )


@with_options(_VIEWS, MACHINE)
def views_command(**options: Any) -> None:
    """Cached views instead of copies: believed vs really held KV bytes and RSS, per request."""
    _on_engine("views", options["engine"])
    from kvbench.breaks import views
    from kvbench.memory.layout import parse_bytes

    plot = options.pop("plot")
    options["cache_size"] = parse_bytes(options["cache_size"])
    result = run_configured(
        views.EXPERIMENT, views.ViewsConfig, views.run_views, [views.views_table], options
    )
    if plot is not None:
        make_console().print(f"wrote {views.plot_views(result, plot)}")


@with_options(_TINY_HASH, MACHINE)
def tiny_hash_command(**options: Any) -> None:
    """Block keys truncated to N bits: false hits and wrong outputs, vs full SHA-256."""
    _on_engine("tiny-hash", options["engine"])
    from kvbench.breaks import tiny_hash

    run_configured(
        tiny_hash.EXPERIMENT,
        tiny_hash.TinyHashConfig,
        tiny_hash.run_tiny_hash,
        [tiny_hash.tiny_hash_table],
        options,
    )


@with_options(_SHARED_SALT, MACHINE)
def shared_salt_command(**options: Any) -> None:
    """Tenants without salts: B's TTFT reveals whether its guess of A's prompt was cached."""
    from kvbench.breaks import shared_salt

    run_configured(
        shared_salt.EXPERIMENT,
        shared_salt.SharedSaltConfig,
        shared_salt.run_shared_salt,
        [shared_salt.shared_salt_table],
        options,
    )


def register(app: typer.Typer) -> None:
    """Add the ``break`` group: ``--list`` on the group, one command per experiment."""
    break_app.callback(invoke_without_command=True)(list_experiments)
    break_app.command("timestamp")(timestamp_command)
    break_app.command("head-first")(head_first_command)
    break_app.command("views")(views_command)
    break_app.command("tiny-hash")(tiny_hash_command)
    break_app.command("shared-salt")(shared_salt_command)
    app.add_typer(break_app, name="break")
