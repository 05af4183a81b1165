"""Torch's intra-op thread count for a block of work (``--threads`` of run, sweep and serve).

On a busy machine more threads than free cores hurt most where each forward is small (warm
requests: only a few tokens to prefill): the threads wait on each other at every op (issue 18 saw
identical warm requests take 54 to 1,460 ms on a loaded 2-core machine). torch defaults to one
thread per core. ``None`` leaves torch alone and does not import it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from kvbench.errors import InputError


def check_threads(num_threads: int | None, option: str = "--threads") -> int | None:
    """``num_threads`` if ``None`` or positive. Raises :class:`InputError` naming ``option`` otherwise."""
    if num_threads is not None and (isinstance(num_threads, bool) or num_threads < 1):
        raise InputError(f"{option}: {num_threads} is not a positive number of threads")
    return num_threads


@contextlib.contextmanager
def torch_threads(num_threads: int | None) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(num_threads)``, restoring the previous count after.

    Raises:
        InputError: ``num_threads`` is not positive.
    """
    if check_threads(num_threads) is None:
        yield
        return
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
