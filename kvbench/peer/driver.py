"""How the peer harness sends a comparison: its trace as kvbench :class:`Request` s, through a backend
and the one send loop (:func:`kvbench.run.loop.send_requests`; concurrency 1 unless asked).

The harness has no client or loop of its own. Against vLLM the backend is
:class:`kvbench.backends.openai.client.OpenAIBackend` (:func:`vllm_backend`): streamed, with
``stream_options.include_usage``, ``ignore_eos`` (output lengths are exactly ``max_tokens``, which the
simulator needs), each request's ``cache_salt``, and vLLM's ``return_token_ids``, so the record
carries the prompt ids vLLM prefilled and a tokenization difference is caught per request. The
engine comparison drives ``kvbench serve`` with the same backend (it ignores ``return_token_ids``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from kvbench.backends.base import Backend
from kvbench.backends.openai.client import OpenAIBackend, OpenAIConfig
from kvbench.request import Message, Request, RequestRecord
from kvbench.run.loop import LoadConfig, OnRecord, send_requests
from kvbench.workloads.tokenizer import Tokenizer

REQUEST_TIMEOUT_S = 600.0  # a cold 2k-token prefill on 2 CPU cores takes seconds, not minutes
WARM_UP_SALT = "kvbench-warm-up"  # its own namespace: the warm-up never hits or feeds a comparison


def warm_up_request(tokenizer: Tokenizer) -> Request:
    """One short chat request (2 output tokens) in :data:`WARM_UP_SALT`'s namespace, sent before the
    first comparison so that one-time costs do not land on a measured request."""
    messages = (Message("user", "warm up " * 16),)
    return Request(
        0,
        "warm-up",
        "warm-up",
        0,
        tokenizer.render_messages(messages),
        max_tokens=2,
        salt=WARM_UP_SALT,
        messages=messages,
    )


def vllm_backend(base_url: str, model: str, tokenizer: Tokenizer, block_size: int) -> OpenAIBackend:
    """The OpenAI backend as the peer uses it on vLLM: greedy, ``ignore_eos``, ``return_token_ids``,
    the requests' own salts (no run salt), no retries."""
    config = OpenAIConfig(
        base_url,
        model,
        timeout_s=REQUEST_TIMEOUT_S,
        temperature=0.0,
        ignore_eos=True,
        block_size=block_size,
        extra_body={"return_token_ids": True},
    )
    return OpenAIBackend(config, tokenizer)


def drive(
    requests: Sequence[Request], backend: Backend, on_record: OnRecord | None = None, concurrency: int = 1
) -> list[RequestRecord]:
    """Send ``requests`` in order through the send loop's closed loop on the wall clock: at
    ``concurrency`` 1 each after the previous one finished, else up to ``concurrency`` in flight;
    one record per request, in request order (``sent_s`` / ``ended_s`` from the loop's start).

    A backend that is an async context manager (the OpenAI client) is entered around the run.
    A failed request is a record with status ``error``; it never stops the comparison.
    """

    async def run() -> list[tuple[Request, RequestRecord]]:
        entered = backend if hasattr(backend, "__aenter__") else contextlib.nullcontext()
        async with entered:
            return await send_requests(requests, backend, LoadConfig(concurrency=concurrency), on_record)

    by_index = {request.index: record for request, record in asyncio.run(run())}
    return [by_index[request.index] for request in requests]
