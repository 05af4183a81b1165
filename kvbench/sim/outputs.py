"""Generated tokens in a cache-only replay: which output ids each request is taken to produce.

An engine that caches generated blocks (``CacheConfig.prompt_only`` off, the default; vLLM v1 does
the same) stores every full block of prompt + output - 1 tokens: the last sampled token is never fed
forward, so it has no KV. A replay that must agree with it needs each request's output ids. Three
sources, best first:

* :func:`record_outputs`: the ids a run really generated (``RequestRecord.output_token_ids``);
* :func:`trace_outputs`: a trace's own replies: when the session's next turn resends this prompt
  followed by more tokens, those tokens (up to the request's output length) are what a server that
  produced the trace's reply would have generated;
* :func:`placeholder_outputs`: ids that no prompt can contain (``>= 2**31``; every vocabulary is far
  smaller), one run per distinct prompt, of the request's ``output_tokens`` or ``max_tokens``. They
  take exactly the capacity the engine's generated blocks take (exact under ``ignore_eos``, the
  default of ``kvbench run``), never hit a later prompt, and are equal for equal prompts (a greedy
  engine generates equal outputs for equal prompts).

:func:`stored_blocks_of` turns prompts and outputs into the blocks each request stores.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from kvbench.cache.block_hash import BlockHasher, HashConfig, PromptBlocks
from kvbench.request import Request, RequestRecord

Outputs = Sequence[Sequence[int] | np.ndarray | None]  # per request; None = nothing generated known
PLACEHOLDER_BASE = 2**31  # above every real vocabulary, below the 2**32 the block encoding allows


def output_length(request: Request) -> int:
    """Tokens the request generates: its ``output_tokens`` when known, else ``max_tokens``."""
    return request.output_tokens or request.max_tokens


def placeholder_outputs(requests: Sequence[Request]) -> list[np.ndarray]:
    """Per request, ``output_length`` ids ``>= 2**31`` derived from the prompt's bytes (module docstring)."""
    outputs = []
    for request in requests:
        digest = hashlib.sha256(np.ascontiguousarray(request.token_ids, dtype="<u4").tobytes()).digest()
        first = PLACEHOLDER_BASE + (int.from_bytes(digest[:4], "little") & (2**31 - 2**20))
        outputs.append(np.arange(first, first + output_length(request), dtype=np.uint32))
    return outputs


def trace_outputs(requests: Sequence[Request]) -> list[np.ndarray | None]:
    """Per request, the tokens its session's next turn adds right after its prompt (at most
    ``output_length``), or ``None`` when no later turn extends it (then nothing is known)."""
    by_turn = {(r.session_id, r.turn): r for r in requests}
    outputs: list[np.ndarray | None] = []
    for request in requests:
        later = by_turn.get((request.session_id, request.turn + 1))
        prompt = request.token_ids
        if (
            later is None
            or later.num_tokens <= prompt.shape[0]
            or not np.array_equal(later.token_ids[: prompt.shape[0]], prompt)
        ):
            outputs.append(None)
            continue
        outputs.append(later.token_ids[prompt.shape[0] : prompt.shape[0] + output_length(request)])
    return outputs


def record_outputs(records: Sequence[RequestRecord]) -> list[np.ndarray | None]:
    """The output ids each record carries (``None`` for a failed request)."""
    return [np.asarray(r.output_token_ids, dtype=np.uint32) if r.output_token_ids else None for r in records]


def stored_blocks_of(
    requests: Sequence[Request],
    outputs: Outputs,
    block_size: int,
    hash_config: HashConfig = HashConfig(),
    keep_tokens: bool = False,
) -> list[PromptBlocks]:
    """Per request, the blocks an engine stores: every full block of prompt + output - 1 tokens
    (the prompt's alone where the output is ``None`` or one token), salt ``None`` = ``""``.

    Raises:
        ValueError: ``outputs`` and ``requests`` differ in length.
    """
    if len(outputs) != len(requests):
        raise ValueError(f"got {len(outputs)} outputs for {len(requests)} requests")
    hasher = BlockHasher(block_size, hash_config)
    return [stored_blocks(hasher, request, output, keep_tokens) for request, output in zip(requests, outputs)]


def stored_blocks(
    hasher: BlockHasher,
    request: Request,
    output: Sequence[int] | np.ndarray | None,
    keep_tokens: bool = False,
) -> PromptBlocks:
    """The blocks one request stores (:func:`stored_blocks_of`, one request): every full block of
    prompt + output - 1 tokens, the prompt's alone where ``output`` is ``None`` or one token."""
    ids = request.token_ids
    if output is not None and len(output) > 1:
        ids = np.concatenate([ids.astype(np.uint32), np.asarray(output, dtype=np.uint32)[:-1]])
    return hasher.prompt_blocks(ids, salt=request.salt or "", keep_tokens=keep_tokens)


def known_outputs(requests: Sequence[Request], outputs: Outputs | None) -> list:
    """``outputs`` with every unknown (``None``) entry, or all of them, replaced by a placeholder.

    Raises:
        ValueError: ``outputs`` and ``requests`` differ in length.
    """
    if outputs is not None and len(outputs) != len(requests):
        raise ValueError(f"got {len(outputs)} outputs for {len(requests)} requests")
    placeholders = placeholder_outputs(requests)
    if outputs is None:
        return placeholders
    return [given if given is not None else placeholder for given, placeholder in zip(outputs, placeholders)]
