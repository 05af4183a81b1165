"""The paged-KV kernel layer (kvbench/engine/paged/kernels.py) on the CPU: which kernel is chosen given
which libraries import (the import probe replaced), the page tables and pool views the kernels read,
and the attention dispatch with a kernel, all checked against a real pool's gather and SDPA.

FlashInfer and FlashAttention cannot run here; ``paged_decode_reference`` is their call semantics in
torch (``indptr`` / ``indices`` / ``last_page_len`` over ``HND`` pages; ``block_table`` and
``cache_seqlens`` over ``NHD`` pages), so a wrong view, table or length changes the numbers. On a
GPU, tests/engine/paged/test_cuda.py runs the real kernels against the gathered path.
"""

import sys

import pytest
import torch

from kvbench.cache.base import CacheConfig
from kvbench.engine.native import native_kernels, native_kernels_reason
from kvbench.engine.paged.attention import (
    PagedForward,
    SequenceSlice,
    paged_attention_forward,
    skip_mask_creation,
)
from kvbench.engine.paged.config import AttentionKernel, PagedConfig
from kvbench.engine.paged.kernels import (
    KernelChoice,
    KvbenchCpuDecode,
    PageTables,
    choose_kernel,
    csr_page_table,
    hnd_pages,
    importable,
    nhd_pages,
    start_kernel,
)
from kvbench.engine.paged.kv_pool import KVPool
from kvbench.errors import InputError
from kvbench.memory.layout import DType, KvLayout

CUDA, CPU = torch.device("cuda"), torch.device("cpu")
BLOCK = 4
KV_HEADS, HEADS, HEAD_DIM = 2, 4, 8  # GQA 2:1
TOLERANCE = 1e-5  # fp32; masked padding vs exact lengths differ only by rounding
needs_native = pytest.mark.skipif(
    native_kernels() is None, reason=f"no native kernels here: {native_kernels_reason()}"
)


def probe_of(*installed):
    calls = []

    def probe(module):
        calls.append(module)
        return module in installed

    probe.calls = calls
    return probe


# ---------------------------------------------------------------- the choice


@needs_native
def test_the_cpu_in_fp32_gets_kvbench_s_kernel_without_importing_anything():
    probe = probe_of("flashinfer", "flash_attn")
    choice = choose_kernel(CPU, torch.float32, 16, 64, probe=probe)
    assert choice == KernelChoice(AttentionKernel.KVBENCH_CPU, "auto") and probe.calls == []


def test_the_cpu_without_the_native_kernels_or_in_bf16_keeps_the_gathered_path(monkeypatch):
    monkeypatch.setenv("KVBENCH_NATIVE_KERNELS", "0")
    probe = probe_of("flashinfer", "flash_attn")
    choice = choose_kernel(CPU, torch.float32, 16, 64, probe=probe)
    assert choice.kernel is AttentionKernel.SDPA_GATHERED and probe.calls == []
    assert choice.reason == (
        "flashinfer: needs a CUDA device (the pool is on cpu); "
        "flash-attn: needs a CUDA device (the pool is on cpu); "
        "kvbench-cpu: KVBENCH_NATIVE_KERNELS=0"
    )
    monkeypatch.delenv("KVBENCH_NATIVE_KERNELS")
    bf16 = choose_kernel(CPU, torch.bfloat16, 16, 64, probe=probe)
    assert bf16.kernel is AttentionKernel.SDPA_GATHERED
    assert bf16.reason.endswith("kvbench-cpu: computes in float32 (the pool is bfloat16)")
    with pytest.raises(
        InputError, match="^attention kernel kvbench-cpu: needs the CPU \\(the pool is on cuda\\)$"
    ):
        choose_kernel(CUDA, torch.float32, 16, 64, AttentionKernel.KVBENCH_CPU, probe=probe)


def test_fp32_on_cuda_keeps_the_gathered_path():
    choice = choose_kernel(CUDA, torch.float32, 16, 64, probe=probe_of("flashinfer", "flash_attn"))
    assert choice.kernel is AttentionKernel.SDPA_GATHERED
    assert "computes in float16 or bfloat16 (the pool is float32)" in choice.reason


