"""Worst-case reservation vs paged blocks: the replay's requests, settings and results.

:func:`kvbench.memory.replay.replay_waste` replays a trace through both allocators over one
pool under the rules below.

The model of time (``WasteConfig``): the clock advances in decode steps of ``1000 / decode_tok_s``
ms, and every running sequence emits one token per step (continuous batching at a fixed per-sequence
decode rate). Prefill is instant. A sequence admitted at step ``a`` with ``k`` tokens already
generated holds ``prompt + k + j`` tokens of KV at step ``a + j``, emits token ``k + j + 1`` then,
and is released at step ``a + output - k`` (the last token's own KV is never written). Arrivals are
rounded up to the next step. At each step: finished sequences release, running sequences grow
(oldest first), arrivals join the FIFO queue, and the queue's head is admitted while it fits
(head-of-line blocking, no skipping ahead).

* contiguous: admission takes a slab of ``reservation_tokens`` (see :class:`Reservation`) first-fit;
  a running sequence never needs more.
* paged: admission takes ``ceil((prompt + k) / block_size)`` blocks; a sequence takes one more block
  as it crosses each block boundary. When none is free, the newest running sequence is preempted and
  goes back to the *front* of the queue keeping its generated tokens; on readmission all of
  ``prompt + k`` tokens are prefilled again (vLLM's default preemption by recompute). A step that
  preempted admits nobody (as vLLM's scheduler), which keeps the victim from bouncing straight back.

Each request arrives at its trace time: a multi-turn session's next turn is not held back until
the previous turn finished (the trace's arrival times already include think time).

Requests longer than the model allows (``prompt + max_tokens``, or ``prompt + output`` when
``max_tokens`` is unknown, over ``max_model_len``) are refused for both allocators, as a server
would; a request that could never fit the pool even alone is refused by that allocator only.
Sources: Kwon et al., "Efficient Memory Management for Large Language Model Serving with
PagedAttention", SOSP'23 (figure 2: 20.4-38.2% of KV memory holds token states in Orca and
FasterTransformer); the vLLM launch post (blog.vllm.ai, 2023-06-20: "a mere waste of under 4%").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np


class Reservation(str, Enum):
    """How much a contiguous allocator reserves per request (the vLLM paper's Orca baselines).

    ``max-tokens``: prompt + the request's ``max_tokens`` (when the trace has none, vLLM's default,
    ``max_model_len - prompt``). ``max-model-len``: the model's whole context ("Orca (Max)").
    ``actual``: prompt + the real output length ("Orca (Oracle)"): no over-reservation at all,
    which leaves external fragmentation as the only loss.
    """

    MAX_TOKENS = "max-tokens"
    MAX_MODEL_LEN = "max-model-len"
    ACTUAL = "actual"


@dataclass(frozen=True)
class WasteRequest:
    """One request as the replay sees it.

    Attributes:
        request_id: the trace's id (or line number).
        arrival_ms: arrival offset from the trace start, ms; >= 0.
        prompt_tokens: prompt length, tokens; >= 1.
        output_tokens: tokens it actually generates; >= 1.
        max_tokens: the most it was allowed to generate (>= output_tokens), or ``None`` if unknown.
    """

    request_id: str
    arrival_ms: float
    prompt_tokens: int
    output_tokens: int
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not (self.arrival_ms >= 0 and math.isfinite(self.arrival_ms)):
            raise ValueError(f"arrival_ms must be a finite number >= 0, got {self.arrival_ms!r}")
        for name in ("prompt_tokens", "output_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.max_tokens is not None and not (
            isinstance(self.max_tokens, int) and self.max_tokens >= self.output_tokens
        ):
            raise ValueError(
                f"max_tokens must be >= output_tokens ({self.output_tokens}), got {self.max_tokens!r}"
            )


@dataclass(frozen=True)
class WasteConfig:
    """One replay's pool, layout and timing.

    Attributes:
        pool_bytes: KV memory shared by all requests; positive.
        bytes_per_token: KV bytes per token (``KvLayout.bytes_per_token``); positive.
        block_size: tokens per block of the paged allocator.
        decode_tok_s: tokens per second each running sequence emits (kvbench's default model decodes
            ~20 tok/s on 2 CPU cores, DESIGN.md).
        reserve: what a contiguous slab holds, see :class:`Reservation`.
        max_model_len: the model's context length, tokens.
    """

    pool_bytes: int
    bytes_per_token: int
    block_size: int = 16  # vLLM's default block size
    decode_tok_s: float = 20.0  # the default model's CPU decode rate
    reserve: Reservation = Reservation.MAX_TOKENS
    max_model_len: int = 8192  # the default model's context

    def __post_init__(self) -> None:
        object.__setattr__(self, "reserve", Reservation(self.reserve))
        for name in ("pool_bytes", "bytes_per_token", "block_size", "max_model_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not (self.decode_tok_s > 0 and math.isfinite(self.decode_tok_s)):
            raise ValueError(f"decode_tok_s must be a positive number, got {self.decode_tok_s!r}")
        if self.num_blocks < 1:
            raise ValueError(
                f"a pool of {self.pool_bytes} bytes holds no block of "
                f"{self.block_size * self.bytes_per_token} bytes"
            )

    @property
    def step_ms(self) -> float:
        return 1000.0 / self.decode_tok_s

    @property
    def pool_tokens(self) -> int:
        return self.pool_bytes // self.bytes_per_token

    @property
    def num_blocks(self) -> int:
        return self.pool_bytes // (self.block_size * self.bytes_per_token)

    def reservation_tokens(self, request: WasteRequest) -> int:
        """The contiguous slab for ``request``, tokens."""
        if self.reserve is Reservation.MAX_MODEL_LEN:
            return self.max_model_len
        if self.reserve is Reservation.ACTUAL:
            return request.prompt_tokens + request.output_tokens
        if request.max_tokens is None:
            return self.max_model_len  # vLLM: max_tokens defaults to max_model_len - prompt
        return request.prompt_tokens + request.max_tokens

    def is_too_long(self, request: WasteRequest) -> bool:
        """Whether a server with ``max_model_len`` would refuse the request."""
        asked = request.max_tokens if request.max_tokens is not None else request.output_tokens
        return request.prompt_tokens + asked > self.max_model_len


@dataclass(frozen=True, eq=False)
class WasteTimeline:
    """Allocator state after each event step; between events KV held grows by ``num_running`` per
    step and everything else is constant. Arrays of shape (num_events,); tokens."""

    steps: np.ndarray
    holding_tokens: np.ndarray
    reserved_tokens: np.ndarray
    num_running: np.ndarray

    def sample(self, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(KV held, reserved) in tokens at the given steps (each >= the first event step)."""
        index = np.searchsorted(self.steps, steps, side="right") - 1
        held = self.holding_tokens[index] + self.num_running[index] * (steps - self.steps[index])
        return held, self.reserved_tokens[index]


