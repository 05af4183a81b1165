"""``kvbench run --backend openai``: the plan of a run against any OpenAI-compatible server.

The local tokenizer (cl100k, or ``--tokenizer PATH``) renders prompts for expectations and counts
output tokens when the server sends no usage. Cache hygiene (:mod:`kvbench.backends.openai.hygiene`)
is applied before expectations are computed; the server's prefix-cache counters are scraped before
and after, and :func:`kvbench.backends.openai.reconcile.reconcile` compares the three opinions.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Sequence
from dataclasses import replace
from functools import partial

from kvbench.backends.openai.client_kind import ClientKind
from kvbench.backends.openai.hygiene import Hygiene, with_nonce
from kvbench.errors import InputError, checked
from kvbench.request import NOT_SENT, Request
from kvbench.results.timeline import replay_lag
from kvbench.run.config import DEFAULT_SERVER_BLOCK_SIZE, DEFAULT_TIMEOUT_S, BackendKind, RunConfig, TurnMode
from kvbench.run.execute import (
    OnStatus,
    RunOutcome,
    api_key,
    default_out,
    new_run_id,
    prepared_requests,
    run_metadata,
)
from kvbench.run.fleet_flags import UNKNOWN_MODEL, fleet_expectations, replicas_model, shaped
from kvbench.run.http_metrics import server_state
from kvbench.run.loop import LoadConfig
from kvbench.run.plan import RunPlan, register_backend
from kvbench.run.replica_metrics import record_replica_metrics, scrape_fleet
from kvbench.run.setup import run_section
from kvbench.run.source import load_source
from kvbench.run.trace_replay import replay_plan

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
    if models == [UNKNOWN_MODEL]:  # sglang-router, over workers whose model it could not read
        return replicas_model(config.server, key)
    if not models:
        raise InputError(f"--model NAME is needed: {problem or 'the server lists no model'}")
    return models[0]


def apply_hygiene(
    config: RunConfig, requests: list[Request], tokenizer
) -> tuple[list[Request], str | None, str | None]:
    """The requests to send, the run's cache_salt and its nonce (``--hygiene nonce``, else ``None``)."""
    mode = config.server.hygiene or Hygiene.SALT
    if mode is Hygiene.SALT:
        return requests, config.salt or secrets.token_hex(32), None  # 256 bits, as vLLM's docs advise
    if mode is Hygiene.NONCE:
        nonce = secrets.token_hex(8)
        return with_nonce(requests, nonce, tokenizer), config.salt, nonce
    return requests, config.salt, None


SERVER_TOKENIZER = "server"  # --tokenizer server: the server's /tokenize


def with_run_tokenizer(config: RunConfig, model: str, key: str, tokenizer, source):
    """``(tokenizer, source)`` for the run: the local one as loaded, or with ``--tokenizer server``
    the server's (:class:`kvbench.backends.openai.tokenize.ServerTokenizer`) with every text request
    re-rendered by it, so expectations use the ids the server prefills. Raises ``InputError`` when
    the server has no ``/tokenize``."""
    if tokenizer is not None:
        return tokenizer, source
    from kvbench.backends.openai.tokenize import ServerTokenizer

    tokenizer = ServerTokenizer(config.server.url, model, key)
    requests = [
        replace(
            r,
            token_ids=tokenizer.render_messages(r.messages)
            if r.messages is not None
            else tokenizer.render_prompt(r.prompt),
        )
        if r.has_text
        else r
        for r in source.requests
    ]
    return tokenizer, replace(source, requests=requests)


