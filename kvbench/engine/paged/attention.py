"""Paged attention for transformers models: an attention function registered with ``AttentionInterface``.

Registered as ``"kvbench_paged"`` (:func:`use_paged_attention`). A forward that passes
``kvbench_paged=PagedForward(...)`` runs packed: the scheduled sequences' new tokens are one row
``(1, tokens)`` with explicit ``position_ids``, no transformers cache. In every attention layer the
function

1. writes the new tokens' K/V into the pool at their slots (block id, offset);
2. attends every decoding sequence (one query token) of the forward in **one** SDPA call, when
   there are two or more and the device is not the CPU (:meth:`PagedForward.plan`): one ``index_select`` over
   their block tables padded with the null block
   (:meth:`KVPool.gather_padded`) and a ``(n, 1, 1, kv)`` mask that hides each one's padding
   (:class:`DecodeBatch`); or, with a paged-KV kernel (FlashInfer, FlashAttention on CUDA:
   :mod:`kvbench.engine.paged.kernels`), one kernel call that reads the blocks in the pool;
3. attends each other sequence (a prefill chunk, or a lone decode) alone. A lone decode on the CPU
   in fp32 reads its blocks in place through kvbench's kernel (:mod:`kvbench.engine.one_query`,
   which the copy engine's decodes use too); anything else gathers its K/V by
   block table (one copy, :meth:`KVPool.gather`) and runs transformers' own SDPA path
   (``sdpa_attention_forward``) with the mask the copy engine gets: none when the queries are the
   whole sequence (``is_causal``) or one token (decode), else a boolean ``(1, 1, q, kv)`` causal
   mask shifted by the tokens before the queries. A forward of one sequence takes only this path,
   so concurrency 1 and ``--batch-invariant`` stay exact against the copy engine.

The split, the masks and the padded tables are made once per forward (:meth:`PagedForward.plan`)
and reused by every layer. The engine passes :func:`skip_mask_creation`'s placeholder as the
forward's ``attention_mask`` so transformers builds no mask of its own.

A forward without ``kvbench_paged`` (the copy engine's, on the same model object) goes to
:func:`~kvbench.engine.one_query.cpu_attention_forward` (the kernel for one query on the CPU,
else ``sdpa_attention_forward``) with the SDPA mask (the mask interface maps ``"kvbench_paged"`` to
``sdpa_mask``), so registering the function changes nothing for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from kvbench.engine.one_query import covers, cpu_attention_forward, one_query_attention
from kvbench.engine.paged.kernels import DecodeKernel, PageTables
from kvbench.engine.paged.kv_pool import NULL_BLOCK_ID, KVPool

ATTENTION_NAME = "kvbench_paged"


@dataclass(frozen=True)
class SequenceSlice:
    """One sequence in a packed forward.

    Attributes:
        query_start / num_query_tokens: its new tokens' positions in the packed row.
        block_table: ``(blocks,)`` long, its pool block ids, enough for ``num_context_tokens``.
        num_context_tokens: tokens it attends to after this forward's writes (cached + new).
    """

    query_start: int
    num_query_tokens: int
    block_table: torch.Tensor
    num_context_tokens: int


@dataclass(frozen=True)
class DecodeBatch:
    """Every decoding sequence of a forward (one query token each), attended in one SDPA call.

    Attributes:
        rows: ``(n,)`` long, the sequences' query positions in the packed row.
        block_tables: ``(n * max_blocks,)`` long, the block tables padded with the null block to
            ``max_blocks`` and flattened, so one ``index_select`` gathers all of them.
        mask: ``(n, 1, 1, kv)`` bool, ``kv`` = the longest context: key j is seen iff j < the
            sequence's ``num_context_tokens`` (the padding is masked out).
    """

    rows: torch.Tensor
    block_tables: torch.Tensor
    mask: torch.Tensor

    @classmethod
    def of(cls, sequences: Sequence[SequenceSlice], device: torch.device) -> DecodeBatch:
        """Pad and stack the decoding ``sequences`` (each ``num_query_tokens == 1``)."""
        max_blocks = max(len(seq.block_table) for seq in sequences)
        # (n, max_blocks)
        tables = torch.full((len(sequences), max_blocks), NULL_BLOCK_ID, dtype=torch.long, device=device)
        for i, seq in enumerate(sequences):
            tables[i, : len(seq.block_table)] = seq.block_table
        lengths = torch.tensor([seq.num_context_tokens for seq in sequences], device=device)  # (n,)
        # (kv,), no sync
        key_positions = torch.arange(max(seq.num_context_tokens for seq in sequences), device=device)
        mask = (key_positions[None, :] < lengths[:, None])[:, None, None]  # (n, 1, 1, kv)
        rows = torch.tensor([seq.query_start for seq in sequences], device=device)  # (n,)
        return cls(rows, tables.flatten(), mask)  # tables: (n * max_blocks,)


@dataclass(frozen=True)
class PagedForward:
    """What one packed forward needs: the pool, every new token's slot, the sequences.

    Attributes:
        pool: the KV pool written and read.
        slot_block_ids / slot_offsets: ``(tokens,)`` long, where each new token's K/V goes.
        sequences: the sequences attended one at a time (prefill chunks, or a lone decode), in
            row order, each with its mask (:func:`causal_mask`).
        decode: the decoding sequences attended together, ``None`` when fewer than two decode.
        kernel / page_tables: the paged-KV kernel that attends ``decode`` and its page tables
            (:mod:`kvbench.engine.paged.kernels`); ``None``: SDPA over the gathered blocks.
    """

    pool: KVPool
    slot_block_ids: torch.Tensor
    slot_offsets: torch.Tensor
    sequences: tuple[tuple[SequenceSlice, torch.Tensor | None], ...]
    decode: DecodeBatch | None = None
    kernel: DecodeKernel | None = None
    page_tables: PageTables | None = None

    @classmethod
    def plan(
        cls,
        pool: KVPool,
        slot_block_ids: torch.Tensor,
        slot_offsets: torch.Tensor,
        sequences: Sequence[SequenceSlice],
        batch_decodes: bool | None = None,
        kernel: DecodeKernel | None = None,
    ) -> PagedForward:
        """Split ``sequences`` once per forward (every layer reuses the split, the masks and the
        padded block tables): with ``batch_decodes``, two or more single-token queries form the
        :class:`DecodeBatch`; the rest run one by one. ``None``: batch where a ``kernel`` attends the
        batch, or off the CPU; on the CPU without one, one sequence at a time measured 2-4x faster (its
        gathered K/V, ~0.5 MiB, is still in cache
        when SDPA reads it; the padded batch's is not; see docs/engines.md "Speed: one SDPA for every
        decode"). A forward
        of one sequence (concurrency 1, ``--batch-invariant``) never batches, so its outputs are
        those of the copy engine, bit for bit. ``kernel`` (``start_kernel``'s) attends the batch."""
        device = slot_block_ids.device
        if batch_decodes is None:
            batch_decodes = device.type != "cpu" or kernel is not None
        decoding = [seq for seq in sequences if seq.num_query_tokens == 1]
        decode = DecodeBatch.of(decoding, device) if batch_decodes and len(decoding) >= 2 else None
        alone = [seq for seq in sequences if decode is None or seq.num_query_tokens > 1]
        # SDPA converts a bool mask at every call
        additive = pool.keys[0].dtype if device.type == "cpu" else None
        with_masks = tuple(
            (seq, causal_mask(seq.num_query_tokens, seq.num_context_tokens, device, additive))
            for seq in alone
        )
        if decode is None or kernel is None:
            return cls(pool, slot_block_ids, slot_offsets, with_masks, decode)
        padded = decode.block_tables.view(len(decoding), -1).tolist()  # one device-to-host copy per forward
        tables = PageTables.of(padded, [seq.num_context_tokens for seq in decoding], pool.block_size, device)
        return cls(pool, slot_block_ids, slot_offsets, with_masks, decode, kernel, tables)


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    kvbench_paged: PagedForward | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """``query`` ``(1, heads, tokens, head_dim)``, ``key``/``value`` ``(1, kv_heads, tokens, head_dim)``
    (the new tokens only); returns ``((1, tokens, heads, head_dim), None)`` as transformers expects.
    In a paged forward ``attention_mask`` is :func:`skip_mask_creation`'s placeholder, never read."""
    if kvbench_paged is None:
        return cpu_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    pool, layer = kvbench_paged.pool, module.layer_idx
    pool.write(layer, kvbench_paged.slot_block_ids, kvbench_paged.slot_offsets, key[0], value[0])
    # (1, tokens, heads, head_dim)
    output = query.new_empty((1, query.shape[2], query.shape[1], query.shape[3]))
    in_place = not dropout and covers(query[0, :, 0], pool.keys[layer])  # lone decodes: engine/one_query.py
    for seq, mask in kvbench_paged.sequences:
        lo, hi = seq.query_start, seq.query_start + seq.num_query_tokens
        if in_place and seq.num_query_tokens == 1:
            # (heads, head_dim)
            output[0, lo] = one_query_attention(
                query[0, :, lo],
                pool.keys[layer],
                pool.values[layer],
                seq.block_table,
                seq.num_context_tokens,
                scaling,
            )
            continue
        # (1, kv_heads, kv, head_dim)
        seq_keys, seq_values = pool.gather(layer, seq.block_table, seq.num_context_tokens)
        # (1, q, heads, head_dim)
        out, _ = sdpa_attention_forward(
            module, query[:, :, lo:hi], seq_keys, seq_values, mask, dropout=dropout, scaling=scaling
        )
        output[:, lo:hi] = out
    decode = kvbench_paged.decode
    if decode is not None and kvbench_paged.kernel is not None:  # the blocks read in place
        decode_query = query[0][:, decode.rows].transpose(0, 1)  # (n, heads, head_dim)
        output[0, decode.rows] = kvbench_paged.kernel.attend(
            layer, decode_query, kvbench_paged.page_tables, scaling
        )
    elif decode is not None:
        num_context = decode.mask.shape[-1]
        # (n, kv_heads, kv, head_dim)
        keys, values = pool.gather_padded(layer, decode.block_tables, len(decode.rows), num_context)
        decode_query = query[0][:, decode.rows].transpose(0, 1)[:, :, None]  # (n, heads, 1, head_dim)
        # (n, 1, heads, head_dim)
        out, _ = sdpa_attention_forward(
            module, decode_query, keys, values, decode.mask, dropout=dropout, scaling=scaling
        )
        output[0, decode.rows] = out[:, 0]  # (n, heads, head_dim)
    return output, None


def skip_mask_creation(device: torch.device) -> torch.Tensor:
    """A ``(1, 1, 1, 1)`` placeholder to pass as a paged forward's ``attention_mask``: transformers
    returns a 4D mask as given (``masking_utils._preprocess_mask_arguments``) instead of building a
    ``(tokens, tokens)`` packed-sequence mask that paged attention never reads (measured: ~190-260 ms
    for a 4,000-token packed prefill on the default model, 1 thread)."""
    return torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device)


def causal_mask(
    num_query: int, num_context: int, device: torch.device, additive: torch.dtype | None = None
) -> torch.Tensor | None:
    """``None`` where SDPA's own handling is exact (queries = whole sequence: ``is_causal``; one
    query: attends to everything), else ``(1, 1, q, kv)``: query i sees keys ``<= kv - q + i``
    (what transformers' ``sdpa_mask`` builds for a prefill after a cached past). Bool, or with
    ``additive`` a mask of that dtype holding 0 and -inf: the form torch's CPU SDPA converts a bool
    mask to at each call, so built once per forward it saves that in every layer (66 new tokens
    after 2,050 cached, one layer: 4.07 -> 3.74 ms) and gives the same bits."""
    if num_query == 1 or num_query == num_context:
        return None
    query_positions = torch.arange(num_context - num_query, num_context, device=device)  # (q,)
    key_positions = torch.arange(num_context, device=device)  # (kv,)
    seen = (key_positions[None, :] <= query_positions[:, None])[None, None]  # (1, 1, q, kv)
    if additive is None:
        return seen
    return torch.zeros(seen.shape, dtype=additive, device=device).masked_fill_(~seen, float("-inf"))


def use_paged_attention(model: torch.nn.Module) -> None:
    """Register the function (idempotent) and switch ``model`` to it; forwards without
    ``kvbench_paged`` keep running SDPA unchanged."""
    AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, sdpa_mask)
    model.set_attn_implementation(ATTENTION_NAME)
