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


def _text(content: str | list[TextBlock], where: str) -> tuple[str, bool]:
    """The content's text and whether any block carries ``cache_control``. Raises ``ApiError`` (400,
    ``param`` the block's field)."""
    if isinstance(content, str):
        return content, False
    for index, block in enumerate(content):
        if block.type != "text":
            raise ApiError(400, f"{where}[{index}].type: only text blocks are supported, got type {block.type!r}",
                           f"{where}[{index}].type")
        if block.text is None:
            raise ApiError(400, f"{where}[{index}].text: a text block needs its text", f"{where}[{index}].text")
    return "".join(block.text or "" for block in content), any(block.cache_control is not None for block in content)


def rendered_messages(body: MessagesRequest) -> tuple[list[Message], list[int]]:
    """ChatML messages (system first) and the indexes of the messages that end at a breakpoint (a
    block's ``cache_control`` marks the end of its message; the top-level one, the last message).
    Raises ``ApiError`` (400)."""
    if not body.messages:
        raise ApiError(400, "messages: must not be empty", "messages")
    messages, marked = [], []
    if body.system:
        text, cached = _text(body.system, "system")
        messages.append(Message("system", text))
        marked += [0] if cached else []
    for index, message in enumerate(body.messages):
        if message.role not in ROLES:
            raise ApiError(400, f"messages[{index}].role: must be user or assistant, got {message.role!r}",
                           f"messages[{index}].role")
        text, cached = _text(message.content, f"messages[{index}].content")
        marked += [len(messages)] if cached else []
        messages.append(Message(message.role, text))
    if body.cache_control is not None and (not marked or marked[-1] != len(messages) - 1):
        marked.append(len(messages) - 1)
    return messages, marked
