"""``kvbench run --backend anthropic``: a chat trace against an Anthropic Messages endpoint (the
hosted API, or ``kvbench serve``'s ``/v1/messages``) through the official SDK.

Uses the OpenAI backend's server flags where they apply: ``--base-url`` (the root; a trailing
``/v1`` is dropped, the SDK adds ``/v1/messages``), ``--api-key-env`` (default
``ANTHROPIC_API_KEY``), ``--model`` (required: the Messages API has no model listing here),
``--timeout``, ``--concurrency``, ``--request-rate``/``--burstiness``/``--duration``. Cache hygiene
and reconciliation are OpenAI-server features and are not applied.
"""

from __future__ import annotations

from kvbench.errors import InputError, checked
from kvbench.extras import install_command
from kvbench.results.writer import RunWriter
from kvbench.run.api_openai import _load
from kvbench.run.config import DEFAULT_SERVER_BLOCK_SIZE, DEFAULT_TIMEOUT_S, RunConfig
from kvbench.run.execute import (
    OnStatus,
    Progress,
    RunOutcome,
    api_key,
    default_out,
    execute,
    new_run_id,
    prepared_requests,
    run_metadata,
)
from kvbench.run.setup import run_section
from kvbench.run.source import load_source

KEY_VARIABLE = "ANTHROPIC_API_KEY"


def anthropic_root(url: str) -> str:
    """``url`` without a trailing ``/v1`` (the SDK appends ``/v1/messages``)."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def run_anthropic(
    config: RunConfig, on_progress: Progress | None = None, on_status: OnStatus | None = None
) -> RunOutcome:
    """:func:`kvbench.run.api.run` against an Anthropic Messages endpoint (no status lines of its own:
    ``on_status`` is accepted for the one signature).

    Raises:
        InputError: no ``--model``, a token-id trace, or a bad flag.
    """
    from kvbench.workloads.tokenizer import load_tokenizer

    del on_status
    try:
        from kvbench.backends.anthropic import AnthropicBackend, AnthropicConfig
    except ModuleNotFoundError as exc:
        raise InputError(
            f"--backend anthropic needs the anthropic package, a core dependency ({exc}); "
            f"reinstall from a checkout: {install_command(None)}"
        ) from None

    server = config.server
    if server.base_urls:
        raise InputError("several --base-url endpoints (client-side routing) are for --backend openai")
    if not config.model.path:
        raise InputError("--model NAME is needed with --backend anthropic (e.g. claude-sonnet-4-5)")
    source = load_source(config.source, load_tokenizer(server.tokenizer), limit=config.run.num_requests)
    settings = run_section(source, config.run)
    requests = prepared_requests(source, settings)
    if requests and requests[0].messages is None:
        raise InputError(
            f"{config.source}: --backend anthropic sends chat messages; this source has token ids only"
        )
    variable = server.api_key_env or KEY_VARIABLE
    client_config = checked(
        lambda: AnthropicConfig(
            anthropic_root(server.url),
            config.model.path,
            api_key(variable, explicit=server.api_key_env is not None),
            server.timeout or DEFAULT_TIMEOUT_S,
            settings.temperature,
            None if settings.top_p == 1.0 else settings.top_p,
            server.server_block_size or DEFAULT_SERVER_BLOCK_SIZE,
        )
    )
    load = checked(lambda: _load(config, settings, len(requests)))
    run_id = new_run_id(source.name)
    run_info = {
        "run_id": run_id,
        "backend": "anthropic",
        "model": client_config.model,
        "base_url": client_config.base_url,
        "api_key_env": variable,
        "timeout_s": client_config.timeout_s,
        "cache": {"enabled": None, "breakpoints": "system, last stable turn"},
    }
    metadata = run_metadata(source, settings, requests, run_info, config.source, load.num_warmup)
    backend = AnthropicBackend(client_config)
    writer = RunWriter(config.out or default_out("run", source.name), metadata, run_id, backend.describe())
    outcome = execute(requests, backend, load, writer, on_progress, backend_context=lambda: backend)
    writer.close(complete=True)
    return outcome
