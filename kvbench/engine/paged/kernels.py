"""The kernel the paged engine's batched decode attends with: a paged-KV kernel on CUDA where one is
installed, torch SDPA over gathered blocks everywhere else.

Chosen once, at engine start (:func:`choose_kernel`), and reported as ``run.engine.attention_kernel``:

* ``flashinfer``: ``flashinfer.BatchDecodeWithPagedKVCacheWrapper`` in the ``HND`` layout,
  ``(pages, kv_heads, page_size, head_dim)``. The pool's per-layer tensor is ``(kv_heads, pages,
  block_size, head_dim)``, so ``transpose(0, 1)`` is that layout as a view (no copy): FlashInfer reads
  the page, head and token strides of the tensor it is given (``paged_kv_t``'s strides; its docs:
  docs.flashinfer.ai/api/decode.html). Block tables go as its CSR page table
  (:func:`csr_page_table`). fp16 / bf16 only; head_dim 64, 128 or 256.
* ``flash-attn``: ``flash_attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=...,
  block_table=...)``, paged layout ``(pages, page_block_size, kv_heads, head_dim)``:
  ``permute(1, 2, 0, 3)`` of the pool's tensor, again a view (the last dimension stays contiguous,
  which is all the kernel requires of the cache's strides). Its docstring requires
  ``page_block_size`` to be a multiple of 256 (FlashAttention 2), so kvbench's 16- and 32-token blocks
  never choose it; ``--block-size 256`` does. fp16 / bf16 only.
* ``kvbench-cpu``: kvbench's own paged decode for fp32 pools on the CPU
  (:meth:`kvbench.engine.native.NativeKernels.paged_decode`): every decoding sequence's query
  against its blocks, read in place by block table, one call per layer (the pool's own
  ``(kv_heads, pages, block_size, head_dim)`` tensor, no view needed). It replaces a copy of each
  sequence's K/V (``index_select``) and one SDPA call per sequence per layer. Default model, 1
  thread, one layer, thread CPU ms, medians of 7: 8 sequences of 500 tokens 1.61 -> 0.65, 8 of
  2,000 7.52 -> 2.23 (``benchmarks/cpu_kernels_bench.py``, 2026-12-02). Chosen where the native kernels are
  built.
* ``sdpa-gathered``: the fallback: each layer copies the decoding sequences' blocks out of the pool
  by block table and runs SDPA (:mod:`kvbench.engine.paged.attention`): one masked call over the
  padded batch on a GPU (:meth:`KVPool.gather_padded`), one call per sequence on the CPU.

A kernel replaces the batched decode only: prefill chunks and a lone decode keep the gathered SDPA
path, so a forward of one sequence (concurrency 1, ``--batch-invariant``) computes exactly what it
computed before.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kvbench.engine.native import native_kernels, native_kernels_reason
from kvbench.engine.paged.config import AttentionKernel
from kvbench.engine.paged.kv_pool import NULL_BLOCK_ID, KVPool
from kvbench.errors import InputError

KERNEL_MODULES = {AttentionKernel.FLASHINFER: "flashinfer", AttentionKernel.FLASH_ATTN: "flash_attn"}
AUTO_ORDER = (AttentionKernel.FLASHINFER, AttentionKernel.FLASH_ATTN, AttentionKernel.KVBENCH_CPU)
KERNEL_DTYPES = (torch.float16, torch.bfloat16)  # what both kernels compute in; fp32 stays on SDPA
FLASHINFER_HEAD_DIMS = (64, 128, 256)  # FlashInfer's compiled decode head dims
FLASH_ATTN_PAGE_MULTIPLE = 256  # flash_attn_with_kvcache: "page_block_size must be a multiple of 256"
FLASHINFER_WORKSPACE_BYTES = 128 * 1024 * 1024  # the size FlashInfer's own examples allocate


@dataclass(frozen=True)
class KernelChoice:
    """Which kernel the batched decode runs, and why (``run.engine.attention_kernel`` /
    ``attention_kernel_reason``)."""

    kernel: AttentionKernel
    reason: str


def importable(module: str) -> bool:
    """Whether ``module`` imports here. A wheel built for another CUDA or torch fails with ``OSError``
    or ``RuntimeError`` rather than ``ImportError``; any failure means the kernel is not there."""
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - see above
        return False
    return True


def choose_kernel(
    device: torch.device,
    dtype: torch.dtype,
    block_size: int,
    head_dim: int,
    requested: AttentionKernel = AttentionKernel.AUTO,
    probe: Callable[[str], bool] | None = None,
) -> KernelChoice:
    """The kernel for a pool on ``device`` in ``dtype``. ``auto``: FlashInfer, else FlashAttention, where
    installed (``probe``: :func:`importable`) and where they take the pool's dtype, head_dim and block
    size; on the CPU in fp32, ``kvbench-cpu`` where the native kernels are built; else ``sdpa-gathered``. A
    kernel named in ``requested`` is used if it can be, else
    :class:`InputError` says why."""
    probe = importable if probe is None else probe
    if requested is AttentionKernel.SDPA_GATHERED:
        return KernelChoice(requested, "requested")
    refusals = {}
    for kernel in AUTO_ORDER:
        if requested in (AttentionKernel.AUTO, kernel):
            refusals[kernel] = _refusal(kernel, device, dtype, block_size, head_dim, probe)
            if refusals[kernel] is None:
                return KernelChoice(kernel, "auto" if requested is AttentionKernel.AUTO else "requested")
    if requested is not AttentionKernel.AUTO:
        raise InputError(f"attention kernel {requested.value}: {refusals[requested]}")
    return KernelChoice(
        AttentionKernel.SDPA_GATHERED, "; ".join(f"{k.value}: {why}" for k, why in refusals.items())
    )


def _refusal(
    kernel: AttentionKernel,
    device: torch.device,
    dtype: torch.dtype,
    block_size: int,
    head_dim: int,
    probe: Callable[[str], bool],
) -> str | None:
    """Why ``kernel`` cannot serve this pool, or ``None``; the cheap checks first, the import last."""
    if kernel is AttentionKernel.KVBENCH_CPU:
        if device.type != "cpu":
            return f"needs the CPU (the pool is on {device.type})"
        if dtype != torch.float32:
            return f"computes in float32 (the pool is {str(dtype).removeprefix('torch.')})"
        return None if native_kernels() is not None else native_kernels_reason()
    if device.type != "cuda":
        return f"needs a CUDA device (the pool is on {device.type})"
    if dtype not in KERNEL_DTYPES:
        return f"computes in float16 or bfloat16 (the pool is {str(dtype).removeprefix('torch.')})"
    if kernel is AttentionKernel.FLASHINFER and head_dim not in FLASHINFER_HEAD_DIMS:
        return f"head_dim {head_dim} is not one of {', '.join(map(str, FLASHINFER_HEAD_DIMS))}"
    if kernel is AttentionKernel.FLASH_ATTN and block_size % FLASH_ATTN_PAGE_MULTIPLE:
        return f"pages must be a multiple of {FLASH_ATTN_PAGE_MULTIPLE} tokens (--block-size {block_size})"
    if not probe(KERNEL_MODULES[kernel]):
        return f"{KERNEL_MODULES[kernel]} is not installed"
    return None


# ---------------------------------------------------------------- page tables in the kernels' forms


@dataclass(frozen=True)
class PageTables:
    """One forward's decoding sequences (one query token each) in the forms the kernels read.

    Attributes:
        block_tables: ``(n, max_blocks)`` int32, each padded with the null block (flash-attn's
            ``block_table``).
        lengths: ``(n,)`` int32, context tokens per sequence, the new token included (``cache_seqlens``).
        indptr / indices / last_page_len: FlashInfer's CSR page table (:func:`csr_page_table`).
    """

    block_tables: torch.Tensor
    lengths: torch.Tensor
    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor

    @classmethod
    def of(
        cls, tables: Sequence[Sequence[int]], lengths: Sequence[int], block_size: int, device: torch.device
    ) -> PageTables:
        """``tables``: each sequence's block ids (at least enough for its length); ``lengths``: its
        context tokens. Index tensors on ``device``; ``indptr`` and ``last_page_len`` stay on the
        CPU too, where FlashInfer's ``plan`` reads them."""
        indptr, indices, last_page_len = csr_page_table(tables, lengths, block_size)
        used = _used_blocks(tables, lengths, block_size)
        width = max(len(blocks) for blocks in used)
        padded = [blocks + [NULL_BLOCK_ID] * (width - len(blocks)) for blocks in used]
        return cls(
            torch.tensor(padded, dtype=torch.int32, device=device),  # (n, max_blocks)
            torch.tensor(list(lengths), dtype=torch.int32, device=device),  # (n,)
            indptr,
            indices.to(device),
            last_page_len,
        )


