"""``kvbench break EXPERIMENT``: reproduce the classic ways a prefix cache breaks, and measure the damage.

Each experiment (one module in ``kvbench/breaks/``) serves a broken and a correct variant on the
same requests, prints a table ending in a one-line verdict, and writes Parquet like any run
(``results/break-NAME-TIME.parquet``: one row per request, run columns plus ``experiment`` and
``variant``). ``kvbench break --list`` describes them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvbench.breaks import EXPERIMENTS
from kvbench.commands import options as opt
from kvbench.commands.common import Heartbeat, make_console, status_printer
from kvbench.errors import InputError, Interrupted, checked
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
# Experiments that cannot run on the paged engine, and why (one line each).
NOT_ON_PAGED = {
    "views": "views shows the copy engine's cached blocks as views of a request's whole KV tensor; the paged "
    "engine's blocks are slots of one preallocated pool, so there is no view to leak",
    "tiny-hash": "tiny-hash counts false hits with a lockstep replica of the copy engine's cache; on the "
    "paged "
    "engine running blocks share the pool, which that replica does not model",
}


def _on_engine(experiment: str, engine: EngineKind) -> None:
    """Refuse ``--engine paged`` for an experiment in :data:`NOT_ON_PAGED`, in one line."""
    if engine is EngineKind.PAGED and experiment in NOT_ON_PAGED:
        raise InputError(f"kvbench break {experiment} --engine paged: {NOT_ON_PAGED[experiment]}")


# config field -> its flag where the names differ
_FLAGS = {
    "hash_bits": "--bits",
    "num_requests": "--requests",
    "num_prefixes": "--prefixes",
    "num_trials": "--trials",
    "num_sim_requests": "--sim-requests",
    "num_engine_requests": "--engine-requests",
    "engine_capacity_blocks": "--engine-size",
    "sizes_blocks": "--sizes",
    "cache_bytes": "--cache-size",
    "scenarios": "--scenarios",
}


def _config(cls: type, **fields: Any) -> Any:
    """Build an experiment config from options (``None`` = the default); ``ValueError`` -> ``InputError``
    naming the flag, not the field (``--bits``, not ``hash_bits``)."""
    names = {**{name: "--" + name.replace("_", "-") for name in fields}, **_FLAGS}
    return checked(lambda: cls(**{name: value for name, value in fields.items() if value is not None}), names)


def _load(model: Path | None, device: str, say: Callable[[str], None]):
    """The model and its tokenizer, warmed up so that the first measured request is not special."""
    from kvbench.breaks.common import warm_up
    from kvbench.engine.model import ModelConfig, load_model
    from kvbench.run.execute import loading_line
    from kvbench.workloads.tokenizer import load_tokenizer

    say(loading_line(str(model) if model is not None else None, device))
    loaded = load_model(checked(lambda: ModelConfig(path=model, device=device)))
    warm_up(loaded)
    return loaded, load_tokenizer(str(model) if model is not None else None)


@contextlib.contextmanager
def _progress(heartbeat: Heartbeat) -> Iterator[Callable[[str, int, int], None]]:
    """A transient progress bar on stderr; yields the experiments' ``progress(label, done, total)``,
    which also gives ``heartbeat`` its text (outside a terminal, the bar shows nothing until the end)."""
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=heartbeat.console,
        transient=True,
    )
    task = bar.add_task("starting", total=None)

    def progress(label: str, done: int, total: int) -> None:
        bar.update(task, description=label, completed=done, total=total)
        heartbeat.set(f"{label}: {done:,}/{total:,} requests")

    with bar:
        yield progress


def _experiment(
    experiment: str,
    run: Callable[[Any, Any, Any], Any],
    tables: Callable[[Any], list[Table]],
    model: Path | None,
    device: str,
    out: Path | None,
    threads: int | None = None,
) -> Any:
    """Check ``out``, load the model at the threads :func:`~kvbench.engine.threads.chosen_threads`
    picks (``threads``: ``--threads``), ``run(loaded, tokenizer, progress)`` under a progress bar and a
    :class:`Heartbeat`, print ``tables(result)`` and write the Parquet file(s) (the choice as their
    ``threads`` metadata); returns the result. While it runs, the rows so far are checkpointed to
    ``out`` (``complete: false``; a SIGKILL leaves them). On Ctrl-C or SIGTERM, the variants that
    finished and the cut one's rows are written (those marked ``variant_complete`` false) and
    :class:`Interrupted` says where."""
    from kvbench.breaks.common import collect_finished, default_out_path, write_finished
    from kvbench.commands.common import sigterm_as_interrupt
    from kvbench.engine.model import resolve_device
    from kvbench.engine.threads import chosen_threads
    from kvbench.results.parquet import check_output_path

    out = check_output_path(out or default_out_path(experiment))  # before minutes of work, not after
    resolve_device(device)  # no such GPU: one line, before the threads line
    err = make_console(stderr=True)
    with sigterm_as_interrupt(), collect_finished(out, experiment) as collected, Heartbeat(err) as heartbeat:
        try:
            with chosen_threads(threads, status_printer(err)) as choice:
                loaded, tokenizer = _load(model, device, status_printer(err))
                with _progress(heartbeat) as progress:
                    result = run(loaded, tokenizer, progress)
        except KeyboardInterrupt:
            finished, running = collected.finished, collected.running
            path = write_finished(out, experiment, finished, running)
            partial = (
                f" and {len(running.rows)} rows of the cut variant {running.variant}"
                if running and running.rows
                else ""
            )
            kept = (
                f"kept {len(finished)} finished variant(s), {sum(len(r.rows) for r in finished)} "
                f"rows{partial}, "
                f"in {path}"
                if path
                else "no request had finished; nothing written"
            )
            raise Interrupted(f"kvbench break {experiment}: {kept}") from None
    _report(experiment, result, tables(result), out, {"threads": choice.as_dict()})
    return result


def _report(experiment: str, result: Any, tables: list[Table], out: Path, context: dict[str, Any]) -> None:
    """Print the tables, write the Parquet file(s) (``context`` added to their metadata), say where."""
    from kvbench.breaks.common import write_break_parquet

    console = make_console()
    for table in tables:
        console.print(table)
        console.print()
    paths = write_break_parquet(out, experiment, result.parquet_tables(), {**result.metadata(), **context})
    for path, table in zip(paths, [t for t in result.parquet_tables() if t.rows]):
        console.print(f"wrote {len(table.rows)} rows to {path}")


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


def timestamp_command(
    requests: Annotated[
        int | None,
        typer.Option("--requests", "--num-requests", min=1, help="Requests per variant (the first is cold)."),
    ] = None,
    system_tokens: Annotated[int | None, typer.Option(help="Shared system prompt, tokens.")] = None,
    question_tokens: Annotated[int | None, typer.Option(help="Unique question per request, tokens.")] = None,
    max_tokens: MaxTokens = None,
    block_size: BlockSize = 16,
    seed: Seed = 0,
    model: ModelPath = None,
    device: Device = "cpu",
    out: Out = None,
    engine: Engine = EngineKind.COPY,
    threads: opt.Threads = None,
) -> None:
    """'Current time: <now>' first in the system prompt vs last vs absent: hit rate and TTFT."""
    from kvbench.breaks import timestamp

    config = _config(
        timestamp.TimestampConfig,
        num_requests=requests,
        system_tokens=system_tokens,
        question_tokens=question_tokens,
        max_tokens=max_tokens,
        block_size=block_size,
        seed=seed,
        engine=engine,
    )
    _experiment(
        timestamp.EXPERIMENT,
        lambda loaded, tokenizer, progress: timestamp.run_timestamp(loaded, config, tokenizer, progress),
        lambda result: [timestamp.timestamp_table(result)],
        model,
        device,
        out,
        threads,
    )


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
    model: ModelPath = None,
    device: Device = "cpu",
    out: Out = None,
    engine: Engine = EngineKind.COPY,
    threads: opt.Threads = None,
) -> None:
    """Blocks released head before tail: simulated hit rate per size, then TTFT on the engine."""
    from kvbench.breaks import head_first

    paths = head_first.scenario_paths([p for p in scenarios.split(",") if p.strip()] if scenarios else None)
    for path in paths:
        if not path.exists():
            raise InputError(f"--scenarios: {path}: no such file")
    config = _config(
        head_first.HeadFirstConfig,
        scenarios=paths,
        sizes_blocks=tuple(parse_int_list(sizes, "--sizes")) if sizes is not None else None,
        num_sim_requests=sim_requests,
        num_engine_requests=engine_requests,
        engine_capacity_blocks=engine_size,
        max_tokens=max_tokens,
        engine=engine,
    )
    _experiment(
        head_first.EXPERIMENT,
        lambda loaded, _, progress: head_first.run_head_first(loaded, config, progress),
        lambda result: [head_first.sweep_table(result), head_first.engine_table(result)],
        model,
        device,
        out,
        threads,
    )


def views_command(
    requests: Annotated[
        int | None, typer.Option("--requests", "--num-requests", min=1, help="Requests per variant.")
    ] = None,
    system_tokens: Annotated[int | None, typer.Option(help="Shared system prompt, tokens.")] = None,
    question_tokens: Annotated[int | None, typer.Option(help="Unique question per request, tokens.")] = None,
    max_tokens: MaxTokens = None,
    cache_size: Annotated[str, typer.Option(help="Cache size in bytes (16MiB, 1GiB, ...).")] = "16MiB",
    block_size: BlockSize = 16,
    seed: Seed = 0,
    plot: Annotated[Path | None, typer.Option(help="Also write a PNG of KV bytes per request here.")] = None,
    model: ModelPath = None,
    device: Device = "cpu",
    out: Out = None,
    engine: Engine = EngineKind.COPY,
    threads: opt.Threads = None,
) -> None:
    """Cached views instead of copies: believed vs really held KV bytes and RSS, per request."""
    _on_engine("views", engine)
    from kvbench.breaks import views
    from kvbench.memory.layout import parse_bytes

    config = _config(
        views.ViewsConfig,
        num_requests=requests,
        system_tokens=system_tokens,
        question_tokens=question_tokens,
        max_tokens=max_tokens,
        cache_bytes=parse_bytes(cache_size),
        block_size=block_size,
        seed=seed,
    )
    result = _experiment(
        views.EXPERIMENT,
        lambda loaded, tokenizer, progress: views.run_views(loaded, config, tokenizer, progress),
        lambda result: [views.views_table(result)],
        model,
        device,
        out,
        threads,
    )
    if plot is not None:
        make_console().print(f"wrote {views.plot_views(result, plot)}")


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
    model: ModelPath = None,
    device: Device = "cpu",
    out: Out = None,
    engine: Engine = EngineKind.COPY,
    threads: opt.Threads = None,
) -> None:
    """Block keys truncated to N bits: false hits and wrong outputs, vs full SHA-256."""
    _on_engine("tiny-hash", engine)
    from kvbench.breaks import tiny_hash

    config = _config(
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
    _experiment(
        tiny_hash.EXPERIMENT,
        lambda loaded, tokenizer, progress: tiny_hash.run_tiny_hash(loaded, config, tokenizer, progress),
        lambda result: [tiny_hash.tiny_hash_table(result)],
        model,
        device,
        out,
        threads,
    )


def shared_salt_command(
    trials: Annotated[
        int | None, typer.Option(help="Private prompts, each guessed right and wrong once.")
    ] = None,
    prompt_tokens: Annotated[int | None, typer.Option(help="Tokens per prompt.")] = None,
    max_tokens: MaxTokens = None,
    alpha: Annotated[float | None, typer.Option(help="Significance level for calling it a leak.")] = None,
    block_size: BlockSize = 16,
    seed: Seed = 0,
    model: ModelPath = None,
    device: Device = "cpu",
    out: Out = None,
    engine: Engine = EngineKind.COPY,
    threads: opt.Threads = None,
) -> None:
    """Tenants without salts: B's TTFT reveals whether its guess of A's prompt was cached."""
    from kvbench.breaks import shared_salt

    config = _config(
        shared_salt.SharedSaltConfig,
        num_trials=trials,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        alpha=alpha,
        block_size=block_size,
        seed=seed,
        engine=engine,
    )
    _experiment(
        shared_salt.EXPERIMENT,
        lambda loaded, tokenizer, progress: shared_salt.run_shared_salt(loaded, config, tokenizer, progress),
        lambda result: [shared_salt.shared_salt_table(result)],
        model,
        device,
        out,
        threads,
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
