"""Cache hygiene: keep earlier runs' (and other users') cache entries from making a run look faster.

Applied before expectations are computed: ``salt`` sends a per-run ``cache_salt`` (the backend's
``run_salt``; the prompt tokens are unchanged); ``nonce`` puts a per-run line at the very start of
every prompt (:func:`with_nonce`), which changes every prompt's tokens and so its length and block
boundaries; ``off`` sends the trace as is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from enum import Enum

import numpy as np

from kvbench.request import Message, Request
from kvbench.workloads.tokenizer import Tokenizer


class Hygiene(str, Enum):
    """How a run keeps earlier runs' (and other users') cache entries from making it look faster."""

    SALT = "salt"  # a per-run cache_salt in every request (vLLM); the prompt tokens are unchanged
    NONCE = "nonce"  # a per-run line at the very start of every prompt; works on any server
    OFF = "off"  # the trace as is: hits on blocks from earlier runs count


def nonce_line(nonce: str) -> str:
    """The line :func:`with_nonce` puts first in every prompt."""
    return f"[kvbench run {nonce}]\n"


def with_nonce(requests: Sequence[Request], nonce: str, tokenizer: Tokenizer) -> list[Request]:
    """``requests`` with :func:`nonce_line` at the very start of every prompt: prefixed to the first
    message's content (chat), to the prompt text, or as its tokens before the token ids (token-id
    workloads). Prompts are re-rendered with ``tokenizer``, so ``token_ids`` match what is sent.

    With ChatML (cl100k) only 3 template tokens precede the nonce, less than a block. A chat template
    that writes a block or more of fixed text before the first message's content (Llama 3.1's date
    preamble) leaves those blocks shared between runs: prefer the salt where the server takes it."""
    line = nonce_line(nonce)
    line_ids = np.asarray(tokenizer.encode(line), dtype=np.uint32)
    changed = []
    for request in requests:
        if request.messages is not None:
            first, *rest = request.messages
            request = replace(request, messages=(Message(first.role, line + first.content), *rest))
        elif request.prompt is not None:
            request = replace(request, prompt=line + request.prompt)
        else:
            changed.append(replace(request, token_ids=np.concatenate([line_ids, request.token_ids])))
            continue
        changed.append(replace(request, token_ids=tokenizer.render(request)))
    return changed