def _used_blocks(tables: Sequence[Sequence[int]], lengths: Sequence[int], block_size: int) -> list[list[int]]:
    """Each table cut to the ``ceil(length / block_size)`` blocks its tokens occupy."""
    return [[int(b) for b in table[: -(-length // block_size)]] for table, length in zip(tables, lengths)]


def csr_page_table(
    tables: Sequence[Sequence[int]], lengths: Sequence[int], block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Block tables as FlashInfer's CSR page table, all int32 on the CPU: ``indptr`` ``(n + 1,)``
    (sequence i's pages are ``indices[indptr[i]:indptr[i + 1]]``), ``indices`` ``(pages,)`` and
    ``last_page_len`` ``(n,)`` (tokens in each sequence's last page, 1 .. ``block_size``).

    Raises:
        ValueError: a length is not positive, or a table has fewer blocks than its length needs.
    """
    used = _used_blocks(tables, lengths, block_size)
    for length, table, blocks in zip(lengths, tables, used):
        if length < 1 or len(blocks) * block_size < length:
            raise ValueError(f"a table of {len(table)} blocks of {block_size} cannot hold {length} tokens")
    counts = torch.tensor([len(blocks) for blocks in used], dtype=torch.int32)  # (n,)
    indptr = torch.zeros(len(used) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(counts, 0)
    indices = torch.tensor([b for blocks in used for b in blocks], dtype=torch.int32)  # (pages,)
    last_page_len = torch.tensor([(length - 1) % block_size + 1 for length in lengths], dtype=torch.int32)
    return indptr, indices, last_page_len


def hnd_pages(pool: KVPool, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer ``layer``'s keys and values as ``(pages, kv_heads, block_size, head_dim)`` views
    (FlashInfer's ``HND``); page 0 is the null block."""
    return pool.keys[layer].transpose(0, 1), pool.values[layer].transpose(0, 1)


def nhd_pages(pool: KVPool, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer ``layer``'s keys and values as ``(pages, block_size, kv_heads, head_dim)`` views
    (FlashAttention's paged layout)."""
    return pool.keys[layer].permute(1, 2, 0, 3), pool.values[layer].permute(1, 2, 0, 3)


# ---------------------------------------------------------------- the kernels


class FlashInferDecode:
    """FlashInfer's batched paged decode over one pool; planned once per forward, run per layer."""

    kernel = AttentionKernel.FLASHINFER

    def __init__(self, pool: KVPool) -> None:
        import flashinfer

        self.pool = pool
        device = pool.keys[0].device
        workspace = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "HND")
        self._planned: PageTables | None = None

    def attend(
        self, layer: int, query: torch.Tensor, tables: PageTables, scaling: float | None
    ) -> torch.Tensor:
        """``query`` ``(n, heads, head_dim)`` -> ``(n, heads, head_dim)``. The first layer of a forward
        plans (``tables`` is that forward's), the others reuse the plan."""
        if self._planned is not tables:
            layout = self.pool.layout
            self._wrapper.plan(
                tables.indptr,
                tables.indices,
                tables.last_page_len,
                query.shape[1],
                layout.num_kv_heads,
                layout.head_dim,
                self.pool.block_size,
                q_data_type=query.dtype,
                data_type=query.dtype,
                sm_scale=scaling,
            )
            self._planned = tables
        run = getattr(self._wrapper, "run", None) or self._wrapper.forward  # FlashInfer < 0.2: forward
        return run(query.contiguous(), hnd_pages(self.pool, layer))


class FlashAttnDecode:
    """FlashAttention's ``flash_attn_with_kvcache`` over the pool's blocks, one call per layer."""

    kernel = AttentionKernel.FLASH_ATTN

    def __init__(self, pool: KVPool) -> None:
        from flash_attn import flash_attn_with_kvcache

        self.pool = pool
        self._call = flash_attn_with_kvcache

    def attend(
        self, layer: int, query: torch.Tensor, tables: PageTables, scaling: float | None
    ) -> torch.Tensor:
        """``query`` ``(n, heads, head_dim)`` -> ``(n, heads, head_dim)``."""
        keys, values = nhd_pages(self.pool, layer)
        # (n, 1, heads, head_dim)
        out = self._call(
            query[:, None].contiguous(),
            keys,
            values,
            cache_seqlens=tables.lengths,
            block_table=tables.block_tables,
            softmax_scale=scaling,
            causal=True,
        )
        return out[:, 0]


class KvbenchCpuDecode:
    """kvbench's paged decode (:mod:`kvbench.engine.native`) over the pool's blocks, one call per layer."""

    kernel = AttentionKernel.KVBENCH_CPU

    def __init__(self, pool: KVPool) -> None:
        native = native_kernels()
        if native is None:
            raise InputError(f"attention kernel {self.kernel.value}: {native_kernels_reason()}")
        self.pool, self._native = pool, native

    def attend(
        self, layer: int, query: torch.Tensor, tables: PageTables, scaling: float | None
    ) -> torch.Tensor:
        """``query`` ``(n, heads, head_dim)`` -> ``(n, heads, head_dim)``."""
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        return self._native.paged_decode(
            query, self.pool.keys[layer], self.pool.values[layer], tables.block_tables, tables.lengths, scale
        )


# ``attend(layer, query, tables, scaling)``
DecodeKernel = FlashInferDecode | FlashAttnDecode | KvbenchCpuDecode
DECODE_KERNELS = {
    AttentionKernel.FLASHINFER: FlashInferDecode,
    AttentionKernel.FLASH_ATTN: FlashAttnDecode,
    AttentionKernel.KVBENCH_CPU: KvbenchCpuDecode,
}


def start_kernel(
    pool: KVPool,
    requested: AttentionKernel = AttentionKernel.AUTO,
    probe: Callable[[str], bool] | None = None,
) -> tuple[KernelChoice, DecodeKernel | None]:
    """:func:`choose_kernel` for ``pool`` and the kernel object (``None`` for ``sdpa-gathered``)."""
    first = pool.keys[0]
    choice = choose_kernel(first.device, first.dtype, pool.block_size, pool.layout.head_dim, requested, probe)
    kernel_class = DECODE_KERNELS.get(choice.kernel)
    return choice, kernel_class(pool) if kernel_class is not None else None