def run_preflight(
    config: RunConfig, model: str, key: str, tokenizer, settings, requests: Sequence[Request] = ()
) -> tuple[RunConfig, list[str], dict]:
    """The preflight (:mod:`kvbench.backends.openai.preflight`) unless ``--no-preflight``: returns the
    config (nonce hygiene when the server ignored cache_salt under salt hygiene), its note lines and
    its results for the metadata. Raises ``InputError`` when the server lists models but not this one,
    or fails a streamed probe or (when ``requests`` has token-id prompts) a token-id one."""
    import asyncio

    from kvbench.backends.openai.preflight import preflight

    server = config.server
    if not server.preflight:
        return config, ["preflight: skipped (--no-preflight)"], {"skipped": True}
    salt_hygiene = (server.hygiene or Hygiene.SALT) is Hygiene.SALT and config.salt is None
    # vLLM's block size; the fleet flags too, so the probes (one session) stay on one replica behind a
    # router with session affinity
    probe_config = shaped(_client_config(config, model, key, settings), server)
    token_ids = any(r.messages is None and r.prompt is None for r in requests)
    result = asyncio.run(preflight(probe_config, tokenizer, with_salts=salt_hygiene, token_ids=token_ids))
    if result.fatal is not None:
        raise InputError(f"preflight: {result.fatal}")
    notes = result.lines()
    if result.salt_ignored:
        notes.append(
            "[bold red]WARNING: the server ignores cache_salt, or a router in front of it drops it "
            "(sglang-router does): falling back to --hygiene nonce[/bold red]"
        )
        config = replace(config, server=replace(server, hygiene=Hygiene.NONCE))
    return config, notes, result.as_dict()


def live_turns(config: RunConfig, requests: list[Request], tokenizer, server_cache, model: str, key: str):
    """The send loop's turn hook for ``--turns live`` (:class:`kvbench.run.live_turns.LiveTurns`), or
    ``None`` for scripted turns. With a local tokenizer the server's ``/tokenize`` (where it has one)
    gives reply ids the server does not return."""
    if config.server.turns is not TurnMode.LIVE:
        return None
    from kvbench.backends.openai.tokenize import ServerTokenizer
    from kvbench.run.live_turns import LiveTurns, live_cache_config

    reference = None
    if not isinstance(tokenizer, ServerTokenizer):
        with contextlib.suppress(InputError):
            reference = ServerTokenizer(config.server.url, model, key)
    return LiveTurns(
        requests, tokenizer, live_cache_config(server_cache.model, server_cache.block_size), reference
    )


def _as_sent(turns, requests: list[Request], expectations):
    """``(requests, expectations)`` for reconciliation: what live turns really sent and expected."""
    from kvbench.backends.openai.reconcile import Expectations
    from kvbench.sim.replay import prompt_blocks_of

    if turns is None:
        return requests, expectations
    sent = turns.sent_requests(requests)
    return sent, Expectations(
        prompt_blocks_of(sent, expectations.block_size),
        [r.expected_cached_tokens or 0 for r in sent],
        expectations.block_size,
        expectations.capacity_blocks,
        expectations.fleet,
    )


def server_load(config: RunConfig, settings, num_requests: int) -> LoadConfig:
    """The send loop's load against a server: ``--concurrency``, the arrival rate, burstiness and
    ``--duration``, or the trace's own times (``--time-scale``, capped by ``--concurrency``)."""
    server = config.server
    rate = server.rate_per_s
    concurrency = config.run.concurrency if rate != float("inf") else settings.concurrency
    if server.trace_time_scale is not None:  # an open loop at the trace's times; --concurrency caps it
        concurrency = config.run.concurrency
    return LoadConfig(
        concurrency,
        rate,
        server.burstiness or 1.0,
        server.duration,
        num_warmup=min(settings.warmup, num_requests),
        seed=settings.seed,
        time_scale=server.trace_time_scale,
        max_connection_failures=MAX_CONNECTION_FAILURES,
    )


def _run_info(
    config: RunConfig, run_id: str, client_config, load: LoadConfig, expectations, tokenizer_name: str
) -> dict:
    """The run's metadata: the key's variable name, never the key."""
    return {
        "run_id": run_id,
        "backend": "openai",
        "model": client_config.model,
        "base_url": client_config.base_url,
        **(
            {"base_urls": list(config.server.base_urls), "route": config.server.route or "round-robin"}
            if config.server.base_urls
            else {}
        ),
        "api_key_env": config.server.key_variable,
        "tokenizer": tokenizer_name,
        "client": client_config.client.value,
        "hygiene": (config.server.hygiene or Hygiene.SALT).value,
        "timeout_s": client_config.timeout_s,
        "cache": {
            "enabled": None,
            "block_size": expectations.block_size,
            "expected_capacity_blocks": expectations.capacity_blocks,
        },
        "load": {
            "concurrency": load.concurrency,
            "request_rate_per_s": load.request_rate_per_s
            if load.request_rate_per_s != float("inf")
            else None,
            "burstiness": load.burstiness,
            "duration_s": load.duration_s,
            "schedule": "trace" if load.time_scale is not None else "rate",
            "time_scale": load.time_scale,
        },
        "turns": (config.server.turns or TurnMode.SCRIPTED).value,
    }


