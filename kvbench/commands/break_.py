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
from kvbench.commands.break_experiment import BreakFlags, experiment_config, run_experiment
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


@with_options(MACHINE)
def timestamp_command(
    requests: Annotated[
        int | None,
        typer.Option("--requests", "--num-requests", min=1, help="Requests per variant (the first is cold)."),
    ] = None,
    system_tokens: SystemTokens = None,
    question_tokens: QuestionTokens = None,
    max_tokens: MaxTokens = None,
    block_size: BlockSize = 16,
    seed: Seed = 0,
    **machine: Any,
) -> None:
    """'Current time: <now>' first in the system prompt vs last vs absent: hit rate and TTFT."""
    flags = BreakFlags(**machine)
    from kvbench.breaks import timestamp

    config = experiment_config(
        timestamp.TimestampConfig,
        num_requests=requests,
        system_tokens=system_tokens,
        question_tokens=question_tokens,
        max_tokens=max_tokens,
        block_size=block_size,
        seed=seed,
        engine=flags.engine,
    )
    run_experiment(
        timestamp.EXPERIMENT,
        lambda loaded, tokenizer, progress: timestamp.run_timestamp(loaded, config, tokenizer, progress),
        lambda result: [timestamp.timestamp_table(result)],
        flags,
    )


@with_options(MACHINE)
def head_first_command(
    scenarios: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated scenario files (default: scenarios/multi_prefix_zipf.toml and "
            "multi_prefix_rr.toml)."
        ),
    ] = None,
    sizes: Annotated[
        str | None, typer.Option(help="Cache sizes in blocks (default: each scenario's).")
    ] = None,
    sim_requests: Annotated[int | None, typer.Option(help="Simulate only the first N requests.")] = None,
    engine_requests: Annotated[
        int | None, typer.Option(help="Requests served on the engine per order.")
    ] = None,
    engine_size: Annotated[
        int | None, typer.Option(help="Engine cache size in blocks (default: largest gap).")
    ] = None,
    max_tokens: MaxTokens = None,
    **machine: Any,
) -> None:
    """Blocks released head before tail: simulated hit rate per size, then TTFT on the engine."""
    flags = BreakFlags(**machine)
    from kvbench.breaks import head_first

    paths = head_first.scenario_paths([p for p in scenarios.split(",") if p.strip()] if scenarios else None)
    for path in paths:
        if not path.exists():
            raise InputError(f"--scenarios: {path}: no such file")
    config = experiment_config(
        head_first.HeadFirstConfig,
        scenarios=paths,
        sizes_blocks=tuple(parse_int_list(sizes, "--sizes")) if sizes is not None else None,
        num_sim_requests=sim_requests,
        num_engine_requests=engine_requests,
        engine_capacity_blocks=engine_size,
        max_tokens=max_tokens,
        engine=flags.engine,
    )
    run_experiment(
        head_first.EXPERIMENT,
        lambda loaded, _, progress: head_first.run_head_first(loaded, config, progress),
        lambda result: [head_first.sweep_table(result), head_first.engine_table(result)],
        flags,
    )


@with_options(MACHINE)
def views_command(
    requests: Annotated[
        int | None, typer.Option("--requests", "--num-requests", min=1, help="Requests per variant.")
    ] = None,
    system_tokens: SystemTokens = None,
    question_tokens: QuestionTokens = None,
    max_tokens: MaxTokens = None,
    cache_size: Annotated[str, typer.Option(help="Cache size in bytes (16MiB, 1GiB, ...).")] = "16MiB",
    block_size: BlockSize = 16,
    seed: Seed = 0,
    plot: Annotated[Path | None, typer.Option(help="Also write a PNG of KV bytes per request here.")] = None,
    **machine: Any,
) -> None:
    """Cached views instead of copies: believed vs really held KV bytes and RSS, per request."""
    flags = BreakFlags(**machine)
    _on_engine("views", flags.engine)
    from kvbench.breaks import views
    from kvbench.memory.layout import parse_bytes

    config = experiment_config(
        views.ViewsConfig,
        num_requests=requests,
        system_tokens=system_tokens,
        question_tokens=question_tokens,
        max_tokens=max_tokens,
        cache_bytes=parse_bytes(cache_size),
        block_size=block_size,
        seed=seed,
    )
    result = run_experiment(
        views.EXPERIMENT,
        lambda loaded, tokenizer, progress: views.run_views(loaded, config, tokenizer, progress),
        lambda result: [views.views_table(result)],
        flags,
    )
    if plot is not None:
        make_console().print(f"wrote {views.plot_views(result, plot)}")


@with_options(MACHINE)
def tiny_hash_command(
    bits: Annotated[int | None, typer.Option(help="Bits kept of every block key (8..256).")] = None,
    requests: Annotated[
        int | None, typer.Option("--requests", "--num-requests", min=1, help="Requests per run.")
    ] = None,
    prefixes: Annotated[int | None, typer.Option(help="Shared system prompts (Zipf popularity).")] = None,
    prefix_tokens: Annotated[int | None, typer.Option(help="Tokens per system prompt.")] = None,
    unique_tokens: Annotated[int | None, typer.Option(help="Unique tokens per request.")] = None,
    max_tokens: MaxTokens = None,
    block_size: BlockSize = 16,
    seed: Seed = 0,
    **machine: Any,
) -> None:
    """Block keys truncated to N bits: false hits and wrong outputs, vs full SHA-256."""
    flags = BreakFlags(**machine)
    _on_engine("tiny-hash", flags.engine)
    from kvbench.breaks import tiny_hash

    config = experiment_config(
        tiny_hash.TinyHashConfig,
        hash_bits=bits,
        num_requests=requests,
        num_prefixes=prefixes,
        prefix_tokens=prefix_tokens,
        unique_tokens=unique_tokens,
        max_tokens=max_tokens,
        block_size=block_size,
        seed=seed,
    )
    run_experiment(
        tiny_hash.EXPERIMENT,
        lambda loaded, tokenizer, progress: tiny_hash.run_tiny_hash(loaded, config, tokenizer, progress),
        lambda result: [tiny_hash.tiny_hash_table(result)],
        flags,
    )


@with_options(MACHINE)
def shared_salt_command(
    trials: Annotated[
        int | None, typer.Option(help="Private prompts, each guessed right and wrong once.")
    ] = None,
    prompt_tokens: Annotated[int | None, typer.Option(help="Tokens per prompt.")] = None,
    max_tokens: MaxTokens = None,
    alpha: Annotated[float | None, typer.Option(help="Significance level for calling it a leak.")] = None,
    block_size: BlockSize = 16,
    seed: Seed = 0,
    **machine: Any,
) -> None:
    """Tenants without salts: B's TTFT reveals whether its guess of A's prompt was cached."""
    flags = BreakFlags(**machine)
    from kvbench.breaks import shared_salt

    config = experiment_config(
        shared_salt.SharedSaltConfig,
        num_trials=trials,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        alpha=alpha,
        block_size=block_size,
        seed=seed,
        engine=flags.engine,
    )
    run_experiment(
        shared_salt.EXPERIMENT,
        lambda loaded, tokenizer, progress: shared_salt.run_shared_salt(loaded, config, tokenizer, progress),
        lambda result: [shared_salt.shared_salt_table(result)],
        flags,
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
