"""OpenAI wire format for ``kvbench serve``: request bodies, responses, stream chunks, errors.

Requests are pydantic models; unknown fields are accepted and ignored (as vLLM does), except the
ones whose meaning the server cannot honour (``n > 1``, ``stop``, batched prompts), which get a 400.
Defaults follow the OpenAI API reference: ``temperature`` 1, ``top_p`` 1; ``max_tokens`` defaults to
:data:`DEFAULT_MAX_TOKENS` (the legacy completions default) for both endpoints.

Responses are plain dicts. Every ``usage`` carries ``prompt_tokens_details.cached_tokens``, 0 on a
miss (vLLM omits it unless ``--enable-prompt-tokens-details`` is on, and then when it is 0).
Errors use OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy completions default; keeps accidental CPU runs short


class ApiError(Exception):
    """A request the server refuses: becomes an OpenAI-style error body with ``status``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        kind = "server_error" if self.status >= 500 else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param,
                          "code": self.code or self.status}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class _GenerationRequest(BaseModel):
    """Fields both endpoints share."""

    model_config = ConfigDict(extra="allow")  # unknown fields are ignored

    model: str
    max_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    n: int = 1
    stop: str | list[str] | None = None
    ignore_eos: bool = False  # vLLM's extension: decode exactly max_tokens
    cache_salt: str | None = None  # vLLM's extension: a cache namespace (per tenant, per run)
    return_token_ids: bool = False  # vLLM's extension: each streamed choice carries its ``token_ids``

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


class CompletionRequest(_GenerationRequest):
    """``POST /v1/completions``: ``prompt`` is text or token ids (a list of one of them is accepted)."""

    prompt: str | list[int] | list[str] | list[list[int]]

    def single_prompt(self) -> str | list[int]:
        """The one prompt. Raises ``ApiError`` (400) for an empty or batched prompt list."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ApiError(400, "batched prompts are not supported: send one prompt per request", "prompt")
            prompt = prompt[0]
        return prompt


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The message text; content parts must all be ``{"type": "text", "text": ...}``."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        texts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"only text content parts are supported, got type {part.get('type')!r}",
                               "messages")
            texts.append(part["text"])
        return "".join(texts)


class ChatCompletionRequest(_GenerationRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None  # the newer name; wins over max_tokens

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """A ``usage`` object; ``cached_tokens`` always present."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def response_body(chat: bool, response_id: str, created: int, model: str, text: str, finish_reason: str,
                  usage_object: dict[str, Any]) -> dict[str, Any]:
    """A whole (non-streamed) ``chat.completion`` or ``text_completion``."""
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {"id": response_id, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": model, "choices": [choice], "usage": usage_object}


def chunk_body(chat: bool, response_id: str, created: int, model: str, text: str | None,
               finish_reason: str | None = None, usage_object: dict[str, Any] | None = None,
               include_usage: bool = False, first: bool = False) -> dict[str, Any]:
    """One stream chunk. ``text=None`` with ``usage_object`` is the final usage chunk (no choices);
    ``first`` adds the assistant role to a chat delta. ``usage`` is ``null`` on other chunks when the
    client asked for usage (OpenAI's convention)."""
    if text is None and usage_object is not None:
        choices = []
    elif chat:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text:
            delta["content"] = text
        elif first:
            delta["content"] = ""
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    else:
        choices = [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}]
    body = {"id": response_id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created, "model": model, "choices": choices}
    if include_usage or usage_object is not None:
        body["usage"] = usage_object
    return body
