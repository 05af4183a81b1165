"""``kvbench serve``: the in-process engine behind an OpenAI-compatible HTTP API (FastAPI + uvicorn)."""

from __future__ import annotations

import socket
from pathlib import Path

import typer

from kvbench.cache.base import CacheConfig, CacheKind, ReleaseOrder
from kvbench.commands import options as opt
from kvbench.commands.choices import CacheSwitch, LogLevel, check_positive, positive_bytes
from kvbench.commands.common import Heartbeat, make_console, status_printer
from kvbench.commands.signature import in_panel, option
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
    from kvbench.server.guards import GuardConfig

    max_body_bytes = positive_bytes(max_body_size, "--max-body-size", must="positive")
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


def _limits(max_connections: int | None, header_timeout_s: float, keep_alive_s: float, body_timeout_s: float):
    """The connection limits from the flags. Raises ``InputError`` naming the flag."""
    from kvbench.server.connections import ConnectionLimits, connection_cap

    if max_connections is not None and max_connections < 1:
        raise InputError(f"--max-connections {max_connections}: must be positive")
    try:
        cap = connection_cap(max_connections)
    except ValueError as exc:
        raise InputError(f"--max-connections {exc}") from None
    return ConnectionLimits(cap, header_timeout_s, keep_alive_s, body_timeout_s)


