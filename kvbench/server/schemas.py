"""OpenAI wire format for ``kvbench serve``: request bodies, responses, stream chunks, errors.

Requests are strict pydantic models: a value of the wrong JSON type is a 400 naming the field, never
coerced (``max_tokens: true`` or ``"4"``, ``stream: "yes"``), and numbers are range-checked here, so no
client value reaches the engine to fail there as a 500 (a token id of 2^63, a seed of 2^70, a
temperature of Infinity). Strings must be valid Unicode text: a lone surrogate (``"\\ud800"``, legal
JSON but not encodable as UTF-8) is a 400 naming its field. Unknown fields are accepted and ignored
(as vLLM does), except the OpenAI features this server does not implement (:data:`UNSUPPORTED`), which
get a 400 saying so when set to anything but their "off" value. ``stop`` is supported.

Defaults follow the OpenAI API reference: ``temperature`` 1, ``top_p`` 1. ``max_tokens`` defaults to
:data:`DEFAULT_MAX_TOKENS` on ``/v1/completions`` (the legacy completions default, as in vLLM) and to
the rest of the context on ``/v1/chat/completions`` (OpenAI and vLLM generate to EOS or the limit).
``cache_salt`` follows vLLM: a non-empty string of at most 1,024 characters. ``n`` is 1 to 128
(OpenAI's range); ``n > 1`` runs on ``--engine paged`` only (the app refuses it on the copy engine
with a 400 naming ``n``); streamed, each chunk carries its choice's ``index``.

Responses are plain dicts. Every ``usage`` carries ``prompt_tokens_details.cached_tokens``, 0 on a
miss (vLLM omits it unless ``--enable-prompt-tokens-details`` is on, and then when it is 0).
Errors use OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` (Anthropic's on
``/v1/messages``: :mod:`kvbench.server.error_shapes`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvbench.server.error_shapes import error_body

DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy completions default; keeps accidental CPU runs short
MAX_SALT_CHARS = 1024  # vLLM's limit on cache_salt
MAX_N = 128  # OpenAI's documented maximum of ``n`` (choices per request)
MAX_STOP_SEQUENCES = 4  # OpenAI's limit
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1  # vLLM's range for seed
TOKEN_ID_MAX = (1 << 31) - 1  # ids above any vocabulary still fit int32; the vocabulary check follows

# OpenAI features this server does not implement: field -> the values that mean "off" (accepted).
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
}

TokenId = Annotated[int, Field(ge=0, le=TOKEN_ID_MAX)]
Finite = Annotated[float, Field(allow_inf_nan=False)]


class ApiError(Exception):
    """A request the server refuses: becomes an OpenAI-style error body with ``status``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self, path: str = "") -> dict[str, Any]:
        """The error object in the shape of ``path``'s clients: OpenAI's, or Anthropic's on
        ``/v1/messages`` (:func:`~kvbench.server.error_shapes.error_body`)."""
        return error_body(path, self.status, self.message, self.param, self.code)


