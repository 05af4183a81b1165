"""Paged attention for transformers models: an attention function registered with ``AttentionInterface``.

Registered as ``"kvbench_paged"`` (:func:`use_paged_attention`). A forward that passes
``kvbench_paged=PagedForward(...)`` runs packed: the scheduled sequences' new tokens are one row
``(1, tokens)`` with explicit ``position_ids``, no transformers cache. In every attention layer the
function

1. writes the new tokens' K/V into the pool at their slots (block id, offset);
2. per sequence, gathers its K/V by block table (one copy, :meth:`KVPool.gather`) and runs
   transformers' own SDPA path (``sdpa_attention_forward``) with the mask the copy engine gets:
   none when the queries are the whole sequence (``is_causal``) or one token (decode), else a
   boolean ``(1, 1, q, kv)`` causal mask shifted by the tokens before the queries.

A forward without ``kvbench_paged`` (the copy engine's, on the same model object) goes straight to
``sdpa_attention_forward`` with the SDPA mask (the mask interface maps ``"kvbench_paged"`` to
``sdpa_mask``), so registering the function changes nothing for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from kvbench.engine.paged.kv_pool import KVPool

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
class PagedForward:
    """What one packed forward needs: the pool, every new token's slot, the sequences.

    Attributes:
        pool: the KV pool written and read.
        slot_block_ids / slot_offsets: ``(tokens,)`` long, where each new token's K/V goes.
        sequences: the packed sequences, in row order.
    """

    pool: KVPool
    slot_block_ids: torch.Tensor
    slot_offsets: torch.Tensor
    sequences: tuple[SequenceSlice, ...]


def paged_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                            kvbench_paged: PagedForward | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """``query`` ``(1, heads, tokens, head_dim)``, ``key``/``value`` ``(1, kv_heads, tokens, head_dim)``
    (the new tokens only); returns ``((1, tokens, heads, head_dim), None)`` as transformers expects."""
    if kvbench_paged is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    pool, layer = kvbench_paged.pool, module.layer_idx
    pool.write(layer, kvbench_paged.slot_block_ids, kvbench_paged.slot_offsets, key[0], value[0])
    outputs = []
    for seq in kvbench_paged.sequences:
        lo, num_query = seq.query_start, seq.num_query_tokens
        seq_query = query[:, :, lo:lo + num_query]  # (1, heads, q, head_dim)
        seq_keys, seq_values = pool.gather(layer, seq.block_table, seq.num_context_tokens)  # (1, kv_heads, kv, head_dim)
        mask = causal_mask(num_query, seq.num_context_tokens, query.device)
        out, _ = sdpa_attention_forward(module, seq_query, seq_keys, seq_values, mask, dropout=dropout,
                                        scaling=scaling)  # (1, q, heads, head_dim)
        outputs.append(out)
    return torch.cat(outputs, dim=1), None  # (1, tokens, heads, head_dim)


def causal_mask(num_query: int, num_context: int, device: torch.device) -> torch.Tensor | None:
    """``None`` where SDPA's own handling is exact (queries = whole sequence: ``is_causal``; one
    query: attends to everything), else ``(1, 1, q, kv)`` bool: query i sees keys ``<= kv - q + i``
    (what transformers' ``sdpa_mask`` builds for a prefill after a cached past)."""
    if num_query == 1 or num_query == num_context:
        return None
    query_positions = torch.arange(num_context - num_query, num_context, device=device)  # (q,)
    key_positions = torch.arange(num_context, device=device)  # (kv,)
    return (key_positions[None, :] <= query_positions[:, None])[None, None]  # (1, 1, q, kv)


def use_paged_attention(model: torch.nn.Module) -> None:
    """Register the function (idempotent) and switch ``model`` to it; forwards without
    ``kvbench_paged`` keep running SDPA unchanged."""
    AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, sdpa_mask)
    model.set_attn_implementation(ATTENTION_NAME)
