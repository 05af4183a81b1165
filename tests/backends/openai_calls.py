"""Requests and one call of the OpenAI backend, as the backend tests send them to fake and real servers.

Imported by its bare name (``from openai_calls import serve``): tests/backends/ is on ``sys.path`` as
the folder of the tests that import it (pytest's rootdir-relative imports) and is not a package."""

import asyncio

import numpy as np
from fake_servers import SECRET_KEY

from kvbench.backends.openai.client import OpenAIBackend, OpenAIConfig
from kvbench.request import Message, Request
from kvbench.workloads.tokenizer import load_tokenizer

TOKENIZER = load_tokenizer()


def chat_request(index=0, text="hello there", max_tokens=4, salt=None) -> Request:
    """Request ``index`` (id ``r{index}``, session ``s{index}``): one user message ``text``."""
    messages = (Message("user", text),)
    return Request(
        index,
        f"r{index}",
        f"s{index}",
        0,
        TOKENIZER.render_messages(messages),
        max_tokens=max_tokens,
        salt=salt,
        messages=messages,
    )


def text_request(index=0, text="Once upon a time", max_tokens=4) -> Request:
    """Request ``index`` (id and session ``p{index}``): a plain prompt ``text`` (to /completions)."""
    return Request(
        index, f"p{index}", f"p{index}", 0, TOKENIZER.render_prompt(text), max_tokens=max_tokens, prompt=text
    )


def ids_request(index=0, ids=(11, 22, 33, 44, 55), max_tokens=4) -> Request:
    """Request ``index`` (id and session ``t{index}``): token ids only (to /completions)."""
    return Request(index, f"t{index}", f"t{index}", 0, np.array(ids, dtype=np.uint32), max_tokens=max_tokens)


def serve(url, requests, client=None, run_salt=None, model="m", **config) -> list:
    """The records of ``requests`` sent one after another through one OpenAI backend on ``url``
    (model ``model``, the fake servers' key, a 10 s timeout unless ``config`` says otherwise); the
    config's default client unless ``client`` names one."""

    async def go():
        settings = {"api_key": SECRET_KEY, "timeout_s": 10.0, **config}
        if client is not None:
            settings["client"] = client
        async with OpenAIBackend(OpenAIConfig(url, model, **settings), TOKENIZER, run_salt) as backend:
            return [await backend.serve(request) for request in requests]

    return asyncio.run(go())