def bound_name(sock: socket.socket) -> str:
    """``host:port`` of the bound socket (the port ``--port 0`` picked): the default replica id."""
    bound_host, bound_port = sock.getsockname()[:2]
    return f"[{bound_host}]:{bound_port}" if ":" in bound_host else f"{bound_host}:{bound_port}"


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
    host: option(
        str, "Address to bind (loopback by default; 0.0.0.0 exposes it).", panel="Server"
    ) = "127.0.0.1",
    port: option(int, "TCP port; 0 picks a free one (printed at start).", panel="Server") = DEFAULT_PORT,
    model: option(
        Path | None, "Local Hugging Face checkpoint (default: the built-in random Llama).", panel="Model"
    ) = None,
    served_model_name: option(
        str | None, "Model name clients send (default: the model's).", panel="Model"
    ) = None,
    device: in_panel("Model", opt.Device) = "cpu",
    dtype: in_panel("Model", opt.DTypeName) = "float32",
    cache: option(CacheSwitch, "Prefix cache on or off.", panel="Cache") = CacheSwitch.ON,
    cache_kind: option(CacheKind, "Cache structure.", panel="Cache") = CacheKind.HASH,
    block_size: option(int, "Tokens per block (vLLM's default).", panel="Cache", min=1) = 16,
    cache_size: option(str, "Capacity in blocks (4096) or bytes (2GiB).", panel="Cache") = "1GiB",
    ttl: option(
        float | None, "Expire blocks idle longer than this (s, > 0).", panel="Cache", callback=check_positive
    ) = None,
    release: option(ReleaseOrder, "Free-list release order.", panel="Cache") = ReleaseOrder.TAIL_FIRST,
    prompt_only: in_panel("Cache", opt.PromptOnly) = False,
    log_level: option(
        LogLevel, "uvicorn log level (info shows every request).", panel="Server"
    ) = LogLevel.WARNING,
    threads: in_panel("Server", opt.Threads) = None,
    min_cache_tokens: option(
        int, "/v1/messages: shortest prefix reported as cached (Anthropic's minimum).", panel="Server"
    ) = 1024,
    api_key: option(
        str | None,
        "Require 'Authorization: Bearer KEY' (as vllm serve --api-key) or Anthropic's 'x-api-key: KEY' on "
        "every route but /health.",
        panel="Server",
        envvar="KVBENCH_API_KEY",
        show_envvar=True,
    ) = None,
    max_body_size: option(str, "Largest request body (413 above it), e.g. 32MiB.", panel="Server") = "32MiB",
    allowed_host: option(
        list[str] | None,
        "Host header value to accept (repeatable; '*' = any). Default: the bound address (plus "
        "localhost on loopback); any for 0.0.0.0.",
        panel="Server",
    ) = None,
    engine: option(
        EngineKind,
        "copy: one request at a time; paged: continuous batching over one KV pool.",
        panel="Engine",
    ) = EngineKind.COPY,
    max_num_seqs: option(int | None, "paged: most sequences per step (default 256).", panel="Engine") = None,
    max_num_batched_tokens: option(
        int | None, "paged: most tokens per step (default 8192).", panel="Engine"
    ) = None,
    host_tier: option(
        str | None,
        "paged: a host KV tier below the pool, blocks or bytes (write-through; misses loaded back).",
        panel="Engine",
    ) = None,
    max_connections: option(
        int | None,
        "Most open connections; at the cap a new one closes the oldest idle one (default 1024, "
        "below ulimit -n).",
        panel="Server",
    ) = None,
    header_timeout: option(
        float,
        "Close a connection that sent no whole request head within this many seconds.",
        panel="Server",
        callback=check_positive,
    ) = 10.0,
    keep_alive_timeout: option(
        float,
        "Close a keep-alive connection idle this many seconds.",
        panel="Server",
        callback=check_positive,
    ) = 5.0,
    replica_id: option(
        str | None,
        "This replica's name in the X-Kvbench-Replica header of every response (default: "
        "host:port), so a client behind a router sees which replica served it.",
        panel="Server",
    ) = None,
    body_timeout: option(
        float,
        "Close a connection whose request body sent no byte for this many seconds.",
        panel="Server",
        callback=check_positive,
    ) = 10.0,
    kv_events: option(
        str | None,
        "Publish every block the cache stores or drops, in vLLM's format: tcp://HOST:PORT (replay "
        "socket on PORT+1; 0 = free ports) or vLLM's --kv-events-config JSON.",
        panel="KV events",
    ) = None,
    kv_events_encoding: option(
        Encoding, "tagged: events as maps (vLLM now); positional: arrays (older).", panel="KV events"
    ) = Encoding.TAGGED,
) -> None:
    """Serve the in-process engine as an OpenAI-compatible and Anthropic Messages API until Ctrl-C.

    Endpoints: /v1/completions, /v1/chat/completions, /v1/models, /health, /reset_prefix_cache,
    /metrics, /tokenize, /detokenize and Anthropic's /v1/messages. With --engine copy one request runs
    at a time; the others queue, and their wait shows in the clients' TTFT. With --engine paged
    concurrent requests are batched (continuous batching over one KV pool)."""
    import uvicorn  # noqa: F401  (first: without the [serve] extra, that extra is the one named)

    from kvbench.engine.model import ModelConfig, resolve_device
    from kvbench.engine.threads import check_threads, chosen_threads
    from kvbench.run.checks import check_host_tier_text
    from kvbench.server.app import create_app
    from kvbench.server.connections import server_config
    from kvbench.server.fleet import check_replica_id
    from kvbench.server.stopping import StoppingServer

    _check_numbers(port, block_size, min_cache_tokens)
    check_threads(threads)
    model_config = checked(lambda: ModelConfig(path=model, device=device, dtype=dtype))
    resolve_device(model_config.device)  # no such GPU: one line, before the port is bound
    guards = _guards(host, api_key, max_body_size, tuple(allowed_host or ()))
    limits = _limits(max_connections, header_timeout, keep_alive_timeout, body_timeout)
    check_host_tier_text(host_tier)  # before the model loads: a bad or too-large size fails at once
    if replica_id is not None:
        replica_id = checked(lambda: check_replica_id(replica_id))
    sock = bind_socket(host, port)  # before the model loads: a busy port fails at once
    with chosen_threads(threads, status_printer(make_console(stderr=True))):
        loaded = _load_announced(model_config)
        bytes_per_block = loaded.kv_layout(block_size).bytes_per_block
        cache_config, pool = (
            _cache_config(
                switch, cache_kind, block_size, cache_size, ttl, release, bytes_per_block, prompt_only
            )
            # the paged engine's pool holds the running sequences even with the cache off
            for switch in (cache.value, "on" if engine.spec.has_kv_pool else "off")
        )
        engine_flags = checked(
            lambda: EngineFlags(engine, max_num_seqs, max_num_batched_tokens, host_tier=host_tier)
        )
        service = _service(loaded, model, cache_config, served_model_name or loaded.name, engine_flags, pool)
        app = create_app(service, guards, min_cache_tokens, replica_id or bound_name(sock))
        publisher = _kv_events(app, service, kv_events, kv_events_encoding, host)
        _announce(sock, service.model_name, cache_config)
        config = server_config(app, log_level.value, limits)
        try:
            StoppingServer(config, service, _say_stopping).run(sockets=[sock])
        finally:
            if publisher is not None:
                publisher.close()


def _say_stopping(signal_name: str, num_requests: int) -> None:
    """The one line when the server stops: which signal, and how many requests it ended."""
    ended = f"ending {num_requests} request{'' if num_requests == 1 else 's'} in flight"
    err = make_console(stderr=True)
    err.print(f"kvbench serve: {signal_name}: stopping, {ended}", soft_wrap=True)
    err.file.flush()


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
