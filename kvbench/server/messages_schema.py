"""The ``POST /v1/messages`` body (Anthropic's Messages shape), validated as the OpenAI routes are.

One validation for every route (:mod:`kvbench.server.schemas`): strict types (``max_tokens: "4"`` or
``true`` is a 400 naming ``max_tokens``, never coerced), finite ranged numbers (``temperature``
0 to 1 as Anthropic's API, ``top_p`` in (0, 1]), every string valid Unicode (a lone surrogate in
``model``, ``system`` or a message is a 400 naming its field, checked before any field is parsed),
unknown fields ignored. Field paths are written as the OpenAI routes write them
(``messages[0].content[1].text``). Content is a string or a list of text blocks
(``{"type": "text", "text": ..., "cache_control": ...}``); any other block type is a 400 naming it.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from kvbench.request import Message
from kvbench.server.breakpoint_cache import MAX_BREAKPOINTS, TTL_S
from kvbench.server.schemas import ApiError, Finite, TextCheckedRequest

ROLES = ("user", "assistant")


class TextBlock(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: str
    text: str | None = None
    cache_control: dict[str, Any] | None = None


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: str
    content: str | list[TextBlock]


class MessagesRequest(TextCheckedRequest):
    """``POST /v1/messages`` body (unknown fields are ignored; ``cache_control`` at the top level is
    Anthropic's automatic caching: a breakpoint at the last block)."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str
    max_tokens: Annotated[int, Field(ge=1)]
    messages: list[AnthropicMessage]
    system: str | list[TextBlock] | None = None
    stream: bool = False
    temperature: Annotated[Finite, Field(ge=0, le=1)] | None = None
    top_p: Annotated[Finite, Field(gt=0, le=1)] | None = None
    cache_control: dict[str, Any] | None = None


def _ttl_s(cache_control: dict[str, Any], where: str) -> float:
    """A ``cache_control``'s TTL in seconds. Raises ``ApiError`` (400) for another type or TTL."""
    if cache_control.get("type") != "ephemeral":
        raise ApiError(
            400, f"{where}.type: must be 'ephemeral', got {cache_control.get('type')!r}", f"{where}.type"
        )
    ttl = cache_control.get("ttl", "5m")
    if ttl not in TTL_S:
        raise ApiError(400, f"{where}.ttl: must be one of {', '.join(TTL_S)}, got {ttl!r}", f"{where}.ttl")
    return TTL_S[ttl]


def _text(content: str | list[TextBlock], where: str) -> tuple[str, list[float]]:
    """The content's text and the TTL of each of its blocks that carries ``cache_control``. Raises
    ``ApiError`` (400, ``param`` the block's field)."""
    if isinstance(content, str):
        return content, []
    ttls = []
    for index, block in enumerate(content):
        if block.type != "text":
            raise ApiError(
                400,
                f"{where}[{index}].type: only text blocks are supported, got type {block.type!r}",
                f"{where}[{index}].type",
            )
        if block.text is None:
            raise ApiError(
                400, f"{where}[{index}].text: a text block needs its text", f"{where}[{index}].text"
            )
        if block.cache_control is not None:
            ttls.append(_ttl_s(block.cache_control, f"{where}[{index}].cache_control"))
    return "".join(block.text or "" for block in content), ttls


def rendered_messages(body: MessagesRequest) -> tuple[list[Message], list[tuple[int, float]]]:
    """ChatML messages (system first) and the breakpoints as ``(index of the message they end,
    TTL in seconds)``: a block's ``cache_control`` marks the end of its message; the top-level one, the
    last message. Raises ``ApiError`` (400), also for more than :data:`MAX_BREAKPOINTS`."""
    if not body.messages:
        raise ApiError(400, "messages: must not be empty", "messages")
    messages, marked = [], []
    if body.system:
        text, ttls = _text(body.system, "system")
        messages.append(Message("system", text))
        marked += [(0, ttl) for ttl in ttls]
    for index, message in enumerate(body.messages):
        if message.role not in ROLES:
            raise ApiError(
                400,
                f"messages[{index}].role: must be user or assistant, got {message.role!r}",
                f"messages[{index}].role",
            )
        text, ttls = _text(message.content, f"messages[{index}].content")
        marked += [(len(messages), ttl) for ttl in ttls]
        messages.append(Message(message.role, text))
    if body.cache_control is not None:
        marked.append((len(messages) - 1, _ttl_s(body.cache_control, "cache_control")))
    if len(marked) > MAX_BREAKPOINTS:
        raise ApiError(
            400,
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {len(marked)}.",
            "cache_control",
        )
    return messages, marked
