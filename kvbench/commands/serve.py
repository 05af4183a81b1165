"""``kvbench serve``: the in-process engine behind an OpenAI-compatible HTTP API (FastAPI + uvicorn)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated

import typer

from kvbench.cache.base import CacheConfig, CacheKind, ReleaseOrder
from kvbench.commands import options as opt
from kvbench.commands.choices import CacheSwitch, LogLevel, check_positive
from kvbench.commands.common import Heartbeat, make_console, status_printer
from kvbench.commands.signature import in_panel
from kvbench.errors import InputError, checked
from kvbench.events.wire import Encoding
from kvbench.run.config import EngineFlags, EngineKind

DEFAULT_PORT = 8000  # vLLM's default, so `kvbench run --backend openai` finds it without --base-url


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``port`` 0: any free port). Raises ``InputError``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def _cache_config(
    cache: str,
    kind: CacheKind,
    block_size: int,
    cache_size: str,
    ttl: float | None,
    release: ReleaseOrder,
    bytes_per_block: int,
    prompt_only: bool = False,
) -> CacheConfig | None:
    from kvbench.run.config import CacheFlags
    from kvbench.run.scenario import CacheSection
    from kvbench.run.setup import cache_config, parse_cache_size

    if cache not in ("on", "off"):
        raise InputError(f"--cache must be 'on' or 'off', got {cache!r}")
    if cache == "off":
        return None
    return cache_config(
        CacheSection(),
        CacheFlags(cache_kind=kind, ttl=ttl, release=release, prompt_only=prompt_only),
        parse_cache_size(cache_size, bytes_per_block),
        block_size,
    )


def _guards(host: str, api_key: str | None, max_body_size: str, allowed_hosts: tuple[str, ...]):
    """The request guards from the flags. Raises ``InputError`` naming the flag."""
    from kvbench.memory.layout import parse_bytes
    from kvbench.server.guards import GuardConfig

    try:
        max_body_bytes = parse_bytes(max_body_size)
    except InputError as exc:
        raise InputError(f"--max-body-size: {exc}") from None
    if max_body_bytes <= 0:
        raise InputError(f"--max-body-size {max_body_size}: must be positive")
    if api_key is not None and not api_key.strip():
        raise InputError("--api-key: must not be empty")
    return GuardConfig.for_bind(host, allowed_hosts, max_body_bytes=max_body_bytes, api_key=api_key)


def _check_numbers(port: int, block_size: int, min_cache_tokens: int) -> None:
    """Raise ``InputError`` naming the flag for a port outside 0..65535 or a non-positive size."""
    if not 0 <= port <= 65535:
        raise InputError(f"--port {port}: must be 0..65535")
    if block_size <= 0:
        raise InputError(f"--block-size {block_size}: must be positive")
    if min_cache_tokens < 1:
        raise InputError(f"--min-cache-tokens {min_cache_tokens}: must be positive")


def _limits(max_connections: int | None, header_timeout_s: float, keep_alive_s: float):
    """The connection limits from the flags. Raises ``InputError`` naming the flag."""
    from kvbench.server.connections import ConnectionLimits, connection_cap

    if max_connections is not None and max_connections < 1:
        raise InputError(f"--max-connections {max_connections}: must be positive")
    try:
        cap = connection_cap(max_connections)
    except ValueError as exc:
        raise InputError(f"--max-connections {exc}") from None
    return ConnectionLimits(cap, header_timeout_s, keep_alive_s)


def _announce(sock: socket.socket, name: str, cache_config: CacheConfig | None) -> None:
    """One line with the URL clients use (``--port 0`` shows the port it picked)."""
    bound_host, bound_port = sock.getsockname()[:2]
    shown_host = f"[{bound_host}]" if ":" in bound_host else bound_host
    cache_text = (
        f"cache on ({cache_config.kind.value}, {cache_config.block_size}-token blocks, "
        f"{cache_config.capacity_blocks:,} blocks)"
        if cache_config
        else "cache off"
    )
    console = make_console()
    console.print(
        f"kvbench serve: {name} on http://{shown_host}:{bound_port}/v1 ({cache_text}); Ctrl-C stops",
        soft_wrap=True,
    )
    console.file.flush()


def _service(
    loaded,
    model: Path | None,
    cache_config: CacheConfig | None,
    name: str,
    engine: EngineFlags = EngineFlags(),
    pool: CacheConfig | None = None,
):
    """The engine service: the in-process backend, the model's own tokenizer (cl100k for the default
    model), the cache (``pool``: the paged engine's pool when the cache is off). Each request brings
    its own sampling."""
    from kvbench.run.engines import build_backend
    from kvbench.server.service import EngineService
    from kvbench.workloads.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(model) if model is not None else None)
    return EngineService(build_backend(loaded, engine, cache_config, pool, name=name), tokenizer)


def serve(
    host: Annotated[
        str,
        typer.Option(
            rich_help_panel="Server", help="Address to bind (loopback by default; 0.0.0.0 exposes it)."
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(rich_help_panel="Server", help="TCP port; 0 picks a free one (printed at start).")
    ] = DEFAULT_PORT,
    model: Annotated[
        Path | None,
        typer.Option(
            rich_help_panel="Model",
            help="Local Hugging Face checkpoint (default: the built-in random Llama).",
        ),
    ] = None,
    served_model_name: Annotated[
        str | None,
        typer.Option(rich_help_panel="Model", help="Model name clients send (default: the model's)."),
    ] = None,
    device: in_panel("Model", opt.Device) = "cpu",
    dtype: in_panel("Model", opt.DTypeName) = "float32",
    cache: Annotated[
        CacheSwitch, typer.Option(rich_help_panel="Cache", help="Prefix cache on or off.")
    ] = CacheSwitch.ON,
    cache_kind: Annotated[
        CacheKind, typer.Option(rich_help_panel="Cache", help="Cache structure.")
    ] = CacheKind.HASH,
    block_size: Annotated[
        int, typer.Option(rich_help_panel="Cache", min=1, help="Tokens per block (vLLM's default).")
    ] = 16,
    cache_size: Annotated[
        str, typer.Option(rich_help_panel="Cache", help="Capacity in blocks (4096) or bytes (2GiB).")
    ] = "1GiB",
    ttl: Annotated[
        float | None,
        typer.Option(
            rich_help_panel="Cache",
            callback=check_positive,
            help="Expire blocks idle longer than this (s, > 0).",
        ),
    ] = None,
    release: Annotated[
        ReleaseOrder, typer.Option(rich_help_panel="Cache", help="Free-list release order.")
    ] = ReleaseOrder.TAIL_FIRST,
    prompt_only: in_panel("Cache", opt.PromptOnly) = False,
    log_level: Annotated[
        LogLevel, typer.Option(rich_help_panel="Server", help="uvicorn log level (info shows every request).")
    ] = LogLevel.WARNING,
    threads: in_panel("Server", opt.Threads) = None,
    min_cache_tokens: Annotated[
        int,
        typer.Option(
            rich_help_panel="Server",
            help="/v1/messages: shortest prefix reported as cached (Anthropic's minimum).",
        ),
    ] = 1024,
    api_key: Annotated[
        str | None,
        typer.Option(
            rich_help_panel="Server",
            envvar="KVBENCH_API_KEY",
            show_envvar=True,
            help="Require 'Authorization: Bearer KEY' on every route but /health (as vllm serve --api-key).",
        ),
    ] = None,
    max_body_size: Annotated[
        str, typer.Option(rich_help_panel="Server", help="Largest request body (413 above it), e.g. 32MiB.")
    ] = "32MiB",
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            rich_help_panel="Server",
            help="Host header value to accept (repeatable; '*' = any). Default: the bound address (plus "
            "localhost on loopback); any for 0.0.0.0.",
        ),
    ] = None,
    engine: Annotated[
        EngineKind,
        typer.Option(
            rich_help_panel="Engine",
            help="copy: one request at a time; paged: continuous batching over one KV pool.",
        ),
    ] = EngineKind.COPY,
    max_num_seqs: Annotated[
        int | None,
        typer.Option(rich_help_panel="Engine", help="paged: most sequences per step (default 256)."),
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None, typer.Option(rich_help_panel="Engine", help="paged: most tokens per step (default 8192).")
    ] = None,
    host_tier: Annotated[
        str | None,
        typer.Option(
            rich_help_panel="Engine",
            help="paged: a host KV tier below the pool, blocks or bytes (write-through; misses loaded back).",
        ),
    ] = None,
    max_connections: Annotated[
        int | None,
        typer.Option(
            rich_help_panel="Server",
            help="Most open connections; at the cap a new one closes the oldest idle one (default 1024, "
            "below ulimit -n).",
        ),
    ] = None,
    header_timeout: Annotated[
        float,
        typer.Option(
            rich_help_panel="Server",
            callback=check_positive,
            help="Close a connection that sent no whole request head within this many seconds.",
        ),
    ] = 10.0,
    keep_alive_timeout: Annotated[
        float,
        typer.Option(
            rich_help_panel="Server",
            callback=check_positive,
            help="Close a keep-alive connection idle this many seconds.",
        ),
    ] = 5.0,
    kv_events: Annotated[
        str | None,
        typer.Option(
            rich_help_panel="KV events",
            help="Publish every block the cache stores or drops, in vLLM's format: tcp://HOST:PORT (replay "
            "socket on PORT+1; 0 = free ports) or vLLM's --kv-events-config JSON.",
        ),
    ] = None,
    kv_events_encoding: Annotated[
        Encoding,
        typer.Option(
            rich_help_panel="KV events", help="tagged: events as maps (vLLM now); positional: arrays (older)."
        ),
    ] = Encoding.TAGGED,
) -> None:
    """Serve the in-process engine as an OpenAI-compatible API (/v1/completions, /v1/chat/completions,
    /v1/models, /health, /reset_prefix_cache, /metrics, /tokenize, /detokenize) and Anthropic's /v1/messages
    until Ctrl-C. With --engine copy one
    request runs at a time; the others queue, and their wait shows in the clients' TTFT. With
    --engine paged concurrent requests are batched (continuous batching over one KV pool)."""
    import uvicorn

    from kvbench.engine.model import ModelConfig, resolve_device
    from kvbench.engine.threads import check_threads, chosen_threads
    from kvbench.server.app import create_app
    from kvbench.server.connections import server_config

    _check_numbers(port, block_size, min_cache_tokens)
    check_threads(threads)
    model_config = checked(lambda: ModelConfig(path=model, device=device, dtype=dtype))
    resolve_device(model_config.device)  # no such GPU: one line, before the port is bound
    guards = _guards(host, api_key, max_body_size, tuple(allowed_host or ()))
    limits = _limits(max_connections, header_timeout, keep_alive_timeout)
    sock = bind_socket(host, port)  # before the model loads: a busy port fails at once
    with chosen_threads(threads, status_printer(make_console(stderr=True))):
        loaded = _load_announced(model_config)
        cache_config = _cache_config(
            cache.value,
            cache_kind,
            block_size,
            cache_size,
            ttl,
            release,
            loaded.kv_layout(block_size).bytes_per_block,
            prompt_only,
        )
        engine_flags = checked(
            lambda: EngineFlags(engine, max_num_seqs, max_num_batched_tokens, host_tier=host_tier)
        )
        pool = (
            _cache_config(
                "on",
                cache_kind,
                block_size,
                cache_size,
                ttl,
                release,
                loaded.kv_layout(block_size).bytes_per_block,
                prompt_only,
            )
            if engine.spec.has_kv_pool  # it holds the running sequences even with the cache off
            else None
        )
        service = _service(loaded, model, cache_config, served_model_name or loaded.name, engine_flags, pool)
        app = create_app(service, guards, min_cache_tokens)
        publisher = _kv_events(app, service, kv_events, kv_events_encoding, host)
        _announce(sock, service.model_name, cache_config)
        try:
            uvicorn.Server(server_config(app, log_level.value, limits)).run(sockets=[sock])
        finally:
            if publisher is not None:
                publisher.close()


def _kv_events(app, service, value: str | None, encoding, host: str):
    """With ``--kv-events``: the started publisher, its routes added to ``app``; else ``None``."""
    if value is None:
        return None
    from kvbench.events.publisher import parse_kv_events
    from kvbench.server.event_routes import add_event_routes, start_publisher

    publisher = start_publisher(service, parse_kv_events(value, encoding))
    add_event_routes(app, service, publisher, host)
    make_console(stderr=True).print(f"kv events: {publisher.endpoint} (replay {publisher.replay_endpoint})")
    return publisher


def _load_announced(model_config):
    """The model, with a status line before it loads and, outside a terminal, a heartbeat while it does."""
    from kvbench.engine.model import load_model
    from kvbench.run.execute import loading_line

    err = make_console(stderr=True)
    status_printer(err)(
        loading_line(str(model_config.path) if model_config.path else None, model_config.device)
    )
    with Heartbeat(err) as heartbeat:
        heartbeat.set("loading the model")
        return load_model(model_config)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
