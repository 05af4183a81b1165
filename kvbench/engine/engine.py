"""The in-process engine: a transformers causal LM behind kvbench's prefix cache, one request at a time.

A request's life (:meth:`HFEngine.generate`; the caller renders and tokenizes, the engine takes ids):

1. cut the prompt into blocks and hash them (``BlockHasher``, with the request's salt);
2. look up at most ``(prompt_len - 1) // block_size`` blocks (the last prompt token is always
   recomputed: its logits give the first output token), which pins them;
3. concatenate the hit blocks into the past KV, one ``(1, kv_heads, hit_tokens, head_dim)`` pair per
   layer;
4. prefill only the tokens after the hit; the first sampled token stamps TTFT;
5. decode to ``max_tokens`` (stopping at EOS unless ``ignore_eos``), stamping every token;
6. copy every newly computed full block of prompt + output - 1 tokens out of the KV (the last
   sampled token was never fed forward, so it has no KV; keys chain over the generated ids, as in
   vLLM v1) and insert it (``clone``-like: each block gets its own storage, since a slice is a view
   that keeps the whole request's KV alive). ``CacheConfig.prompt_only`` stores prompt blocks only;
7. release the hit and the new blocks in a ``finally:``, so an exception never leaks a pin.

Block payload layout: one contiguous tensor per block, ``(layers, 2, kv_heads, block_size, head_dim)``
(dimension 1: 0 = keys, 1 = values), so a hit is one ``torch.cat`` along dimension 3.

Timestamps are ``time.perf_counter`` readings relative to the call's start, taken once the device
has finished (:func:`kvbench.engine.stamps.stamp_s`: on CUDA after ``torch.cuda.synchronize``); the
send loop adds queue time. The engine records ``lookup_ms`` (hashing + lookup), ``kv_load_ms`` (gathering hit
blocks),
``prefill_ms`` and ``insert_ms`` (after the last token) in its :class:`kvbench.request.RequestRecord`. TPOT
follows vLLM's benchmark: ``(e2e - ttft) / (output_tokens - 1)``, undefined for one token.

Numerics: cache-on greedy outputs must equal cache-off ones token for token. The two paths do not
run identical kernels (one forward over the whole prompt vs. a forward over the tail with a past), so
logits may differ in their last bits; an argmax flips only if the top two logits are that close. On
the default model, 24 verified requests (block 16 and 64, 100-360 tokens, 8 outputs each) matched in
fp32 and in bf16; bf16 rounds logits to ~3 significant digits, so near-ties flip far more easily:
keep fp32 for verification.

engine/ is the only folder that imports torch and transformers (kv.py: the compatibility layer and
block <-> KV conversions; sampling.py; model.py).
"""

from __future__ import annotations

import itertools
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from transformers import DynamicCache

from kvbench.cache.base import CacheConfig, Clock, PrefixCache, make_cache
from kvbench.cache.block_hash import BlockHasher, PromptBlocks
from kvbench.engine.kinds import EngineKind
from kvbench.engine.kv import (
    LayerKV,
    blocks_to_kv,
    cache_to_kv,
    forward_argument_names,
    kv_to_blocks,
    kv_to_cache,
    storage_bytes,
)
from kvbench.engine.model import LoadedModel
from kvbench.engine.request_check import check_attention_only, check_request
from kvbench.engine.sampling import SamplingParams, sample_next_token  # SamplingParams: part of this API
from kvbench.engine.serial import SerialCalls
from kvbench.engine.stamps import stamp_s
from kvbench.request import RequestRecord, Status

# ---------------------------------------------------------------- configs and results


@dataclass(frozen=True)
class CopyConfig:
    """How the copy engine runs (:func:`kvbench.engine.factory.make_engine` builds it from an
    :class:`~kvbench.engine.factory.EngineConfig`).

    Attributes:
        cache: the prefix cache's settings (capacity, block size, kind, TTL, release order, hash);
            ``None`` runs with the cache off (every request prefills its whole prompt).
        store_views: cache views instead of per-block copies (a demonstration of the memory bug).
        verify: re-run each request without the cache and record ``output_matches_reference``.
        salt: the run's salt; a request's own salt replaces it.
    """

    cache: CacheConfig | None = None
    store_views: bool = False  # off: each block owns exactly its bytes
    verify: bool = False
    salt: str = ""  # "" = the public namespace

    def __post_init__(self) -> None:
        if self.cache is not None and not isinstance(self.cache, CacheConfig):
            raise ValueError(f"cache must be a CacheConfig or None, got {type(self.cache).__name__}")


