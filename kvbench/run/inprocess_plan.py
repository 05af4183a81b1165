"""``kvbench run --backend inprocess`` (the default): the plan of a run on the engine in this process.

The model loads once the input is checked (bad input stays one line, before torch loads anything),
at the torch threads :func:`~kvbench.engine.threads.chosen_threads` picks (``config.model.threads``
wins, recorded as ``run.threads``); the requests carry the engine's own prediction of their cached
tokens (:func:`kvbench.run.engines.predicted_cached_tokens`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvbench.errors import checked
from kvbench.request import Request
from kvbench.run.checks import check_against_model, check_cache_size_text, check_host_tier_text
from kvbench.run.config import BackendKind, RunConfig, TurnMode
from kvbench.run.engines import build_backend, predicted_cached_tokens, verify_metadata
from kvbench.run.execute import (
    OnStatus,
    default_out,
    loading_line,
    new_run_id,
    prepared_requests,
    run_metadata,
)
from kvbench.run.loop import LoadConfig
from kvbench.run.plan import RunPlan, register_backend
from kvbench.run.setup import cache_config, cache_metadata, parse_cache_size, run_section
from kvbench.run.source import RunSection, RunSource, load_source


@register_backend(BackendKind.INPROCESS)
def inprocess_plan(config: RunConfig, say: OnStatus, stack: contextlib.ExitStack) -> RunPlan:
    """The plan of ``config`` on the in-process engine: the source read and every flag checked, then
    the threads chosen (held by ``stack`` to the run's end), the model loaded, the cache sized and
    the requests' expected cached tokens predicted.

    Raises:
        InputError: a bad flag, file or model (one line).
    """
    from kvbench.engine.model import load_model, resolve_device
    from kvbench.engine.threads import chosen_threads

    flags = config.model
    inputs = _checked_inputs(config)
    source, settings = inputs.source, inputs.settings
    resolve_device(flags.device)  # no such GPU: one line, before the threads line
    threads = stack.enter_context(chosen_threads(flags.threads, say))  # after the input's checks
    say(loading_line(flags.path, flags.device))
    loaded = load_model(inputs.model_config)
    check_against_model(inputs.requests, inputs.block_size, loaded.max_context_tokens)
    cache, pool, requests = _caches_and_expectations(config, inputs, loaded)
    load = checked(
        lambda: LoadConfig(concurrency=settings.concurrency, num_warmup=min(settings.warmup, len(requests)))
    )
    backend = build_backend(
        loaded, config.engine, cache, pool, _sampling(settings), settings.verify, config.salt or ""
    )
    engine = backend.engine
    run_info = {
        "run_id": new_run_id(source.name),
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
    turns = _live_turns(config, requests, inputs.tokenizer, cache, metadata)
    return RunPlan(
        requests,
        backend,
        load,
        config.out or default_out("run", source.name),
        metadata,
        config.summary,
        turns=turns,
        on_end=lambda records: _end_metadata(metadata, engine, records),
        num_asked=settings.num_requests,
        num_source_requests=len(source.requests),
    )


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
    check_host_tier_text(config.engine.host_tier)
    # the cache's rules, at a stand-in size (an engine with a KV pool sizes it by them, cache on or off)
    if settings.cache == "on" or config.engine.engine.spec.has_kv_pool:
        cache_config(source.cache, config.cache, 1, block_size)
    return _Inputs(model_config, tokenizer, source, settings, requests, block_size)


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


def _end_metadata(metadata: dict, engine, records) -> None:
    """What an in-process run knows only once it has ended (also when Ctrl-C or SIGTERM cut it):
    ``run.kv_memory`` and ``run.verify_logits`` (``--verify`` on the paged engine)."""
    if (checked_logits := verify_metadata(engine)) is not None:
        metadata["run"]["verify_logits"] = checked_logits
    metadata["run"]["kv_memory"] = engine.memory(records)


def _live_turns(config: RunConfig, requests, tokenizer, cache, metadata: dict):
    """``--turns live``: the hook that builds each session's next turn from the engine's reply (``None``
    for scripted turns); recorded as ``run.turns`` in the metadata."""
    if config.server.turns is not TurnMode.LIVE:
        return None
    from kvbench.run.live_turns import LiveTurns

    metadata["run"]["turns"] = "live"
    return LiveTurns(requests, tokenizer, cache)
