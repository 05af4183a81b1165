"""The transformers compatibility layer and the block <-> KV conversions the engine uses.

Block payload layout: one contiguous tensor per block, ``(layers, 2, kv_heads, block_size, head_dim)``
(dimension 1: 0 = keys, 1 = values), so a hit is one ``torch.cat`` along dimension 3.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer  # transformers >= 4.56: a cache is a list of layers

from kvbench.errors import InputError
from kvbench.memory.layout import KvLayout

LayerKV = tuple[torch.Tensor, torch.Tensor]  # (keys, values), each (1, kv_heads, seq, head_dim)

# ---------------------------------------------------------------- transformers compatibility layer


def kv_to_cache(layers: Sequence[LayerKV]) -> DynamicCache:
    """A ``DynamicCache`` holding ``layers`` as they are (no copy). Empty ``layers``: an empty cache.

    ``DynamicCache(ddp_cache_data)`` would copy each tensor (its layers start empty and concatenate),
    so the layers are filled directly; every layer is a plain ``DynamicLayer``, which keeps every
    token (the attention mask, not the cache, applies a sliding window).
    """
    cache = DynamicCache()
    for keys, values in layers:
        layer = DynamicLayer()
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
        cache.layers.append(layer)
    return cache


def cache_to_kv(cache: DynamicCache) -> list[LayerKV]:
    """The per-layer ``(keys, values)`` a ``DynamicCache`` holds (the tensors themselves)."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def forward_argument_names(model: torch.nn.Module) -> tuple[str, str | None]:
    """Names ``model.forward`` uses for the KV cache and for "logits of the last N positions only".

    transformers 5 renamed ``past_key_values`` to ``cache`` and 4.45 renamed ``num_logits_to_keep``
    to ``logits_to_keep``; the second name is ``None`` when the model has neither.
    """
    parameters = inspect.signature(model.forward).parameters
    cache_name = "cache" if "cache" in parameters else "past_key_values"
    logits_name = next((n for n in ("logits_to_keep", "num_logits_to_keep") if n in parameters), None)
    return cache_name, logits_name


# ---------------------------------------------------------------- blocks <-> KV


def kv_to_blocks(
    layers: Sequence[LayerKV], start_block: int, stop_block: int, block_size: int, store_views: bool = False
) -> list[torch.Tensor]:
    """Blocks ``start_block .. stop_block - 1`` of a request's KV, one payload per block.

    Each payload is ``(layers, 2, kv_heads, block_size, head_dim)`` with its own storage of exactly
    one block's bytes. With ``store_views`` the request's whole KV is stacked once into
    ``(layers, 2, kv_heads, seq, head_dim)`` and every payload is a view into it: each cached block
    then keeps the whole request's KV alive (what ``kvbench break views`` shows).
    """
    if store_views:
        stacked = torch.stack([t[0] for kv in layers for t in kv]).unflatten(0, (len(layers), 2))
        return [
            stacked[:, :, :, i * block_size : (i + 1) * block_size] for i in range(start_block, stop_block)
        ]
    blocks = []
    for i in range(start_block, stop_block):
        lo, hi = i * block_size, (i + 1) * block_size
        parts = [t[0, :, lo:hi] for kv in layers for t in kv]  # 2 x layers of (kv_heads, block, head_dim)
        blocks.append(torch.stack(parts).unflatten(0, (len(layers), 2)))  # one copy, own storage
    return blocks


def blocks_to_kv(payloads: Sequence[torch.Tensor]) -> list[LayerKV]:
    """Concatenate hit blocks into per-layer ``(keys, values)``, each ``(1, kv_heads, hit, head_dim)``."""
    kv = torch.cat(list(payloads), dim=3)  # (layers, 2, kv_heads, hit_tokens, head_dim)
    return [(kv[i, 0].unsqueeze(0), kv[i, 1].unsqueeze(0)) for i in range(kv.shape[0])]


def capacity_blocks_for_bytes(capacity_bytes: int, layout: KvLayout) -> int:
    """Whole blocks of ``layout`` in a cache of ``capacity_bytes`` (``--cache-bytes``).

    Raises:
        InputError: not even one block fits.
    """
    num_blocks = capacity_bytes // layout.bytes_per_block
    if num_blocks < 1:
        raise InputError(
            f"a {capacity_bytes}-byte cache holds no block: one {layout.block_size}-token "
            f"block of this model is {layout.bytes_per_block} bytes"
        )
    return num_blocks


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages ``tensors`` keep alive (a view counts its whole base)."""
    sizes = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        sizes[(storage.device, storage.data_ptr())] = storage.nbytes()
    return sum(sizes.values())