@pytest.mark.parametrize(
    "installed, block_size, head_dim, expected",
    [
        # FlashInfer first, as vLLM's decode
        (
            ("flashinfer", "flash_attn"),
            16,
            64,
            AttentionKernel.FLASHINFER,
        ),
        (("flashinfer",), 32, 128, AttentionKernel.FLASHINFER),
        (("flash_attn",), 16, 64, AttentionKernel.SDPA_GATHERED),  # FA2's pages: multiples of 256 tokens
        (("flash_attn",), 256, 64, AttentionKernel.FLASH_ATTN),
        (("flashinfer", "flash_attn"), 256, 96, AttentionKernel.FLASH_ATTN),  # FlashInfer has no head_dim 96
        ((), 16, 64, AttentionKernel.SDPA_GATHERED),
    ],
)
def test_auto_picks_an_installed_kernel_that_takes_the_pool(installed, block_size, head_dim, expected):
    choice = choose_kernel(CUDA, torch.bfloat16, block_size, head_dim, probe=probe_of(*installed))
    assert choice.kernel is expected
    assert (
        choice.reason == "auto" if expected is not AttentionKernel.SDPA_GATHERED else choice.reason != "auto"
    )


def test_the_fallback_says_why_each_kernel_was_refused():
    choice = choose_kernel(CUDA, torch.float16, 16, 96, probe=probe_of("flash_attn"))
    assert choice.reason == (
        "flashinfer: head_dim 96 is not one of 64, 128, 256; "
        "flash-attn: pages must be a multiple of 256 tokens (--block-size 16); "
        "kvbench-cpu: needs the CPU (the pool is on cuda)"
    )


def test_a_requested_kernel_that_cannot_run_is_one_error_line():
    with pytest.raises(InputError, match="^attention kernel flashinfer: flashinfer is not installed$"):
        choose_kernel(CUDA, torch.bfloat16, 16, 64, AttentionKernel.FLASHINFER, probe=probe_of("flash_attn"))
    with pytest.raises(InputError, match="needs a CUDA device"):
        choose_kernel(CPU, torch.bfloat16, 256, 64, AttentionKernel.FLASH_ATTN, probe=probe_of("flash_attn"))
    forced = choose_kernel(
        CUDA, torch.bfloat16, 16, 64, AttentionKernel.SDPA_GATHERED, probe=probe_of("flashinfer")
    )
    assert forced.kernel is AttentionKernel.SDPA_GATHERED and forced.reason == "requested"


def test_the_probe_counts_a_wheel_that_fails_to_load_as_absent(tmp_path, monkeypatch):
    (tmp_path / "kvbench_broken_kernel.py").write_text(
        "raise OSError('libcudart.so.12: cannot open shared object')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert (
        importable("json")
        and not importable("kvbench_no_such_kernel")
        and not importable("kvbench_broken_kernel")
    )
    sys.modules.pop("kvbench_broken_kernel", None)


def test_the_paged_config_takes_the_kernel_by_name():
    pool = CacheConfig(capacity_blocks=8)
    assert PagedConfig(pool).attention_kernel is AttentionKernel.AUTO
    assert PagedConfig(pool, attention_kernel="flash-attn").attention_kernel is AttentionKernel.FLASH_ATTN
    with pytest.raises(ValueError, match="attention_kernel: 'cudnn' is not one of auto, sdpa-gathered"):
        PagedConfig(pool, attention_kernel="cudnn")


# ---------------------------------------------------------------- page tables and views


def test_csr_page_tables_count_only_the_blocks_a_sequence_fills():
    indptr, indices, last_page_len = csr_page_table([[5, 7, 9, 11], [3], [2, 4]], [9, 4, 5], BLOCK)
    assert indptr.tolist() == [0, 3, 4, 6]  # 9 tokens: 3 blocks (the 4th block id is not needed yet)
    assert indices.tolist() == [5, 7, 9, 3, 2, 4]
    assert last_page_len.tolist() == [1, 4, 1]  # 1 .. block_size, never 0
    assert {t.dtype for t in (indptr, indices, last_page_len)} == {torch.int32}
    with pytest.raises(ValueError, match="a table of 1 blocks of 4 cannot hold 5 tokens"):
        csr_page_table([[3]], [5], BLOCK)


def test_page_tables_pad_flash_attention_tables_with_the_null_block():
    tables = PageTables.of([[5, 7, 9, 11], [3]], [9, 4], BLOCK, CPU)
    assert tables.block_tables.tolist() == [[5, 7, 9], [3, 0, 0]] and tables.lengths.tolist() == [9, 4]
    assert tables.block_tables.dtype == torch.int32 == tables.lengths.dtype


def make_pool(num_blocks=32):
    return KVPool(KvLayout(1, KV_HEADS, HEAD_DIM, DType.FP32, BLOCK), num_blocks, CPU, torch.float32)


