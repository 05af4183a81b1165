"""Both engines on a CUDA device; every test skips on a machine without one.

* greedy outputs on CUDA equal the cache-off reference on both engines (the copy engine's
  ``verify``; the paged engine's batched verify, concurrent requests sharing a prefix);
* the paged-KV kernel the engine chose (FlashInfer / FlashAttention, where installed) gives the
  batched decode's attention of the gathered SDPA path, on a bf16 pool;
* the host tier is page-locked, and a stamp waits for queued kernels.
"""

import time

import pytest
import torch

from kvbench.cache.base import CacheConfig
from kvbench.engine.engine import CopyConfig, HFEngine
from kvbench.engine.model import default_llama_config, random_model
from kvbench.engine.paged.attention import (
    PagedForward,
    SequenceSlice,
    paged_attention_forward,
    skip_mask_creation,
)
from kvbench.engine.paged.config import AttentionKernel, PagedConfig
from kvbench.engine.paged.engine import PagedEngine
from kvbench.engine.paged.kernels import start_kernel
from kvbench.engine.paged.kv_pool import HostKV, KVPool
from kvbench.engine.sampling import SamplingParams
from kvbench.engine.stamps import stamp_s
from kvbench.memory.layout import DType, KvLayout

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda")
BLOCK = 16
GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def cuda_model():
    """The engine tests' small Llama (2 KV heads of 64, GQA 4:1 as the default model), fp32, on CUDA."""
    return random_model(
        default_llama_config(
            vocab_size=1000,
            hidden_size=512,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=8,
            bos_token_id=1,
            eos_token_id=2,
            max_position_embeddings=1024,
        ),
        seed=1,
        device=CUDA,
    )


def prompts():
    """Three prompts sharing a 64-token prefix (4 blocks), and one unrelated."""
    gen = torch.Generator().manual_seed(7)
    prefix = torch.randint(3, 1000, (64,), generator=gen).tolist()
    tails = [torch.randint(3, 1000, (n,), generator=gen).tolist() for n in (9, 21, 40)]
    return [prefix + tail for tail in tails] + [torch.randint(3, 1000, (50,), generator=gen).tolist()]


def test_the_copy_engine_on_cuda_equals_its_cache_off_reference(cuda_model):
    engine = HFEngine(
        cuda_model, CopyConfig(cache=CacheConfig(capacity_blocks=256, block_size=BLOCK), verify=True)
    )
    records = [engine.generate(ids, GREEDY) for ids in prompts()]
    assert [r.output_matches_reference for r in records] == [True] * 4
    assert [r.cached_prompt_tokens for r in records] == [0, 64, 64, 0]


def test_the_paged_engine_on_cuda_equals_the_cache_off_reference_under_batching(cuda_model):
    engine = PagedEngine(
        cuda_model, PagedConfig(CacheConfig(capacity_blocks=256, block_size=BLOCK), verify=True)
    )
    # fp32: no paged-KV kernel computes in it
    assert engine.attention_kernel.kernel is AttentionKernel.SDPA_GATHERED
    first = engine.generate(prompts()[0], GREEDY)
    records = [future.result(timeout=120) for future in [engine.submit(ids, GREEDY) for ids in prompts()[1:]]]
    assert engine.verify_report.totals.num_mismatches == 0
    copy = HFEngine(cuda_model, CopyConfig())  # cache off
    assert [r.output_token_ids for r in [first, *records]] == [
        copy.generate(ids, GREEDY).output_token_ids for ids in prompts()
    ]


def decode_forward(pool, kernel, lengths, seed=0):
    """The batched decode of one layer over sequences of ``lengths`` (scattered blocks), bf16."""
    gen = torch.Generator(device=CUDA).manual_seed(seed)
    layout, block = pool.layout, pool.block_size
    slices, start = [], 1
    for i, length in enumerate(lengths):
        # blocks in reverse order
        table = torch.arange(start, start + -(-length // block), device=CUDA).flip(0)
        start += len(table)
        positions = torch.arange(length, device=CUDA)
        keys, values = torch.randn(
            2, layout.num_kv_heads, length, layout.head_dim, generator=gen, device=CUDA, dtype=torch.bfloat16
        )
        pool.write(0, table[positions // block], positions % block, keys, values)
        slices.append(SequenceSlice(i, 1, table, length))
    heads = 4 * layout.num_kv_heads
    query = torch.randn(
        1, heads, len(lengths), layout.head_dim, generator=gen, device=CUDA, dtype=torch.bfloat16
    )
    last = [(s.block_table[(n - 1) // block], (n - 1) % block) for s, n in zip(slices, lengths)]
    blocks = torch.stack([b for b, _ in last])
    offsets = torch.tensor([o for _, o in last], device=CUDA)
    new_keys, new_values = (t[:, blocks, offsets][None] for t in (pool.keys[0], pool.values[0]))
    plan = PagedForward.plan(pool, blocks, offsets, slices, batch_decodes=True, kernel=kernel)

    class Attention(torch.nn.Module):
        layer_idx, is_causal, num_key_value_groups = 0, True, 4

    out, _ = paged_attention_forward(
        Attention(),
        query,
        new_keys,
        new_values,
        skip_mask_creation(CUDA),
        scaling=layout.head_dim**-0.5,
        kvbench_paged=plan,
    )
    return out[0].float()  # (n, heads, head_dim)


@pytest.mark.parametrize("block_size", [16, 256])
def test_the_kernel_path_equals_the_gathered_path(block_size):
    pool = KVPool(KvLayout(1, 2, 64, DType.BF16, block_size), 64, CUDA, torch.bfloat16)
    choice, kernel = start_kernel(pool)
    if kernel is None:
        pytest.skip(f"no paged-KV kernel for {block_size}-token blocks here: {choice.reason}")
    lengths = (1, 17, block_size * 3 + 5, 300, block_size)
    gathered, paged = decode_forward(pool, None, lengths), decode_forward(pool, kernel, lengths)
    assert (paged - gathered).abs().max().item() < 2e-2  # bf16 (~3 significant digits)


def test_the_host_tier_is_page_locked_on_cuda():
    pool = KVPool(KvLayout(1, 2, 64, DType.FP32, BLOCK), 8, CUDA, torch.float32)
    host = HostKV(pool, 4)
    assert all(t.is_pinned() and t.device.type == "cpu" for t in (*host.keys, *host.values))


def test_a_stamp_waits_for_the_kernels_queued_before_it():
    a = torch.randn(8192, 8192, device=CUDA)
    stamp_s(CUDA)
    start_s = time.perf_counter()
    for _ in range(20):
        a = a @ a / 8192  # queued, not yet run
    launched_s = time.perf_counter() - start_s
    finished_s = stamp_s(CUDA) - start_s
    assert finished_s > 2 * launched_s
