"""The engines' timestamps: a reading of ``time.perf_counter`` taken once the device has finished.

CUDA (and MPS) run kernels asynchronously: a Python line after a forward runs as soon as the kernels
are *queued*, so a bare ``perf_counter`` there measures launches, not the work (PyTorch's CUDA
semantics notes: "asynchronous execution"). Every TTFT, ITL, prefill and E2E stamp of both engines is
taken through :func:`stamp_s`, which synchronizes the device first; on the CPU it is
``perf_counter`` alone. (Sampling a token with ``int(...)`` already waits for its logits, so the
token stamps were right before; the prefill stamp of the copy engine was not.)
"""

from __future__ import annotations

import time

import torch


def stamp_s(device: torch.device) -> float:
    """``time.perf_counter()`` in seconds, after every kernel queued on ``device`` has finished."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
    return time.perf_counter()