def _check_body_sizes(backend, requests: list[Request], key: str) -> None:
    """Raise ``InputError`` with the server's own answer when it refuses the largest request's body
    size (:mod:`kvbench.backends.openai.body_limit`; the first endpoint stands for all when routed)."""
    from kvbench.backends.openai.body_limit import oversized_body

    if (problem := oversized_body(getattr(backend, "backends", [backend])[0], requests, key)) is not None:
        raise InputError(problem)


def _finish(outcome: RunOutcome, backend, metrics_before: list, urls, key: str, reconciled) -> bool:
    """After the send loop: the ``/metrics`` delta over the endpoints that answered both times
    (labelled when not all did), ``reconciled(before, after)``, ejected replicas; returns whether
    the run is complete (``False`` when requests were never sent)."""
    from kvbench.backends.openai.admin import fetch_metrics
    from kvbench.backends.openai.metrics import parse_prefix_cache_counters
    from kvbench.run.http_metrics import joined, metrics_scope, scrape

    metrics_after = scrape(fetch_metrics, urls, key)
    both, scope = metrics_scope(metrics_before, metrics_after)
    reconciliation = reconciled(
        parse_prefix_cache_counters(joined(metrics_before, both)),
        parse_prefix_cache_counters(joined(metrics_after, both)),
    )
    outcome.reconciliation = replace(reconciliation, metrics_scope=scope)
    outcome.metadata["reconciliation"] = outcome.reconciliation.as_dict()
    events = getattr(backend, "events", [])
    outcome.notes += events
    outcome.metadata["run"]["ejected_replicas"] = sorted(getattr(backend, "ejected", ()))
    num_unsent = sum(1 for _, record in outcome.records if (record.error or "").startswith(NOT_SENT))
    outcome.metadata["run"]["num_unsent"] = num_unsent
    if num_unsent:
        outcome.notes.append(
            f"{num_unsent} request(s) were never sent (the server stopped answering): "
            "the file is marked incomplete"
        )
    return num_unsent == 0


def _backend(client_config, tokenizer, run_salt: str | None, server):
    """One :class:`OpenAIBackend`, or one per ``--base-url`` behind a client-side router."""
    from kvbench.backends.openai.client import OpenAIBackend
    from kvbench.backends.routed import RoutedBackend

    if not server.base_urls:
        return OpenAIBackend(client_config, tokenizer, run_salt)
    backends = [
        OpenAIBackend(replace(client_config, base_url=url.rstrip("/")), tokenizer, run_salt)
        for url in server.base_urls
    ]
    return RoutedBackend(backends, server.route or "round-robin", client_config.block_size)


def _client_config(
    config: RunConfig, model: str, key: str, settings, block_size: int = DEFAULT_SERVER_BLOCK_SIZE, turns=None
):
    """The HTTP client's settings (``OpenAIConfig``), checked: one line for a bad value; ``turns``
    (live turns) asks the server for the token ids of every reply."""
    from kvbench.backends.openai.client import OpenAIConfig

    server = config.server
    return checked(
        lambda: OpenAIConfig(
            server.url,
            model,
            key,
            server.timeout or DEFAULT_TIMEOUT_S,
            settings.temperature,
            settings.top_p,
            settings.seed,
            settings.ignore_eos,
            block_size,
            {"return_token_ids": True} if turns else {},
            server.client or ClientKind.LEAN,
        )
    )


def _source_and_model(config: RunConfig):
    """``(tokenizer, source, settings, key, model)``: the URL checked before the tokenizer or any
    request, the trace read, the served model named, the run's tokenizer chosen."""
    from kvbench.backends.openai.client import check_base_url
    from kvbench.workloads.tokenizer import load_tokenizer

    server = config.server
    checked(lambda: check_base_url(server.url))  # before the tokenizer or any request
    tokenizer = None if server.tokenizer == SERVER_TOKENIZER else load_tokenizer(server.tokenizer)
    source = load_source(config.source, tokenizer, limit=config.run.num_requests)
    settings = run_section(source, config.run)
    key = api_key(server.key_variable, explicit=server.api_key_env is not None)
    model = served_model(config, key)
    tokenizer, source = with_run_tokenizer(config, model, key, tokenizer, source)
    return tokenizer, source, settings, key, model