def check_text(value: Any, where: str = "") -> None:
    """Raise ``ApiError`` (400, ``param`` the top field) for the first string inside ``value`` (nested
    dicts and lists, walked without recursion) that is not encodable as UTF-8 (a lone surrogate)."""
    stack = [(where, value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ApiError(
                    400,
                    f"{path or 'body'}: not valid Unicode text (lone surrogate "
                    f"{item[exc.start]!r} at character {exc.start})",
                    path.split(".")[0].split("[")[0] or None,
                ) from None
        elif isinstance(item, dict):
            stack.extend((f"{path}.{key}" if path else str(key), sub) for key, sub in item.items())
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", sub) for i, sub in enumerate(item))


class TextCheckedRequest(BaseModel):
    """A request body whose strings are checked by :func:`check_text` before any field is parsed
    (the generation endpoints and ``/tokenize`` share it)."""

    @model_validator(mode="before")
    @classmethod
    def _valid_text(cls, data: Any) -> Any:
        check_text(data)
        return data


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's extension: usage on every chunk


class _GenerationRequest(TextCheckedRequest):
    """Fields both endpoints share."""

    model_config = ConfigDict(extra="allow", strict=True)  # unknown fields are ignored; no coercion

    model: str
    max_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: Annotated[Finite, Field(ge=0)] | None = None
    top_p: Annotated[Finite, Field(gt=0, le=1)] | None = None
    seed: Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)] | None = None
    n: int = 1
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    ignore_eos: bool = False  # vLLM's extension: decode exactly max_tokens
    cache_salt: str | None = None  # vLLM's extension: a cache namespace (per tenant, per run)
    return_token_ids: bool = False  # vLLM's extension: each streamed choice carries its ``token_ids``

    @model_validator(mode="after")
    def _supported(self) -> _GenerationRequest:
        """Raise ``ApiError`` (400) for what the server cannot honour (see :data:`UNSUPPORTED`)."""
        if not 1 <= self.n <= MAX_N:
            raise ApiError(400, f"n must be between 1 and {MAX_N}, got {self.n}", "n")
        if self.cache_salt is not None and not self.cache_salt:
            raise ApiError(400, "cache_salt must be a non-empty string if provided", "cache_salt")
        if self.cache_salt is not None and len(self.cache_salt) > MAX_SALT_CHARS:
            raise ApiError(400, f"cache_salt must be at most {MAX_SALT_CHARS} characters", "cache_salt")
        for name, value in (self.model_extra or {}).items():
            if name in UNSUPPORTED and value not in UNSUPPORTED[name]:
                raise ApiError(
                    400,
                    f"{name} is not supported by kvbench serve (send it unset or {UNSUPPORTED[name][-1]!r})",
                    name,
                )
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        """The non-empty stop strings (OpenAI: up to 4)."""
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return tuple(stop for stop in stops if stop)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


class CompletionRequest(_GenerationRequest):
    """``POST /v1/completions``: ``prompt`` is text or token ids (a list of one of them is accepted)."""

    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]

    def single_prompt(self) -> str | list[int]:
        """The one prompt. Raises ``ApiError`` (400) for an empty or batched prompt list."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ApiError(
                    400, "batched prompts are not supported: send one prompt per request", "prompt"
                )
            prompt = prompt[0]
        return prompt


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self, where: str = "messages") -> str:
        """The message text; content parts must all be ``{"type": "text", "text": ...}``. Raises
        ``ApiError`` (400, ``param`` the part's field under ``where``, e.g. ``messages[0].content``)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        texts = []
        for index, part in enumerate(self.content):
            if part.get("type") != "text":
                raise ApiError(
                    400,
                    f"{where}[{index}].type: only text content parts are supported, got type "
                    f"{part.get('type')!r}",
                    f"{where}[{index}].type",
                )
            if not isinstance(part.get("text"), str):
                raise ApiError(
                    400,
                    f"{where}[{index}].text: a text part needs its text (a string)",
                    f"{where}[{index}].text",
                )
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
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def response_body(
    chat: bool,
    response_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    usage_object: dict[str, Any],
) -> dict[str, Any]:
    """A whole (non-streamed) ``chat.completion`` or ``text_completion``."""
    return choices_body(chat, response_id, created, model, [(text, finish_reason)], usage_object)


def choices_body(
    chat: bool,
    response_id: str,
    created: int,
    model: str,
    outputs: list[tuple[str, str]],
    usage_object: dict[str, Any],
) -> dict[str, Any]:
    """A whole response with one choice per ``(text, finish_reason)`` of ``outputs``, ``index`` in order
    (the ``n`` parameter)."""
    choices = []
    for index, (text, finish_reason) in enumerate(outputs):
        if chat:
            choices.append(
                {
                    "index": index,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            )
        else:
            choices.append({"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason})
    return {
        "id": response_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage_object,
    }


def chunk_body(
    chat: bool,
    response_id: str,
    created: int,
    model: str,
    text: str | None,
    finish_reason: str | None = None,
    usage_object: dict[str, Any] | None = None,
    include_usage: bool = False,
    first: bool = False,
    index: int = 0,
) -> dict[str, Any]:
    """One stream chunk of choice ``index``. ``text=None`` with ``usage_object`` is the final usage
    chunk (no choices); ``first`` adds the assistant role to a chat delta. ``usage`` is ``null`` on
    other chunks when the client asked for usage (OpenAI's convention)."""
    if text is None and usage_object is not None:
        choices = []
    elif chat:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text:
            delta["content"] = text
        elif first:
            delta["content"] = ""
        choices = [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    else:
        choices = [{"index": index, "text": text or "", "logprobs": None, "finish_reason": finish_reason}]
    body = {
        "id": response_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if include_usage or usage_object is not None:
        body["usage"] = usage_object
    return body
