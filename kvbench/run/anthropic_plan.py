"""``kvbench run --backend anthropic``: the plan of a chat trace against an Anthropic Messages
endpoint (the hosted API, or ``kvbench serve``'s ``/v1/messages``) through the official SDK.

Uses the OpenAI backend's server flags where they apply: ``--base-url`` (the root; a trailing
``/v1`` is dropped, the SDK adds ``/v1/messages``), ``--api-key-env`` (default
``ANTHROPIC_API_KEY``), ``--model`` (required: the Messages API has no model listing here),
``--timeout``, ``--concurrency``, ``--request-rate``/``--burstiness``/``--duration``. Cache hygiene
and reconciliation are OpenAI-server features and are not applied.
"""

from __future__ import annotations

import contextlib

from kvbench.errors import InputError, checked
from kvbench.extras import install_command
from kvbench.run.config import DEFAULT_SERVER_BLOCK_SIZE, DEFAULT_TIMEOUT_S, BackendKind, RunConfig
from kvbench.run.execute import OnStatus, api_key, default_out, new_run_id, prepared_requests, run_metadata
from kvbench.run.openai_plan import server_load
from kvbench.run.plan import RunPlan, register_backend
from kvbench.run.setup import run_section
from kvbench.run.source import load_source

KEY_VARIABLE = "ANTHROPIC_API_KEY"


def anthropic_root(url: str) -> str:
    """``url`` without a trailing ``/v1`` (the SDK appends ``/v1/messages``)."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _checked_flags(config: RunConfig):
    """``(AnthropicBackend, AnthropicConfig)`` once the SDK imports and the flags fit this backend."""
    try:
        from kvbench.backends.anthropic import AnthropicBackend, AnthropicConfig
    except ModuleNotFoundError as exc:
        raise InputError(
            f"--backend anthropic needs the anthropic package, a core dependency ({exc}); "
            f"reinstall from a checkout: {install_command(None)}"
        ) from None
    if config.server.base_urls:
        raise InputError("several --base-url endpoints (client-side routing) are for --backend openai")
    if not config.model.path:
        raise InputError("--model NAME is needed with --backend anthropic (e.g. claude-sonnet-4-5)")
    return AnthropicBackend, AnthropicConfig


@register_backend(BackendKind.ANTHROPIC)
def anthropic_plan(config: RunConfig, say: OnStatus, stack: contextlib.ExitStack) -> RunPlan:
    """The plan of ``config`` against an Anthropic Messages endpoint (no status lines of its own).

    Raises:
        InputError: no ``--model``, a token-id trace, or a bad flag.
    """
    from kvbench.workloads.tokenizer import load_tokenizer

    del say, stack
    AnthropicBackend, AnthropicConfig = _checked_flags(config)
    server = config.server
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
    load = checked(lambda: server_load(config, settings, len(requests)))
    run_info = {
        "run_id": new_run_id(source.name),
        "backend": "anthropic",
        "model": client_config.model,
        "base_url": client_config.base_url,
        "api_key_env": variable,
        "timeout_s": client_config.timeout_s,
        "cache": {"enabled": None, "breakpoints": "system, last stable turn"},
    }
    return RunPlan(
        requests,
        AnthropicBackend(client_config),
        load,
        config.out or default_out("run", source.name),
        run_metadata(source, settings, requests, run_info, config.source, load.num_warmup),
        config.summary,
        open_backend=True,
        num_asked=settings.num_requests,
        num_source_requests=len(source.requests),
    )