def _reconcile(rows, requests, expectations, outcome: RunOutcome, ignore_eos: bool, before, after):
    """Reported vs expected vs ``/metrics`` cached tokens of the requests as sent."""
    from kvbench.backends.openai.reconcile import reconcile

    by_index = {request.index: record for request, record in outcome.records}
    records = [by_index.get(r.index) for r in requests]
    return reconcile(rows, requests, expectations, records, before, after, ignore_eos=ignore_eos)


def _expected(requests: list[Request], server, server_cache, ignore_eos: bool, say: OnStatus):
    """``(requests with their expected cached tokens, expectations, fleet metadata)``: one cache's
    expectation under the server's detected cache, or the fleet's with ``--fleet-policy``."""
    from kvbench.backends.openai.server_cache import server_expectations

    expectations = server_expectations(requests, server_cache, ignore_eos)
    expectations, fleet = fleet_expectations(server, requests, server_cache, expectations, say)
    expected = expectations.expected_cached_tokens
    return [replace(r, expected_cached_tokens=e) for r, e in zip(requests, expected)], expectations, fleet


@register_backend(BackendKind.OPENAI)
def openai_plan(config: RunConfig, say: OnStatus, stack: contextlib.ExitStack) -> RunPlan:
    """The plan of ``config`` against an OpenAI-compatible server (one, or several ``--base-url``
    behind a client-side router): the preflight's and the server cache's lines go to ``say`` when
    they are known; the plan's ``finish`` reconciles reported, expected and ``/metrics`` cached
    tokens.

    Raises:
        InputError: a bad flag, file or server answer (one line).
    """
    from kvbench.run.kv_events import record_kv_events

    server = config.server
    tokenizer, source, settings, key, model = _source_and_model(config)
    config, preflight_lines, checks = run_preflight(config, model, key, tokenizer, settings, source.requests)
    for line in preflight_lines:
        say(line)
    urls = server.base_urls or (server.url,)
    metrics_before, server_cache = server_state(config, urls, key, say)
    fleet_before = scrape_fleet(server, key)  # --replica-metrics, --router-metrics
    requests, run_salt, nonce = apply_hygiene(config, prepared_requests(source, settings), tokenizer)
    requests, expectations, fleet = _expected(requests, server, server_cache, settings.ignore_eos, say)
    turns = live_turns(config, requests, tokenizer, server_cache, model, key)
    client_config = _client_config(config, model, key, settings, expectations.block_size, turns)
    client_config = shaped(client_config, server)  # --header, --session-header, --extra-body
    load = checked(lambda: server_load(config, settings, len(requests)))
    notes = [] if load.time_scale is None else [replay_plan(requests[load.num_warmup :], load.time_scale)]
    run_info = _run_info(config, new_run_id(source.name), client_config, load, expectations, tokenizer.name)
    metadata = run_metadata(source, settings, requests, run_info, config.source, load.num_warmup)
    backend = _backend(client_config, tokenizer, run_salt, server)
    _check_body_sizes(backend, requests, key)
    metadata.update(preflight=checks, server_cache=server_cache.origins)
    metadata.update({"fleet_expectation": fleet} if fleet else {})
    metadata["run"].update({"nonce": nonce} if nonce else {})
    fresh = run_salt is not None and config.salt is None  # a new salt: nothing held before can hit
    events = record_kv_events(server.kv_events, stack, say, metadata, notes, expectations.block_size, fresh)

    def finish(outcome: RunOutcome) -> bool:
        if load.is_open_loop:
            outcome.notes.append(replay_lag(outcome.rows).describe())
        sent, sent_expectations = _as_sent(turns, requests, expectations)
        reconciled = partial(_reconcile, outcome.rows, sent, sent_expectations, outcome, settings.ignore_eos)
        record_replica_metrics(outcome.metadata, outcome, fleet_before, server, key)
        return _finish(outcome, backend, metrics_before, urls, key, reconciled)

    return RunPlan(
        requests,
        backend,
        load,
        config.out or default_out("run", source.name),
        metadata,
        config.summary,
        open_backend=True,
        turns=turns,
        notes=notes,
        **events,
        finish=finish,
        num_asked=settings.num_requests,
        num_source_requests=len(source.requests),
    )
