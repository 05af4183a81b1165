"""One query token's attention on the CPU through kvbench's kernel, in both engines.

A decode step attends one new token per sequence. Torch's SDPA needs each sequence's keys and
values contiguous, so the paged engine copied every lone decode's blocks out of the pool first
(``index_select``), and SDPA's CPU flash kernel is slow for one query: default model, a context
of 2,000 tokens, one layer, thread CPU ms, medians of 7: gather + SDPA 0.72, kvbench's kernel
0.34 (:meth:`~kvbench.engine.native.NativeKernels.paged_decode`), about 3 ms of a ~48 ms
one-sequence decode step. Both engines use it, so they still compute the same bits at
concurrency 1: the paged engine reads its blocks in place by block table
(:func:`one_query_attention`), the copy engine's contiguous cache (transformers'
``DynamicCache``, ``(1, kv_heads, tokens, head_dim)``) is read as one block of all its tokens
(:func:`cpu_attention_forward`). The kernel sums over the context in token order whatever the
blocks, so the same keys and values give the same output either way.

It applies to fp32 on the CPU where the native kernels are built; anything else it does not
cover (more than one query, a batch, an attention mask, dropout, values of another head size
than the keys, a sliding window, logit softcapping or attention sinks) goes to transformers' own SDPA path
unchanged.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from kvbench.engine.native import native_kernels

ATTENTION_NAME = "kvbench_cpu"
UNCOVERED_KWARGS = ("sliding_window", "softcap", "s_aux", "sinks", "head_mask")  # variants the kernel lacks


def covers(query: torch.Tensor, keys: torch.Tensor) -> bool:
    """Whether the kernel computes this attention: fp32 CPU tensors, a whole number of query heads
    per kv head, and the native kernels built. ``query`` ``(..., heads, head_dim)``, ``keys``
    ``(kv_heads, ..., head_dim)``."""
    return (
        query.device.type == "cpu"
        and query.dtype == keys.dtype == torch.float32
        and query.shape[-2] % keys.shape[0] == 0
        and native_kernels() is not None
    )


def one_query_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    block_table: torch.Tensor,
    num_context: int,
    scaling: float | None,
) -> torch.Tensor:
    """One sequence's query ``(heads, head_dim)`` over the first ``num_context`` tokens of its blocks
    ``block_table`` ``(blocks,)`` in one layer's ``keys``/``values`` ``(kv_heads, pages,
    block_size, head_dim)``; returns ``(heads, head_dim)``. The caller checks :func:`covers`."""
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    tables = block_table.to(torch.int32)[None]  # (1, blocks)
    lengths = torch.tensor([num_context], dtype=torch.int32)  # (1,)
    return native_kernels().paged_decode(query[None], keys, values, tables, lengths, scale)[0]


def cpu_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query`` ``(batch, heads, q, head_dim)``,
    ``key``/``value`` ``(batch, kv_heads, kv, head_dim)``; returns ``((batch, q, heads, head_dim),
    None)``. One query of one sequence without a mask runs the kernel over the whole cache as one
    block; everything else is ``sdpa_attention_forward``'s."""
    one_query = query.shape[0] == 1 and query.shape[2] == 1 and attention_mask is None and not dropout
    if (
        one_query
        and key.shape == value.shape
        and key.is_contiguous()
        and value.is_contiguous()
        and covers(query[0, :, 0], key[0])
        and not any(kwargs.get(name) is not None for name in UNCOVERED_KWARGS)
    ):
        num_kv_heads, num_context, head_dim = key.shape[1:]
        pages = (num_kv_heads, 1, num_context, head_dim)  # the cache as one block
        # (heads, head_dim)
        out = one_query_attention(
            query[0, :, 0],
            key.view(pages),
            value.view(pages),
            torch.zeros(1, dtype=torch.int32),
            num_context,
            scaling,
        )
        return out[None, None], None
    return sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
    )


def use_cpu_attention(model: torch.nn.Module) -> bool:
    """Switch a CPU fp32 ``model`` that runs transformers' SDPA to :func:`cpu_attention_forward`
    (registered as ``"kvbench_cpu"``, idempotent) where the native kernels are built. Returns
    whether the model uses it now. A model on another device or dtype, or one loaded with another
    attention implementation, is left as it is."""
    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation == ATTENTION_NAME:
        return True
    parameter = next(model.parameters(), None)
    if (
        implementation != "sdpa"
        or not hasattr(model, "set_attn_implementation")
        or parameter is None
        or parameter.device.type != "cpu"
        or parameter.dtype != torch.float32
        or native_kernels() is None
    ):
        return False
    AttentionInterface.register(ATTENTION_NAME, cpu_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, sdpa_mask)
    model.set_attn_implementation(ATTENTION_NAME)
    return True
