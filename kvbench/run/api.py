"""The library entry points behind ``kvbench run`` and ``kvbench sweep``.

:func:`run` replays a scenario or trace on the in-process engine or an OpenAI-compatible server
and writes one Parquet row per request; :func:`sweep` runs the engine once per cache size and fits
TTFT against the miss rate. Both return what they measured; neither prints. Progress goes through
``on_progress(rows_so_far, total)``. On Ctrl-C (or SIGTERM turned into one by the caller) what was
measured is written, marked incomplete, and :class:`RunInterrupted` is raised with the outcome.

Example::

    from kvbench.run.api import run
    from kvbench.run.config import RunConfig, RunFlags
    outcome = run(RunConfig("scenarios/shared_2k.toml", run=RunFlags(num_requests=5)))
    print(outcome.summary.token_hit_rate, outcome.path)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvbench.errors import checked
from kvbench.request import Request
from kvbench.results.parquet import check_output_path
from kvbench.results.writer import RunWriter
from kvbench.run.cache_sweep import SweepOutcome, sweep  # the engine sweep lives in its own module
from kvbench.run.checks import check_against_model, check_cache_size_text, requests_note
from kvbench.run.config import BackendKind, RunConfig, TurnMode
from kvbench.run.engines import build_backend, predicted_cached_tokens, verify_metadata
from kvbench.run.execute import (
    OnStatus,
    Progress,
    RunInterrupted,
    RunOutcome,
    default_out,
    execute,
    loading_line,
    new_run_id,
    prepared_requests,
    run_metadata,
    status_sink,
)
from kvbench.run.load_section import with_load_section
from kvbench.run.loop import LoadConfig
from kvbench.run.setup import cache_config, cache_metadata, parse_cache_size, run_section
from kvbench.run.source import RunSection, RunSource, load_source

__all__ = ["RunInterrupted", "RunOutcome", "SweepOutcome", "run", "run_inprocess", "sweep"]


def run(
    config: RunConfig, on_progress: Progress | None = None, on_status: OnStatus | None = None
) -> RunOutcome:
    """Replay ``config.source`` (a scenario or trace file) on ``config.backend``: the in-process
    engine or an OpenAI-compatible server (``config.server.base_url``). Writes one Parquet row per
    request to ``config.out`` (default ``results/run-NAME-TIME.parquet``) and returns the
    :class:`RunOutcome`: rows, metadata, ``summary`` (TTFT/TPOT/ITL percentiles, hit rate) and, for
    a server, ``reconciliation`` (reported vs expected vs ``/metrics`` cached tokens).
    ``on_progress(rows_so_far, total)`` is called after every request; ``on_status(line)`` with each
    status line when it happens (model loading, threads, preflight, server cache; without it they
    end up in ``outcome.notes``). (``kvbench.run_scenario``.)

    Raises:
        InputError: a bad flag, file, model or server answer (one line).
        RunInterrupted: Ctrl-C; the rows so far are written.
    """
    if config.out is not None:
        check_output_path(config.out)
    config = checked(lambda: with_load_section(config))  # the scenario's [load] under the flags
    replacing = config.out is not None and Path(config.out).is_file()
    if config.backend is BackendKind.OPENAI:
        from kvbench.run.api_openai import run_openai

        outcome = run_openai(config, on_progress, on_status)
    elif config.backend is BackendKind.ANTHROPIC:
        from kvbench.run.api_anthropic import run_anthropic

        outcome = run_anthropic(config, on_progress, on_status)
    else:
        outcome = run_inprocess(config, on_progress, on_status)
    if replacing:
        outcome.notes.append(f"--out {config.out}: replaced the results file that was there")
    return outcome


def run_inprocess(
    config: RunConfig, on_progress: Progress | None = None, on_status: OnStatus | None = None
) -> RunOutcome:
    """:func:`run` on the in-process engine, at the torch threads
    :func:`~kvbench.engine.threads.chosen_threads` picks (``config.model.threads`` wins), recorded
    in the metadata as ``run.threads``."""
    from kvbench.engine.threads import chosen_threads

    notes: list[str] = []
    say = status_sink(on_status, notes)
    with contextlib.ExitStack() as stack:  # the threads are chosen once the input is checked, kept to the end
        outcome = _run_inprocess(
            config, on_progress, say, lambda: stack.enter_context(chosen_threads(config.model.threads, say))
        )
    outcome.notes[:0] = notes
    return outcome


@dataclass(frozen=True)
class _Inputs:
    """What an in-process run reads and checks before torch loads the model."""

    model_config: Any
    tokenizer: Any
    source: RunSource
    settings: RunSection
    requests: list[Request]
    block_size: int


def _checked_inputs(config: RunConfig) -> _Inputs:
    """Read the source and check every flag against it: bad input stays one line, before any load."""
    from kvbench.engine.model import ModelConfig
    from kvbench.workloads.tokenizer import load_tokenizer

    flags = config.model
    model_path = Path(flags.path) if flags.path is not None else None
    model_config = checked(lambda: ModelConfig(path=model_path, device=flags.device, dtype=flags.dtype))
    tokenizer = load_tokenizer(flags.path)
    source = load_source(config.source, tokenizer, limit=config.run.num_requests)
    settings = run_section(source, config.run, config.cache)
    requests = prepared_requests(source, settings)
    block_size = config.cache.block_size or source.block_size
    check_cache_size_text(config.cache.cache_size or settings.cache_size)  # all before torch loads the model
    # the cache's rules, at a stand-in size (an engine with a KV pool sizes it by them, cache on or off)
    if settings.cache == "on" or config.engine.engine.spec.has_kv_pool:
        cache_config(source.cache, config.cache, 1, block_size)
    return _Inputs(model_config, tokenizer, source, settings, requests, block_size)


def _run_inprocess(
    config: RunConfig, on_progress: Progress | None, say: OnStatus, choose_threads
) -> RunOutcome:
    from kvbench.engine.model import load_model, resolve_device

    flags = config.model
    inputs = _checked_inputs(config)
    source, settings = inputs.source, inputs.settings
    resolve_device(flags.device)  # no such GPU: one line, before the threads line
    threads = choose_threads()  # bad input above stays one line: no status line before it
    say(loading_line(flags.path, flags.device))
    loaded = load_model(inputs.model_config)
    check_against_model(inputs.requests, inputs.block_size, loaded.max_context_tokens)
    cache, pool, requests = _caches_and_expectations(config, inputs, loaded)
    sampling = _sampling(settings)
    load = checked(
        lambda: LoadConfig(concurrency=settings.concurrency, num_warmup=min(settings.warmup, len(requests)))
    )
    backend = build_backend(loaded, config.engine, cache, pool, sampling, settings.verify, config.salt or "")
    engine = backend.engine
    run_id = new_run_id(source.name)
    run_info = {
        "run_id": run_id,
        "backend": "inprocess",
        "model": loaded.name,
        "cache": cache_metadata(cache),
        "device": flags.device,
        "dtype": flags.dtype,
        "verify": settings.verify,
        "engine": engine.describe(),
        "threads": threads.as_dict(),
    }
    metadata = run_metadata(source, settings, requests, run_info, config.source, load.num_warmup)
    writer = RunWriter(
        config.out or default_out("run", source.name), metadata, run_id, backend.describe(), config.summary
    )
    turns = _live_turns(config, requests, inputs.tokenizer, cache, metadata)
    outcome = execute(
        requests,
        backend,
        load,
        writer,
        on_progress,
        turns=turns,
        on_end=lambda records: _end_metadata(writer.metadata, engine, records, turns),
    )
    outcome.notes += requests_note(settings.num_requests, len(source.requests))
    if turns is not None:
        outcome.notes += turns.report.lines()
    writer.close(complete=True)
    return outcome


def _caches_and_expectations(config: RunConfig, inputs: _Inputs, loaded):
    """``(cache, pool, requests)``: the prefix cache (``None`` with the cache off), the engine's
    pool config (an engine with a KV pool has one either way), and the requests with their expected
    cached tokens."""
    settings = inputs.settings
    capacity = parse_cache_size(
        config.cache.cache_size or settings.cache_size, loaded.kv_layout(inputs.block_size).bytes_per_block
    )
    pool = (
        cache_config(inputs.source.cache, config.cache, capacity, inputs.block_size)
        if settings.cache == "on" or config.engine.engine.spec.has_kv_pool
        else None
    )
    cache = pool if settings.cache == "on" else None
    expected = predicted_cached_tokens(
        inputs.requests, config.engine, cache, settings.concurrency, settings.ignore_eos
    )
    requests = [replace(r, expected_cached_tokens=e) for r, e in zip(inputs.requests, expected)]
    return cache, pool, requests


def _sampling(settings: RunSection):
    from kvbench.engine.sampling import SamplingParams

    return checked(
        lambda: SamplingParams(
            temperature=settings.temperature,
            top_p=settings.top_p,
            seed=settings.seed,
            ignore_eos=settings.ignore_eos,
        ),
        {
            "temperature": "scenario key run.temperature",  # the flags were checked earlier
            "top_p": "scenario key run.top_p",
        },
    )


def _end_metadata(metadata: dict, engine, records, turns) -> None:
    """What an in-process run knows only once it has ended (also when Ctrl-C or SIGTERM cut it):
    ``run.kv_memory``, ``run.verify_logits`` (``--verify`` on the paged engine) and ``live_turns``."""
    if (checked_logits := verify_metadata(engine)) is not None:
        metadata["run"]["verify_logits"] = checked_logits
    metadata["run"]["kv_memory"] = engine.memory(records)
    if turns is not None:
        metadata["live_turns"] = turns.report.as_dict()


def _live_turns(config: RunConfig, requests, tokenizer, cache, metadata: dict):
    """``--turns live``: the hook that builds each session's next turn from the engine's reply (``None``
    for scripted turns); recorded as ``run.turns`` in the metadata."""
    if config.server.turns is not TurnMode.LIVE:
        return None
    from kvbench.run.live_turns import LiveTurns

    metadata["run"]["turns"] = "live"
    return LiveTurns(requests, tokenizer, cache)