def test_the_kernel_layouts_are_views_of_the_pool():
    pool = make_pool()
    (hnd_k, hnd_v), (nhd_k, nhd_v) = hnd_pages(pool, 0), nhd_pages(pool, 0)
    assert hnd_k.shape == (33, KV_HEADS, BLOCK, HEAD_DIM) and nhd_k.shape == (33, BLOCK, KV_HEADS, HEAD_DIM)
    assert {t.data_ptr() for t in (hnd_k, nhd_k)} == {pool.keys[0].data_ptr()}  # no copy
    assert {t.data_ptr() for t in (hnd_v, nhd_v)} == {pool.values[0].data_ptr()}
    assert hnd_k.stride(-1) == nhd_k.stride(-1) == 1  # what both kernels require of a cache's strides
    pool.write(
        0,
        torch.tensor([6]),
        torch.tensor([2]),
        torch.ones(KV_HEADS, 1, HEAD_DIM),
        torch.zeros(KV_HEADS, 1, HEAD_DIM),
    )
    assert hnd_k[6, :, 2].eq(1).all() and nhd_k[6, 2].eq(1).all()  # block 6, offset 2, every head


def paged_decode_reference(query, pages_k, pages_v, tables: PageTables, layout: str, scaling):
    """The kernels' call, in torch: ``query`` ``(n, heads, d)`` over each sequence's pages, read only
    through the page table (FlashInfer: CSR over ``HND`` pages; FlashAttention: ``block_table`` and
    ``cache_seqlens`` over ``NHD`` pages). Returns ``(n, heads, d)``."""
    outputs = []
    for i in range(query.shape[0]):
        if layout == "HND":
            pages = tables.indices[tables.indptr[i] : tables.indptr[i + 1]].long()
            length = (len(pages) - 1) * BLOCK + int(tables.last_page_len[i])
            keys = pages_k[pages].transpose(0, 1).flatten(1, 2)[:, :length]  # (kv_heads, kv, d)
            values = pages_v[pages].transpose(0, 1).flatten(1, 2)[:, :length]
        else:
            length = int(tables.lengths[i])
            pages = tables.block_tables[i, : -(-length // BLOCK)].long()
            keys = pages_k[pages].flatten(0, 1)[:length].transpose(0, 1)  # (kv_heads, kv, d)
            values = pages_v[pages].flatten(0, 1)[:length].transpose(0, 1)
        rep = query.shape[1] // keys.shape[0]
        # (heads, 1, kv)
        scores = query[i][:, None] @ keys.repeat_interleave(rep, 0).transpose(1, 2) * scaling
        outputs.append((scores.softmax(-1) @ values.repeat_interleave(rep, 0))[:, 0])  # (heads, d)
    return torch.stack(outputs)


class ReferenceKernel:
    """A decode kernel with FlashInfer's semantics (``attend`` as in kernels.py), in torch."""

    kernel = AttentionKernel.FLASHINFER

    def __init__(self, pool):
        self.pool, self.calls = pool, 0

    def attend(self, layer, query, tables, scaling):
        self.calls += 1
        return paged_decode_reference(query, *hnd_pages(self.pool, layer), tables, "HND", scaling)


def decoding_batch(lengths, seed=0):
    """A pool with sequences of ``lengths`` tokens (scattered, non-contiguous blocks), one query each."""
    pool, gen = make_pool(), torch.Generator().manual_seed(seed)
    free = torch.randperm(32, generator=gen) + 1
    slices, queries, start = [], [], 0
    for i, length in enumerate(lengths):
        table = free[start : start + -(-length // BLOCK)]
        start += len(table)
        positions = torch.arange(length)
        keys, values = torch.randn(2, KV_HEADS, length, HEAD_DIM, generator=gen)
        pool.write(0, table[positions // BLOCK], positions % BLOCK, keys, values)
        slices.append(SequenceSlice(i, 1, table, length))
        queries.append(torch.randn(HEADS, 1, HEAD_DIM, generator=gen))
    return pool, slices, torch.cat(queries, 1)  # query: (heads, n, d)


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_the_kernels_call_semantics_equal_the_pools_gather(layout):
    lengths = (9, 1, 16, 13)
    pool, slices, query = decoding_batch(lengths)
    tables = PageTables.of([s.block_table.tolist() for s in slices], lengths, BLOCK, CPU)
    pages = hnd_pages(pool, 0) if layout == "HND" else nhd_pages(pool, 0)
    # (n, heads, d)
    out = paged_decode_reference(query.transpose(0, 1), *pages, tables, layout, HEAD_DIM**-0.5)
    for i, seq in enumerate(slices):
        keys, values = pool.gather(0, seq.block_table, seq.num_context_tokens)  # (1, kv_heads, kv, d)
        # (1, heads, 1, d)
        ref = torch.nn.functional.scaled_dot_product_attention(
            query[None, :, i : i + 1], keys, values, enable_gqa=True
        )
        assert (out[i] - ref[0, :, 0]).abs().max().item() < TOLERANCE


class Attention(torch.nn.Module):
    layer_idx, is_causal, num_key_value_groups = 0, True, HEADS // KV_HEADS


def test_a_kernel_attends_the_batched_decode_and_its_rows_land_in_place():
    lengths = (9, 1, 16, 13)
    pool, slices, query = decoding_batch(lengths, seed=1)
    slot_blocks = torch.stack([s.block_table[(n - 1) // BLOCK] for s, n in zip(slices, lengths)])  # (n,)
    slot_offsets = torch.tensor([(n - 1) % BLOCK for n in lengths])  # (n,)
    # each sequence's last token's K/V, which the forward writes: what the pool already holds there
    new_keys, new_values = (t[:, slot_blocks, slot_offsets][None] for t in (pool.keys[0], pool.values[0]))
    outputs = {}
    for name, kernel in (("gathered", None), ("kernel", ReferenceKernel(pool))):
        plan = PagedForward.plan(pool, slot_blocks, slot_offsets, slices, batch_decodes=True, kernel=kernel)
        out, _ = paged_attention_forward(
            Attention(),
            query[None],
            new_keys,
            new_values,
            skip_mask_creation(CPU),
            scaling=HEAD_DIM**-0.5,
            kvbench_paged=plan,
        )
        outputs[name] = out[0]  # (n, heads, d)
    assert kernel.calls == 1 and plan.page_tables.indptr.tolist() == [0, 3, 4, 8, 12]
    assert (outputs["kernel"] - outputs["gathered"]).abs().max().item() < TOLERANCE


def test_start_kernel_on_the_cpu_without_native_kernels_gives_no_kernel_object(monkeypatch):
    monkeypatch.setenv("KVBENCH_NATIVE_KERNELS", "0")
    choice, kernel = start_kernel(make_pool(), probe=probe_of("flashinfer", "flash_attn"))
    assert choice.kernel is AttentionKernel.SDPA_GATHERED and kernel is None


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("lengths", [(9, 1, 16, 13), (4, 4), (1,), (31, 2, 17)])
def test_kvbench_s_cpu_kernel_reads_the_blocks_in_place_and_equals_the_pools_gather(lengths, threads):
    pool, slices, query = decoding_batch(lengths, seed=len(lengths))
    choice, kernel = start_kernel(pool)
    assert choice.kernel is AttentionKernel.KVBENCH_CPU and isinstance(kernel, KvbenchCpuDecode)
    tables = PageTables.of([s.block_table.tolist() for s in slices], lengths, BLOCK, CPU)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = kernel.attend(0, query.transpose(0, 1), tables, HEAD_DIM**-0.5)  # (n, heads, d)
    finally:
        torch.set_num_threads(before)
    assert out.shape == (len(lengths), HEADS, HEAD_DIM)
    for i, seq in enumerate(slices):
        keys, values = pool.gather(0, seq.block_table, seq.num_context_tokens)  # (1, kv_heads, kv, d)
        # (1, heads, 1, d)
        ref = torch.nn.functional.scaled_dot_product_attention(
            query[None, :, i : i + 1], keys, values, enable_gqa=True
        )
        assert (out[i] - ref[0, :, 0]).abs().max().item() < TOLERANCE


@needs_native
def test_on_the_cpu_the_kernel_batches_the_decodes_and_leaves_a_lone_one_exact():
    lengths = (9, 1, 16, 13)
    pool, slices, _ = decoding_batch(lengths, seed=1)
    _, kernel = start_kernel(pool)
    slot_blocks = torch.stack([s.block_table[(n - 1) // BLOCK] for s, n in zip(slices, lengths)])  # (n,)
    slot_offsets = torch.tensor([(n - 1) % BLOCK for n in lengths])  # (n,)
    batched = PagedForward.plan(pool, slot_blocks, slot_offsets, slices, kernel=kernel)
    assert batched.decode is not None and batched.kernel is kernel and batched.sequences == ()
    lone = PagedForward.plan(pool, slot_blocks[:1], slot_offsets[:1], slices[:1], kernel=kernel)
    assert lone.decode is None and len(lone.sequences) == 1  # one sequence: the copy engine's path
