"""engine/one_query.py: one query token's attention through kvbench's kernel, against torch's SDPA,
and the same bits whether the keys sit in scattered pool blocks or in one contiguous cache."""

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from kvbench.engine.model import default_llama_config, random_model
from kvbench.engine.native import native_kernels, native_kernels_reason
from kvbench.engine.one_query import (
    ATTENTION_NAME,
    cpu_attention_forward,
    one_query_attention,
    use_cpu_attention,
)
from kvbench.memory.layout import DType

pytestmark = pytest.mark.skipif(
    native_kernels() is None, reason=f"no native kernels here: {native_kernels_reason()}"
)

HEADS, KV_HEADS, HEAD_DIM = 8, 2, 64  # the default model's


class Module(torch.nn.Module):
    is_causal, num_key_value_groups, layer_idx = True, HEADS // KV_HEADS, 0


def _qkv(num_query, num_context, seed):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(1, HEADS, num_query, HEAD_DIM, generator=generator)
    key, value = (torch.randn(1, KV_HEADS, num_context, HEAD_DIM, generator=generator) for _ in range(2))
    return query, key, value


@pytest.mark.parametrize("num_context", [1, 15, 16, 17, 300, 2050])
def test_one_query_equals_sdpa(num_context):
    query, key, value = _qkv(1, num_context, seed=num_context)
    got, _ = cpu_attention_forward(Module(), query, key, value, None, scaling=HEAD_DIM**-0.5)
    expected, _ = sdpa_attention_forward(Module(), query, key, value, None, scaling=HEAD_DIM**-0.5)
    assert got.shape == expected.shape == (1, 1, HEADS, HEAD_DIM)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["prefill", "mask", "sliding_window", "batch", "value_head_dim"])
def test_what_the_kernel_does_not_cover_is_sdpa_bit_for_bit(case):
    query, key, value = _qkv(5 if case == "prefill" else 1, 40, seed=3)
    mask, kwargs = None, {}
    if case == "mask":
        mask = torch.ones(1, 1, 1, 40, dtype=torch.bool)
    elif case == "sliding_window":
        kwargs = {"sliding_window": 16}
    elif case == "batch":
        query, key, value = (torch.cat([t, t]) for t in (query, key, value))
    elif case == "value_head_dim":  # values of another head size than the keys (MLA-style)
        value = value[..., :32].contiguous()
    got, _ = cpu_attention_forward(Module(), query, key, value, mask, scaling=0.125, **kwargs)
    expected, _ = sdpa_attention_forward(Module(), query, key, value, mask, scaling=0.125, **kwargs)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("position", [3, 35])  # in the vectorized part of the softmax, and in its tail
def test_a_nan_key_gives_a_nan_output_as_sdpa_does(position):
    query, key, value = _qkv(1, 40, seed=4)
    key[0, :, position] = float("nan")
    got, _ = cpu_attention_forward(Module(), query, key, value, None, scaling=0.125)
    assert got.isnan().all()


def test_scattered_blocks_and_one_contiguous_cache_give_the_same_bits():
    """The paged engine's lone decode (blocks in the pool) and the copy engine's (DynamicCache) agree."""
    block_size, num_context = 16, 75
    query, key, value = _qkv(1, num_context, seed=11)
    table = torch.tensor([9, 2, 14, 5, 7])  # 5 blocks hold 75 tokens
    pool_keys, pool_values = (torch.randn(KV_HEADS, 16, block_size, HEAD_DIM) for _ in range(2))
    positions = torch.arange(num_context)
    pool_keys[:, table[positions // block_size], positions % block_size] = key[0]
    pool_values[:, table[positions // block_size], positions % block_size] = value[0]
    # (heads, d)
    paged = one_query_attention(query[0, :, 0], pool_keys, pool_values, table, num_context, 0.125)
    copy, _ = cpu_attention_forward(Module(), query, key, value, None, scaling=0.125)  # (1, 1, heads, d)
    assert torch.equal(paged, copy[0, 0])


def test_a_cpu_fp32_model_switches_and_others_stay(monkeypatch):
    def config():  # a fresh one each time: the model's attention setting lives in its config
        return default_llama_config(
            hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2, head_dim=32
        )

    assert random_model(config(), seed=1).model.config._attn_implementation == ATTENTION_NAME
    assert random_model(config(), seed=1, dtype=DType.BF16).model.config._attn_implementation == "sdpa"
    monkeypatch.setenv("KVBENCH_NATIVE_KERNELS", "0")
    off = random_model(config(), seed=1)
    assert off.model.config._attn_implementation == "sdpa" and use_cpu_attention(off.model) is False
