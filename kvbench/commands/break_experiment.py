"""How ``kvbench break`` runs one experiment: its config from the flags, the model, a progress bar,
then the tables and the Parquet file(s), and on Ctrl-C what finished."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvbench.commands.break_tables import verdict_table
from kvbench.commands.common import Heartbeat, make_console, status_printer
from kvbench.errors import Interrupted, checked
from kvbench.run.config import EngineKind

if TYPE_CHECKING:
    from kvbench.breaks.common import VerdictTable  # imports the engine: only for the annotations

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
# a command's option (its parameter name) -> the config field it sets, where the names differ
_FIELDS = {flag[2:].replace("-", "_"): field for field, flag in _FLAGS.items()}


def experiment_config(cls: type, **fields: Any) -> Any:
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


@dataclasses.dataclass(frozen=True)
class BreakFlags:
    """The flags every experiment takes (``--model``, ``--device``, ``--out``, ``--engine``,
    ``--threads``): where its variants run and where the rows go."""

    model: Path | None
    device: str
    out: Path | None
    engine: EngineKind
    threads: int | None


def run_configured(
    experiment: str,
    cls: type,
    run: Callable[[Any, Any, Any, Any], Any],
    tables: list[Callable[[Any], VerdictTable]],
    options: dict[str, Any],
) -> Any:
    """One ``kvbench break`` command: ``options`` (its flags by parameter name) split into the
    :class:`BreakFlags` and the fields of a ``cls`` config (see :func:`experiment_config`; ``--engine``
    too where ``cls`` has an ``engine`` field), then :func:`run_experiment` of
    ``run(loaded, config, tokenizer, progress)``, printing each of ``tables`` of the result."""
    machine = {field.name for field in dataclasses.fields(BreakFlags)}
    flags = BreakFlags(**{name: value for name, value in options.items() if name in machine})
    own = {_FIELDS.get(name, name): value for name, value in options.items() if name not in machine}
    if "engine" in {field.name for field in dataclasses.fields(cls)}:
        own["engine"] = flags.engine
    config = experiment_config(cls, **own)
    return run_experiment(
        experiment,
        lambda loaded, tokenizer, progress: run(loaded, config, tokenizer, progress),
        lambda result: [table(result) for table in tables],
        flags,
    )


def run_experiment(
    experiment: str,
    run: Callable[[Any, Any, Any], Any],
    tables: Callable[[Any], list[VerdictTable]],
    flags: BreakFlags,
) -> Any:
    """Check ``flags.out``, load ``flags.model`` on ``flags.device`` at the threads
    :func:`~kvbench.engine.threads.chosen_threads` picks (``flags.threads``: ``--threads``),
    ``run(loaded, tokenizer, progress)`` under a progress bar and a
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

    out = check_output_path(flags.out or default_out_path(experiment))  # before minutes of work, not after
    resolve_device(flags.device)  # no such GPU: one line, before the threads line
    err = make_console(stderr=True)
    with sigterm_as_interrupt(), collect_finished(out, experiment) as collected, Heartbeat(err) as heartbeat:
        try:
            with chosen_threads(flags.threads, status_printer(err)) as choice:
                loaded, tokenizer = _load(flags.model, flags.device, status_printer(err))
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


def _report(
    experiment: str, result: Any, tables: list[VerdictTable], out: Path, context: dict[str, Any]
) -> None:
    """Print the tables (drawn by :func:`~kvbench.commands.break_tables.verdict_table`), write the
    Parquet file(s) (``context`` added to their metadata), say where."""
    from kvbench.breaks.common import write_break_parquet

    console = make_console()
    for table in tables:
        console.print(verdict_table(table))
        console.print()
    paths = write_break_parquet(out, experiment, result.parquet_tables(), {**result.metadata(), **context})
    for path, table in zip(paths, [t for t in result.parquet_tables() if t.rows]):
        console.print(f"wrote {len(table.rows)} rows to {path}")
