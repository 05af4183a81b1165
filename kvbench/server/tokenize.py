"""vLLM's ``POST /tokenize`` and ``POST /detokenize`` on ``kvbench serve``.

Shapes follow vLLM's OpenAI server (``vllm/entrypoints/openai/protocol.py``: ``TokenizeCompletionRequest``,
``TokenizeChatRequest``, ``TokenizeResponse``, ``DetokenizeRequest``, ``DetokenizeResponse``):

* ``/tokenize`` takes ``{"prompt": text}`` or ``{"messages": [...]}`` (``model`` optional) and answers
  ``{"count", "max_model_len", "tokens", "token_strs": null}``. The ids are exactly what a generation
  request with the same prompt or messages prefills (the same rendering, the generation prompt included),
  so a client can count prompt tokens with the server's own tokenizer. ``add_special_tokens`` is accepted
  and changes nothing (the default tokenizer adds no BOS); ``add_generation_prompt: false`` is a 400.
* ``/detokenize`` takes ``{"tokens": [ids]}`` and answers ``{"prompt": text}``.

Both run the tokenizer in a worker thread, like the generation routes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, model_validator

from kvbench.server.schemas import ApiError, ChatMessage, TextCheckedRequest, TokenId
from kvbench.server.text import TextStream


class TokenizeRequest(TextCheckedRequest):
    """Either ``prompt`` or ``messages``."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ApiError(400, "send exactly one of prompt and messages", "prompt")
        if self.messages is not None and not self.add_generation_prompt:
            raise ApiError(
                400,
                "add_generation_prompt false is not supported: the rendering always ends "
                "with the generation prompt",
                "add_generation_prompt",
            )
        return self


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    tokens: list[TokenId]


def add_tokenize_routes(app: FastAPI, service) -> None:
    """Add ``/tokenize`` and ``/detokenize`` over ``service`` (an :class:`EngineService`)."""

    def check_model(model: str | None) -> None:
        if model is not None and model != service.model_name:
            raise ApiError(
                404,
                f"The model `{model}` does not exist (this server serves `{service.model_name}`).",
                "model",
                "model_not_found",
            )

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        check_model(body.model)
        if body.messages is not None:
            messages = [(message.role, message.text()) for message in body.messages]
            token_ids = await asyncio.to_thread(service.render_chat, messages)
        else:
            token_ids = await asyncio.to_thread(service.render_prompt, body.prompt)
        tokens = [int(t) for t in token_ids]
        return {
            "count": len(tokens),
            "max_model_len": service.max_context_tokens,
            "tokens": tokens,
            "token_strs": None,
        }

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        check_model(body.model)
        vocab_size = service.engine.loaded.vocab_size
        if any(t >= vocab_size for t in body.tokens):
            raise ApiError(400, f"token id outside the model's vocabulary of {vocab_size} ids", "tokens")
        return {"prompt": await asyncio.to_thread(_text, service.tokenizer, body.tokens)}


def _text(tokenizer, token_ids: list[int]) -> str:
    stream = TextStream(tokenizer)
    return "".join(stream.push(t) for t in token_ids) + stream.finish()