@dataclass(frozen=True)
class WasteStats:
    """One allocator's replay. Tokens throughout (x bytes_per_token for bytes); means are over time
    (decode steps) from the first arrival to the last release.

    Attributes:
        allocator: ``"contiguous"`` or ``"paged"``.
        num_served: requests admitted and finished.
        num_never_fit: requests bigger than the whole pool for this allocator (not replayed).
        peak_running: most requests admitted at once.
        num_waited: requests admitted later than the step they arrived in.
        mean_wait_ms, max_wait_ms: queueing delay before first admission, over served requests.
        num_preemptions, num_recomputed_tokens: paged only; tokens prefilled again on readmission.
        mean_holding_tokens, peak_holding_tokens: KV actually written.
        mean_reserved_tokens, peak_reserved_tokens: memory given to sequences (slabs or blocks).
        mean_stranded_tokens, peak_stranded_tokens: external fragmentation: free memory in holes
            smaller than every waiting request (0 while nobody waits).
        blocked_by_fragmentation_ms: time the queue's head waited although enough memory was free
            in total (it was not in one piece).
        mean_waste_per_seq_tokens: (reserved - held) per running sequence, averaged over time.
        max_waste_per_seq_tokens: the most any one sequence had reserved but not written.
        makespan_ms: first arrival to last release.
        timeline: the state over time, for plots.
    """

    allocator: str
    num_served: int
    num_never_fit: int
    peak_running: int
    num_waited: int
    mean_wait_ms: float
    max_wait_ms: float
    num_preemptions: int
    num_recomputed_tokens: int
    mean_holding_tokens: float
    peak_holding_tokens: int
    mean_reserved_tokens: float
    peak_reserved_tokens: int
    mean_stranded_tokens: float
    peak_stranded_tokens: int
    blocked_by_fragmentation_ms: float
    mean_waste_per_seq_tokens: float
    max_waste_per_seq_tokens: int
    makespan_ms: float
    timeline: WasteTimeline

    @property
    def mean_internal_fragmentation_tokens(self) -> float:
        """Reserved but not holding KV, averaged over time."""
        return self.mean_reserved_tokens - self.mean_holding_tokens

    @property
    def internal_fragmentation_fraction(self) -> float:
        """Share of reserved memory that held no KV (time-weighted); 0 if nothing was reserved."""
        if self.mean_reserved_tokens == 0:
            return 0.0
        return self.mean_internal_fragmentation_tokens / self.mean_reserved_tokens


@dataclass(frozen=True)
class WasteResult:
    """Both replays of one trace.

    Attributes:
        config: the replay settings.
        num_requests: requests in the trace.
        num_too_long: refused for both allocators because they exceed ``max_model_len``.
        contiguous, paged: the two replays.
    """

    config: WasteConfig
    num_requests: int
    num_too_long: int
    contiguous: WasteStats
    paged: WasteStats
