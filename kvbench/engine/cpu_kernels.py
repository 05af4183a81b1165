"""Three CPU fixes the engines' forwards need to run at the speed of the hardware.

1. **Freed activations stay in the process** (:func:`keep_freed_memory`). glibc serves an
   allocation above its mmap threshold (128 KiB, raised adaptively up to 32 MiB) with a fresh
   ``mmap`` and returns it to the kernel on free, so every forward faults in its activations again,
   page by page: measured on the default model, a 2,000-token prefill took 47k-116k minor faults and
   105-266 ms of system time per forward (of ~1,450 ms). ``mallopt(M_MMAP_THRESHOLD, 1 GiB)`` and
   ``mallopt(M_TRIM_THRESHOLD, 2 GiB)`` keep such buffers in the heap for reuse, and
   ``mallopt(M_ARENA_MAX, 1)`` makes the paged engine's worker thread use that heap too (a thread's
   own arena is at most 64 MiB, so its larger buffers were mmapped whatever the threshold): from the
   second forward on, 0-342 faults and 0-19 ms of system time. (PyTorch's own advice for CPU inference is the
   same, through jemalloc or
   tcmalloc in ``LD_PRELOAD``; vLLM's CPU backend asks for tcmalloc.) Applied once, on Linux with
   glibc; a no-op elsewhere. It changes no value that is computed.
2. **Linears over a few rows** (:class:`FewRowLinear`, :func:`use_few_row_linears`). A decode
   step over ``n`` sequences multiplies ``n`` rows by every weight: memory bound, one pass over
   each weight is the floor. MKL's sgemm packs the weight again at every call for a few rows, and
   oneDNN without prepacked weights reads it at about half the one-row speed; kvbench's own kernel
   (:mod:`kvbench.engine.native`, numbers there) reads each weight once whatever ``n``. Every fp32
   CPU linear of the model runs it for :data:`FEW_ROWS` rows; one row (every copy-engine decode,
   the paged engine at concurrency 1) stays MKL's GEMV, as fast and the same bits as before. Where
   the kernel cannot be built, the LM head alone falls back to oneDNN's matmul for
   :data:`SMALL_BATCH_ROWS` rows (:class:`SmallBatchLinear`: default model, 1 thread, CPU ms, n=8:
   MKL 88, oneDNN 40). A batched forward's logits differ from the one-row ones in the last bits, as
   every packed forward's already may (``--verify`` tells the resulting argmax flips near ties
   from mismatches).
3. **Grouped-query attention without copies** (:func:`use_native_gqa`). Whenever a mask is passed
   (a prefill after a cached prefix, a chunk), transformers' SDPA path repeats each K/V head for its
   query heads (``repeat_kv``: 4 copies on the default model) before calling SDPA;
   ``TRANSFORMERS_SDPA_FORCE_GQA=1`` makes it pass ``enable_gqa=True`` instead, which torch's CPU
   kernel reads in place. Same bits (checked on 66 x 2,050, 300 x 300, 349 x 700 and 1 x 2,050
   queries x keys), less time: 66 new tokens after 2,050 cached, one layer, 4.6 -> 3.0 ms. Set for
   CPU models unless the user set the variable (on CUDA transformers keeps its own choice: masked
   GQA would fall back to the math kernel there).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

import torch
from torch import nn

from kvbench.engine.native import native_kernels

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc malloc.h
MMAP_THRESHOLD_BYTES = 1 << 30  # allocations below this come from the heap and are reused after free
TRIM_THRESHOLD_BYTES = (1 << 31) - 1  # free heap kept before glibc trims it back to the kernel
SMALL_BATCH_ROWS = range(3, 49)  # measured: MKL is as fast for 1-2 rows and from ~64 rows on
FEW_ROWS = range(2, 49)  # kvbench's kernel; one row stays MKL's GEMV (as fast, and the same bits as before)
# beyond any core's share of the caches: the LM head of a large vocabulary
SMALL_BATCH_MIN_WEIGHT_BYTES = 16 << 20

_memory_kept = False


def keep_freed_memory() -> bool:
    """Keep freed large buffers in the heap (module docstring, item 1); once per process.
    Returns whether glibc accepted both settings (``False`` off Linux or without glibc)."""
    global _memory_kept
    if _memory_kept:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    settings = (
        (M_ARENA_MAX, 1),
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
    )
    _memory_kept = all([bool(mallopt(option, value)) for option, value in settings])
    return _memory_kept


def onednn_linear_available() -> bool:
    """Whether this torch build has oneDNN's fused linear (``torch.ops.mkldnn._linear_pointwise``, the
    op inductor emits for CPU linears) and it runs on a tiny input."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    try:
        with torch.inference_mode():
            torch.ops.mkldnn._linear_pointwise(torch.ones(3, 4), torch.ones(2, 4), None, "none", [None], "")
    except (RuntimeError, NotImplementedError):
        return False
    return True