@dataclass
class _Stamps:
    """Stamps of one request, in ``perf_counter`` seconds."""

    start_s: float
    looked_up_s: float = 0.0
    kv_loaded_s: float = 0.0
    prefilled_s: float = 0.0
    token_s: list[float] = field(default_factory=list)
    inserted_s: float = 0.0

    def ms(self, end_s: float, start_s: float | None = None) -> float:
        return (end_s - (self.start_s if start_s is None else start_s)) * 1e3


# ---------------------------------------------------------------- the engine


class HFEngine(SerialCalls):
    """Runs requests of token ids through one model and (optionally) one prefix cache, one at a time.

    The :class:`kvbench.engine.protocol.Engine` interface: ``submit`` queues requests for one FIFO
    worker thread (:mod:`kvbench.engine.serial`), which runs each through :meth:`run_request`;
    ``generate`` is ``submit(...).result()``.
    ``clock`` (seconds) is the cache's TTL clock, injectable for tests; latencies always use
    ``time.perf_counter``.

    Example::

        engine = make_engine(load_model(), EngineConfig(cache=CacheConfig(capacity_blocks=4096)))
        result = engine.generate(token_ids, SamplingParams(max_tokens=32, ignore_eos=True))

    Raises:
        InputError: the model has layers whose KV is not a per-token key/value sequence.
    """

    spec = EngineKind.COPY.spec  # one sequence at a time, each cached block its own tensor

    def __init__(
        self, loaded: LoadedModel, config: CopyConfig = CopyConfig(), clock: Clock | None = None
    ) -> None:
        check_attention_only(loaded)
        super().__init__()
        self.loaded = loaded
        self.config = config
        self.cache: PrefixCache | None = make_cache(config.cache, clock) if config.cache else None
        self._hasher = BlockHasher(config.cache.block_size, config.cache.hash) if config.cache else None
        self._cache_arg, self._logits_arg = forward_argument_names(loaded.model)
        self._device = loaded.device  # stamps wait for it (engine/stamps.py)
        self._payloads: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self._payload_ids = itertools.count()

    @property
    def block_size(self) -> int | None:
        return self.config.cache.block_size if self.config.cache else None

    @property
    def cache_config(self) -> CacheConfig | None:
        return self.config.cache

    def run_request(
        self,
        token_ids: Sequence[int] | np.ndarray,
        sampling: SamplingParams = SamplingParams(),
        salt: str | None = None,
        extra_keys: Sequence[str | bytes | int] = (),
        on_token: Callable[[int], bool | None] | None = None,
    ) -> RequestRecord:
        """Run one request in the calling thread (the queue's worker calls it: use ``submit`` or
        ``generate``, which queue behind the requests before them). Bad input (empty prompt, id
        outside the vocabulary, prompt + max_tokens beyond the context) gives a result with status ``error``;
        other exceptions propagate, after
        every pin is released.

        ``on_token(token_id)`` is called with every output token as soon as it is sampled (not for
        the ``verify`` reference run); when it returns ``True`` the request ends normally after that
        token (a stop sequence matched; the prompt is cached as usual); an exception it raises stops
        the request, and nothing of the request is cached."""
        stamps = _Stamps(time.perf_counter())
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1).tolist()
        problem = self._check_request(ids, sampling)
        if problem is not None:
            return RequestRecord.failed(len(ids), problem)
        salt = self.config.salt if salt is None else salt
        result = self._run(ids, sampling, salt, extra_keys, stamps, self.cache, on_token)
        if self.config.verify:
            reference = self._run(ids, sampling, salt, extra_keys, _Stamps(time.perf_counter()), cache=None)
            matches = reference.output_token_ids == result.output_token_ids
            result = replace(result, output_matches_reference=matches if sampling.is_reproducible else None)
        return result

    def _check_request(self, ids: list[int], sampling: SamplingParams) -> str | None:
        return check_request(self.loaded, ids, sampling)

    @torch.inference_mode()
    def _run(
        self,
        ids: list[int],
        sampling: SamplingParams,
        salt: str,
        extra_keys: Sequence,
        stamps: _Stamps,
        cache: PrefixCache | None,
        on_token: Callable[[int], bool | None] | None = None,
    ) -> RequestRecord:
        """Steps 1-7 of the module docstring; ``cache=None`` is the cache-off path."""
        handles: list = []
        num_hit_blocks = num_inserted = 0
        try:
            prompt, past = None, []
            if cache is not None:
                prompt = self._hasher.prompt_blocks(ids, salt=salt, extra_keys=extra_keys)
                match = cache.lookup(prompt, prompt.max_hit_blocks)
                handles.extend(match.handles)
                num_hit_blocks = match.num_hit_blocks
                stamps.looked_up_s = stamp_s(self._device)
                past = blocks_to_kv(match.payloads) if num_hit_blocks else []
            stamps.kv_loaded_s = stamp_s(self._device)
            kv_cache = kv_to_cache(past)
            num_hit_tokens = num_hit_blocks * (self.block_size or 0)
            tokens = self._prefill_and_decode(ids[num_hit_tokens:], kv_cache, sampling, stamps, on_token)
            if cache is not None:
                stored = self._stored_blocks(prompt, ids, tokens, salt, extra_keys)
                num_inserted = self._insert(cache, stored, num_hit_blocks, kv_cache, handles)
            stamps.inserted_s = stamp_s(self._device)
        finally:
            if handles:
                cache.release(handles)
        return _result(len(ids), num_hit_tokens, tokens, stamps, num_inserted, cache is not None)

    def _prefill_and_decode(
        self,
        tail_ids: list[int],
        kv_cache: DynamicCache,
        sampling: SamplingParams,
        stamps: _Stamps,
        on_token: Callable[[int], bool | None] | None = None,
    ) -> list[int]:
        generator = None
        if sampling.temperature > 0 and sampling.seed is not None:
            generator = torch.Generator(device=self.loaded.device).manual_seed(sampling.seed)
        logits = self._prefill(tail_ids, kv_cache)  # (vocab,)
        stamps.prefilled_s = stamp_s(self._device)
        tokens = [sample_next_token(logits, sampling, generator)]
        stamps.token_s.append(stamp_s(self._device))  # TTFT: the first token exists
        if on_token is not None and on_token(tokens[-1]):
            return tokens
        eos = () if sampling.ignore_eos else self.loaded.eos_token_ids
        while len(tokens) < sampling.max_tokens and tokens[-1] not in eos:
            logits = self._decode_step(tokens[-1], kv_cache)  # (vocab,)
            tokens.append(sample_next_token(logits, sampling, generator))
            stamps.token_s.append(stamp_s(self._device))
            if on_token is not None and on_token(tokens[-1]):
                break
        return tokens

    def _prefill(self, tail_ids: list[int], kv_cache: DynamicCache) -> torch.Tensor:
        """Forward over the uncached tail; appends its KV to ``kv_cache``; last logits ``(vocab,)``."""
        input_ids = torch.tensor([tail_ids], device=self.loaded.device)  # (1, tail_tokens)
        return self._forward(input_ids, kv_cache)

    def _decode_step(self, token_id: int, kv_cache: DynamicCache) -> torch.Tensor:
        """Forward over one token; appends its KV to ``kv_cache``; logits ``(vocab,)``."""
        input_ids = torch.tensor([[token_id]], device=self.loaded.device)  # (1, 1)
        return self._forward(input_ids, kv_cache)

    def _forward(self, input_ids: torch.Tensor, kv_cache: DynamicCache) -> torch.Tensor:
        kwargs = {self._cache_arg: kv_cache, "use_cache": True}
        if self._logits_arg is not None:
            kwargs[self._logits_arg] = 1  # the LM head over one position, not the whole tail
        output = self.loaded.model(input_ids=input_ids, **kwargs)
        return output.logits[0, -1]  # (vocab,)

    def _stored_blocks(
        self, prompt: PromptBlocks, ids: list[int], tokens: list[int], salt: str, extra_keys: Sequence
    ) -> PromptBlocks:
        """The blocks step 6 stores: the prompt's, or (the default) those of prompt + output - 1 tokens,
        whose KV ``kv_cache`` holds after decode; the prompt's keys are their prefix (same chain)."""
        if self.config.cache.prompt_only or len(tokens) < 2:
            return prompt
        return self._hasher.prompt_blocks(ids + tokens[:-1], salt=salt, extra_keys=extra_keys)

    def _insert(
        self,
        cache: PrefixCache,
        prompt: PromptBlocks,
        num_hit_blocks: int,
        kv_cache: DynamicCache,
        handles: list,
    ) -> int:
        """Copy the new full blocks of ``prompt`` (the sequence to store: prompt, or prompt + output - 1)
        out of the KV, insert them, pin them through ``handles``."""
        if prompt.num_full_blocks <= num_hit_blocks:
            return 0
        blocks = kv_to_blocks(
            cache_to_kv(kv_cache),
            num_hit_blocks,
            prompt.num_full_blocks,
            prompt.block_size,
            self.config.store_views,
        )
        inserted = cache.insert(prompt, num_hit_blocks, blocks)
        handles.extend(inserted.handles)
        for block in blocks:
            self._payloads[next(self._payload_ids)] = block
        return inserted.num_inserted_blocks

    @torch.inference_mode()
    def reference_logprobs(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> torch.Tensor:
        """Log-probabilities (natural log, float32) the cache-off engine gives each position of
        ``output_ids`` after ``prompt_ids``, ``(len(output_ids), vocab)``: its prefill over the prompt,
        then its decode steps fed ``output_ids`` (teacher forcing). Row ``i``'s argmax is the token a
        greedy cache-off run picks after the same ``i`` outputs, by the same forward calls as the
        ``verify`` reference run. Raises ``ValueError`` for empty ``prompt_ids`` or ``output_ids``."""
        if not prompt_ids or not output_ids:
            raise ValueError("reference_logprobs needs a prompt and at least one output token")
        kv_cache = kv_to_cache([])
        rows = [self._prefill([int(t) for t in prompt_ids], kv_cache)]  # each (vocab,)
        rows += [self._decode_step(int(token), kv_cache) for token in output_ids[:-1]]
        return torch.log_softmax(torch.stack(rows).float(), dim=-1)  # (outputs, vocab)

    # ------------------------------------------------------------ helpers for benchmarks and tests

    @torch.inference_mode()
    def compute_kv(self, token_ids: Sequence[int] | np.ndarray) -> list[LayerKV]:
        """Per-layer KV of ``token_ids`` computed from scratch, each ``(1, kv_heads, n, head_dim)``."""
        kv_cache = kv_to_cache([])
        self._prefill([int(t) for t in token_ids], kv_cache)
        return cache_to_kv(kv_cache)

    @torch.inference_mode()
    def ideal_prefill(
        self,
        past: Sequence[LayerKV],
        tail_ids: Sequence[int] | np.ndarray,
        sampling: SamplingParams = SamplingParams(),
    ) -> tuple[int, float]:
        """The best a cache hit can do: first token id and ms for the forward over ``tail_ids`` with a
        ready-made ``past`` (no hashing, no lookup, no concatenation), plus sampling."""
        kv_cache = kv_to_cache(past)
        start_s = stamp_s(self._device)
        logits = self._prefill([int(t) for t in tail_ids], kv_cache)
        token = sample_next_token(logits, sampling, None)
        return token, (stamp_s(self._device) - start_s) * 1e3

    def held_kv_bytes(self) -> int:
        """Bytes the cached payloads really keep alive (distinct storages; a view counts its base)."""
        return storage_bytes(list(self._payloads.values()))

    def nominal_kv_bytes(self) -> int:
        """``cached blocks x KV bytes per block``: what the cache should hold."""
        if self.cache is None:
            return 0
        return self.cache.num_cached_blocks * self.loaded.kv_layout(self.block_size).bytes_per_block


def _result(
    prompt_tokens: int,
    cached_tokens: int,
    tokens: list[int],
    stamps: _Stamps,
    num_inserted: int,
    cache_on: bool,
) -> RequestRecord:
    token_s = stamps.token_s
    ttft_ms, e2e_ms = stamps.ms(token_s[0]), stamps.ms(token_s[-1])
    return RequestRecord(
        status=Status.OK,
        prompt_tokens=prompt_tokens,
        cached_prompt_tokens=cached_tokens,
        output_tokens=len(tokens),
        output_tokens_source="engine",
        output_token_ids=tuple(tokens),
        ttft_ms=ttft_ms,
        itl_ms=tuple((b - a) * 1e3 for a, b in zip(token_s, token_s[1:])),
        e2e_ms=e2e_ms,
        prefill_ms=stamps.ms(stamps.prefilled_s, stamps.kv_loaded_s),
        lookup_ms=stamps.ms(stamps.looked_up_s) if cache_on else None,
        kv_load_ms=stamps.ms(stamps.kv_loaded_s, stamps.looked_up_s) if cache_on else None,
        insert_ms=stamps.ms(stamps.inserted_s, token_s[-1]) if cache_on else None,
        num_inserted_blocks=num_inserted,
    )
