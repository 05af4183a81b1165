"""``kvbench run --backend openai``: the same trace against any OpenAI-compatible server.

The local tokenizer (cl100k, or ``--tokenizer PATH``) renders prompts for expectations and counts
output tokens when the server sends no usage. Cache hygiene (:mod:`kvbench.backends.openai.hygiene`)
is applied before expectations are computed; the server's prefix-cache counters are scraped before
and after, and :func:`kvbench.backends.openai.reconcile.reconcile` compares the three opinions.
"""

from __future__ import annotations

import secrets
from dataclasses import replace

from kvbench.backends.openai.hygiene import Hygiene, with_nonce
from kvbench.errors import InputError, checked
from kvbench.request import Request
from kvbench.results.writer import RunWriter
from kvbench.run.execute import (Progress, RunOutcome, api_key, default_out, execute, new_run_id,
                                 prepared_requests, run_metadata)
from kvbench.run.config import DEFAULT_SERVER_BLOCK_SIZE, DEFAULT_TIMEOUT_S, RunConfig
from kvbench.run.checks import requests_note
from kvbench.run.loop import LoadConfig
from kvbench.run.setup import run_section
from kvbench.run.source import load_source


MAX_CONNECTION_FAILURES = 5  # consecutive; then the server is taken as gone and the rest is not sent


def served_model(config: RunConfig, key: str) -> str:
    """``--model`` or the first model the server lists. Raises ``InputError`` when the server lists no
    model, or nothing answers at ``--base-url`` to ask. (With ``--model``, a server that is not there
    fails every request, each recorded as an error row.)"""
    from kvbench.backends.openai.admin import list_models, unreachable

    if config.model.path:
        return config.model.path
    if (problem := unreachable(config.server.url, key)) is not None:
        raise InputError(f"cannot reach the server at {config.server.url}: {problem}")
    models, problem = list_models(config.server.url, key)
    if not models:
        raise InputError(f"--model NAME is needed: {problem or 'the server lists no model'}")
    return models[0]


def apply_hygiene(config: RunConfig, requests: list[Request], tokenizer) -> tuple[list[Request], str | None]:
    """The requests to send and the run's cache_salt, after cache hygiene."""
    mode = config.server.hygiene or Hygiene.SALT
    if mode is Hygiene.SALT:
        return requests, config.salt or secrets.token_hex(32)  # 256 bits, as vLLM's docs advise
    if mode is Hygiene.NONCE:
        requests = with_nonce(requests, secrets.token_hex(8), tokenizer)
    return requests, config.salt


def _load(config: RunConfig, settings, num_requests: int) -> LoadConfig:
    server = config.server
    rate = server.rate_per_s
    concurrency = config.run.concurrency if rate != float("inf") else settings.concurrency
    return LoadConfig(concurrency, rate, server.burstiness or 1.0, server.duration,
                      num_warmup=min(settings.warmup, num_requests), seed=settings.seed,
                      max_connection_failures=MAX_CONNECTION_FAILURES)


def _run_info(config: RunConfig, run_id: str, client_config, load: LoadConfig, expectations,
              tokenizer_name: str) -> dict:
    """The run's metadata: the key's variable name, never the key."""
    return {"run_id": run_id, "backend": "openai", "model": client_config.model, "base_url": client_config.base_url,
            "api_key_env": config.server.key_variable, "tokenizer": tokenizer_name,
            "hygiene": (config.server.hygiene or Hygiene.SALT).value, "timeout_s": client_config.timeout_s,
            "cache": {"enabled": None, "block_size": expectations.block_size,
                      "expected_capacity_blocks": expectations.capacity_blocks},
            "load": {"concurrency": load.concurrency,
                     "request_rate_per_s": load.request_rate_per_s if load.is_open_loop else None,
                     "burstiness": load.burstiness, "duration_s": load.duration_s}}


def run_openai(config: RunConfig, on_progress: Progress | None = None) -> RunOutcome:
    """:func:`kvbench.run.api.run` against an OpenAI-compatible server."""
    from kvbench.backends.openai.admin import fetch_metrics, reset_prefix_cache
    from kvbench.backends.openai.client import OpenAIBackend, OpenAIConfig
    from kvbench.backends.openai.metrics import parse_prefix_cache_counters
    from kvbench.backends.openai.reconcile import expect, reconcile
    from kvbench.workloads.tokenizer import load_tokenizer

    from kvbench.backends.openai.client import check_base_url

    server = config.server
    checked(lambda: check_base_url(server.url))  # before the tokenizer or any request
    tokenizer = load_tokenizer(server.tokenizer)
    source = load_source(config.source, tokenizer, limit=config.run.num_requests)
    settings = run_section(source, config.run)
    key = api_key(server.key_variable)
    model = served_model(config, key)
    requests, run_salt = apply_hygiene(config, prepared_requests(source, settings), tokenizer)
    expectations = expect(requests, server.server_block_size or DEFAULT_SERVER_BLOCK_SIZE, server.expected_cache_size)
    requests = [replace(r, expected_cached_tokens=e) for r, e in zip(requests, expectations.expected_cached_tokens)]
    client_config = checked(lambda: OpenAIConfig(server.url, model, key, server.timeout or DEFAULT_TIMEOUT_S,
                                                 settings.temperature, settings.top_p, settings.seed,
                                                 settings.ignore_eos, expectations.block_size))
    load = checked(lambda: _load(config, settings, len(requests)))
    notes = [reset_prefix_cache(server.url, key)[1]] if server.reset_cache else []
    before = parse_prefix_cache_counters(fetch_metrics(server.url, key))
    run_id = new_run_id(source.name)
    metadata = run_metadata(source, settings, requests, _run_info(config, run_id, client_config, load, expectations,
                                                                  tokenizer.name), config.source, load.num_warmup)
    backend = OpenAIBackend(client_config, tokenizer, run_salt)
    writer = RunWriter(config.out or default_out("run", source.name), metadata, run_id, backend.describe())
    outcome = execute(requests, backend, load, writer, on_progress, backend_context=lambda: backend)
    outcome.notes = notes + requests_note(settings.num_requests, len(source.requests))
    after = parse_prefix_cache_counters(fetch_metrics(server.url, key))
    by_index = {request.index: record for request, record in outcome.records}
    outcome.reconciliation = reconcile(writer.rows, requests, expectations, [by_index.get(r.index) for r in requests],
                                       before, after, ignore_eos=settings.ignore_eos)
    writer.metadata["reconciliation"] = outcome.reconciliation.as_dict()
    writer.close(complete=True)
    return outcome