class SmallBatchLinear(nn.Linear):
    """An ``nn.Linear`` whose forward over :data:`SMALL_BATCH_ROWS` rows runs oneDNN's matmul (module
    docstring, item 2); same parameters, same state dict. Made by :func:`use_small_batch_lm_head`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        num_rows = x.numel() // self.in_features if self.in_features else 0
        if num_rows not in SMALL_BATCH_ROWS or x.device.type != "cpu" or x.dtype != self.weight.dtype:
            return nn.functional.linear(x, self.weight, self.bias)
        out = torch.ops.mkldnn._linear_pointwise(
            x.reshape(num_rows, self.in_features), self.weight, self.bias, "none", [None], ""
        )
        return out.reshape(*x.shape[:-1], self.out_features)


class FewRowLinear(nn.Linear):
    """An ``nn.Linear`` whose forward over :data:`FEW_ROWS` rows of fp32 on the CPU runs kvbench's
    few-row kernel (:mod:`kvbench.engine.native`); same parameters, same state dict, torch's
    ``linear`` for every other input (and wherever autograd records: the kernel has no backward).
    Made by :func:`use_few_row_linears`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        num_rows = x.numel() // self.in_features if self.in_features else 0
        # no autograd
        if (
            num_rows in FEW_ROWS
            and x.dtype == self.weight.dtype == torch.float32
            and x.device.type == "cpu"
            and not (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))
        ):
            kernel = native_kernels()
            if kernel is not None:
                return kernel.linear(x, self.weight, self.bias)
        return nn.functional.linear(x, self.weight, self.bias)


def use_few_row_linears(model: nn.Module) -> int:
    """Make every fp32 CPU ``nn.Linear`` of ``model`` with a contiguous weight a :class:`FewRowLinear`
    in place (its class only: weights, ties and the state dict stay) when kvbench's kernel is built
    (:func:`~kvbench.engine.native.native_kernels`; it is built here on first use). Returns how
    many linears use it now (0 where the kernel is missing: then the caller falls back to
    :func:`use_small_batch_lm_head`)."""
    linears = [
        module for module in model.modules() if type(module) in (nn.Linear, SmallBatchLinear, FewRowLinear)
    ]
    usable = [
        linear
        for linear in linears
        if linear.weight.device.type == "cpu"
        and linear.weight.dtype == torch.float32
        and linear.weight.is_contiguous()
    ]
    if not usable or native_kernels() is None:
        return 0
    for linear in usable:
        linear.__class__ = FewRowLinear
    return len(usable)


def use_small_batch_lm_head(model: nn.Module) -> bool:
    """Make ``model``'s output embedding a :class:`SmallBatchLinear` in place (its class only: the
    weight, tied or not, and the state dict stay) when it is an ``nn.Linear`` on the CPU whose weight
    exceeds :data:`SMALL_BATCH_MIN_WEIGHT_BYTES` and oneDNN's linear is available. Idempotent;
    returns whether the head is one now."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, SmallBatchLinear):
        return True
    if type(head) is not nn.Linear or head.weight.device.type != "cpu":
        return False
    if (
        head.weight.numel() * head.weight.element_size() < SMALL_BATCH_MIN_WEIGHT_BYTES
        or not onednn_linear_available()
    ):
        return False
    head.__class__ = SmallBatchLinear
    return True


GQA_VARIABLE = (
    "TRANSFORMERS_SDPA_FORCE_GQA"  # read by transformers' sdpa_attention.use_gqa_in_sdpa at each call
)


def use_native_gqa(device: torch.device) -> bool:
    """Let transformers' SDPA read grouped K/V heads in place on the CPU (module docstring, item 3);
    a user's own setting of :data:`GQA_VARIABLE` wins. Returns whether it is on now."""
    if device.type == "cpu":
        os.environ.setdefault(GQA_VARIABLE, "1")
    return os.environ.get(GQA_VARIABLE) == "1"
