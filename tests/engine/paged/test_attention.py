"""Paged attention (kvbench/engine/paged/attention.py): the batched decode path against dense SDPA.

Real layers of a small random Llama (GQA: 4 query heads over 2 KV heads) and a real KV pool; the
reference is PyTorch's SDPA over each sequence's own contiguous K/V with the causal rule written
out, so a wrong block table, padding, mask or row placement changes the numbers.
"""

import pytest
import torch

from kvbench.engine.model import default_llama_config, random_model
from kvbench.engine.paged.attention import (
    PagedForward,
    SequenceSlice,
    paged_attention_forward,
    skip_mask_creation,
)
from kvbench.engine.paged.kv_pool import NULL_BLOCK_ID, KVPool

BLOCK = 4
TOLERANCE = 1e-5  # fp32: padded and unpadded softmax sums differ only by rounding (measured max ~6e-8)


@pytest.fixture(scope="module")
def attention():
    loaded = random_model(
        default_llama_config(
            vocab_size=100,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
        ),
        seed=3,
    )
    return loaded, loaded.model.model.layers[0].self_attn


def fill(pool, table, keys, values):
    """Write ``(kv_heads, tokens, head_dim)`` K/V into ``table``'s blocks, position by position."""
    positions = torch.arange(keys.shape[1])
    pool.write(0, table[positions // BLOCK], positions % BLOCK, keys, values)


def dense(query, keys, values, num_query):
    """Reference: ``query`` ``(heads, q, head_dim)`` over ``(kv_heads, kv, head_dim)``; the queries are
    the last ``num_query`` positions. Returns ``(q, heads, head_dim)``."""
    num_kv = keys.shape[1]
    rep = query.shape[0] // keys.shape[0]
    keys, values = keys.repeat_interleave(rep, 0), values.repeat_interleave(rep, 0)  # (heads, kv, head_dim)
    allowed = torch.arange(num_kv)[None, :] <= torch.arange(num_kv - num_query, num_kv)[:, None]  # (q, kv)
    out = torch.nn.functional.scaled_dot_product_attention(query, keys, values, attn_mask=allowed)
    return out.transpose(0, 1)  # (q, heads, head_dim)


def run_mixed(loaded, module, lengths, num_queries, batch_decodes=True, seed=0):
    """Sequences of ``lengths`` context tokens whose last ``num_queries`` are new, packed in one row."""
    layout = loaded.kv_layout(BLOCK)
    pool = KVPool(layout, 64, torch.device("cpu"), torch.float32)
    gen = torch.Generator().manual_seed(seed)
    heads, kv_heads, dim = 4, layout.num_kv_heads, layout.head_dim
    slices, new_keys, new_values, queries, slots, refs = [], [], [], [], [], []
    for i, (length, num_query) in enumerate(zip(lengths, num_queries)):
        table = torch.arange(1 + 9 * i, 1 + 9 * i + -(-length // BLOCK))  # its own blocks (<= 9 each)
        keys, values = torch.randn(2, kv_heads, length, dim, generator=gen)  # (kv_heads, kv, head_dim) each
        past = length - num_query
        fill(pool, table, keys[:, :past], values[:, :past])  # the cached part
        query = torch.randn(heads, num_query, dim, generator=gen)  # (heads, q, head_dim)
        slices.append(SequenceSlice(sum(num_queries[:i]), num_query, table, length))
        new_keys.append(keys[:, past:]), new_values.append(values[:, past:]), queries.append(query)
        positions = torch.arange(past, length)
        slots.append((table[positions // BLOCK], positions % BLOCK))
        refs.append(dense(query, keys, values, num_query))
    plan = PagedForward.plan(
        pool, torch.cat([s[0] for s in slots]), torch.cat([s[1] for s in slots]), slices, batch_decodes
    )
    out, _ = paged_attention_forward(
        module,
        torch.cat(queries, 1)[None],
        torch.cat(new_keys, 1)[None],
        torch.cat(new_values, 1)[None],
        skip_mask_creation(torch.device("cpu")),
        scaling=dim**-0.5,
        kvbench_paged=plan,
    )
    return plan, out[0], torch.cat(refs)  # (tokens, heads, head_dim) both


def test_decodes_are_batched_and_match_dense_attention(attention):
    loaded, module = attention
    plan, out, ref = run_mixed(loaded, module, lengths=(9, 23, 30, 17), num_queries=(1, 7, 1, 1))
    assert plan.decode is not None and plan.decode.rows.tolist() == [0, 8, 9]
    assert plan.decode.mask.shape == (3, 1, 1, 30)  # padded to the longest context
    assert plan.decode.mask.sum(-1).flatten().tolist() == [9, 30, 17]
    assert [seq.num_query_tokens for seq, _ in plan.sequences] == [7]  # the prefill chunk alone
    assert (out - ref).abs().max().item() < TOLERANCE


def test_on_cpu_decodes_run_one_by_one_by_default(attention):
    loaded, module = attention
    plan, out, ref = run_mixed(
        loaded, module, lengths=(9, 23, 30, 17), num_queries=(1, 7, 1, 1), batch_decodes=None
    )
    assert plan.decode is None and [seq.query_start for seq, _ in plan.sequences] == [0, 1, 8, 9]
    assert (out - ref).abs().max().item() < TOLERANCE


def test_a_lone_sequence_takes_the_exact_path(attention):
    loaded, module = attention
    plan, out, ref = run_mixed(loaded, module, lengths=(21,), num_queries=(1,))
    assert plan.decode is None and len(plan.sequences) == 1
    assert (out - ref).abs().max().item() < TOLERANCE


def test_padded_gather_equals_each_sequences_gather(attention):
    loaded, _ = attention
    pool = KVPool(loaded.kv_layout(BLOCK), 16, torch.device("cpu"), torch.float32)
    for layer_tensor in (*pool.keys, *pool.values):
        layer_tensor.copy_(torch.randn(layer_tensor.shape))
    tables = [torch.tensor([3, 7, 1]), torch.tensor([12])]
    padded = torch.tensor([3, 7, 1, 12, NULL_BLOCK_ID, NULL_BLOCK_ID])  # (2 * 3,)
    keys, values = pool.gather_padded(0, padded, 2, 10)  # (2, kv_heads, 10, head_dim)
    for i, (table, length) in enumerate(zip(tables, (10, 3))):
        own_keys, own_values = pool.gather(0, table, length)  # (1, kv_heads, length, head_dim)
        assert torch.equal(keys[i, :, :length], own_keys[0]) and torch.equal(
            values[i, :, :length], own_values[0]
        )
