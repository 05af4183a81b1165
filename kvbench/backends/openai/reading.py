"""What one OpenAI-style stream delivered, and the :class:`~kvbench.request.RequestRecord` made from it.

Both streaming paths of :mod:`kvbench.backends.openai.client` fill one :class:`StreamReading`: the
SDK path with the openai SDK's chunk objects (:meth:`StreamReading.add`), the lean path with the
decoded JSON of each chunk (:meth:`StreamReading.add_data`). The record is built once, here, so the
two paths cannot disagree on a rule: TTFT from the start of the call to the first chunk with content
(text, or token ids with no text), ITL the gaps between content chunks, output tokens from
``usage.completion_tokens`` else the tokenizer's count of the text, ``cached_prompt_tokens`` from
``usage.prompt_tokens_details.cached_tokens`` (``None`` when the server does not report it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvbench.request import Request, RequestRecord, Status
from kvbench.workloads.tokenizer import Tokenizer


class Usage(NamedTuple):
    """A stream's usage chunk, as counts (``None``: the server did not send that count)."""

    prompt_tokens: Any = None
    completion_tokens: Any = None
    cached_tokens: Any = None  # usage.prompt_tokens_details.cached_tokens

    @classmethod
    def of_object(cls, usage: Any) -> Usage:
        """From the SDK's ``CompletionUsage`` object."""
        details = getattr(usage, "prompt_tokens_details", None)
        return cls(usage.prompt_tokens, usage.completion_tokens, getattr(details, "cached_tokens", None))

    @classmethod
    def of_data(cls, usage: dict) -> Usage:
        """From the usage object of a chunk's JSON."""
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return cls(usage.get("prompt_tokens"), usage.get("completion_tokens"), cached)


class ChunkError(ValueError):
    """A stream chunk that is not a JSON object (a list, a string, a number or null)."""

    def __init__(self, chunk: Any) -> None:
        super().__init__(f"a stream chunk is not a JSON object: {json.dumps(chunk, default=str)[:80]}")


def _extra(part: Any, name: str) -> Any:
    """A field the OpenAI SDK's types do not declare (a server extension), or ``None``."""
    return (getattr(part, "model_extra", None) or {}).get(name)


@dataclass
class StreamReading:
    """What one stream delivered so far; times in ``perf_counter`` seconds, ``start_s`` the call's start."""

    start_s: float
    content_s: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    usage: Usage | None = None
    finish_reason: str | None = None
    http_status: int | None = None
    replica_id: str | None = None  # the X-Kvbench-Replica response header, when the server sent one
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] | None = None

    def add(self, chunk: Any, chat: bool, now_s: float) -> None:
        """One chunk as the SDK parsed it (``ChatCompletionChunk`` or ``Completion``), received at ``now_s``.
        Raises :class:`ChunkError` for a chunk that is not a JSON object (the SDK passes those through)."""
        if chunk is None or isinstance(chunk, (list, str, int, float)):
            raise ChunkError(chunk)
        if getattr(chunk, "usage", None) is not None:
            self.usage = Usage.of_object(chunk.usage)
        self._take_prompt_ids(_extra(chunk, "prompt_token_ids"))
        for choice in getattr(chunk, "choices", None) or ():  # a chunk without choices: none, as in add_data
            self._take_prompt_ids(_extra(choice, "prompt_token_ids"))
            self._take_content(
                choice.delta.content if chat else choice.text,
                _extra(choice, "token_ids"),
                choice.finish_reason,
                now_s,
            )

    def add_data(self, chunk: dict, chat: bool, now_s: float) -> None:
        """One chunk as its decoded JSON (a ``chat.completion.chunk`` or ``text_completion`` object),
        received at ``now_s``. Reads the same fields as :meth:`add`, and only those. Raises
        :class:`ChunkError` for a chunk that is not a JSON object."""
        if not isinstance(chunk, dict):
            raise ChunkError(chunk)
        if (usage := chunk.get("usage")) is not None:
            self.usage = Usage.of_data(usage)
        self._take_prompt_ids(chunk.get("prompt_token_ids"))
        for choice in chunk.get("choices") or ():
            self._take_prompt_ids(choice.get("prompt_token_ids"))
            piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            self._take_content(piece, choice.get("token_ids"), choice.get("finish_reason"), now_s)

    def _take_content(
        self, piece: str | None, token_ids: list | None, finish_reason: str | None, now_s: float
    ) -> None:
        if token_ids is not None:
            if self.output_token_ids is None:
                self.output_token_ids = []
            self.output_token_ids.extend(int(t) for t in token_ids)
        if piece or token_ids:
            self.content_s.append(now_s)
        if piece:
            self.texts.append(piece)
        if finish_reason:
            self.finish_reason = finish_reason

    def _take_prompt_ids(self, ids: list | None) -> None:
        if ids is not None:
            self.prompt_token_ids = [int(t) for t in ids]

    def served(self, request: Request, tokenizer: Tokenizer, error: str | None = None) -> RequestRecord:
        """The record: ``status`` ok unless ``error`` (one line) is given; times in ms from ``start_s``."""
        usage = self.usage or Usage()
        if usage.completion_tokens is not None:
            output_tokens, source = int(usage.completion_tokens), "usage"
        else:
            output_tokens, source = (
                len(tokenizer.encode("".join(self.texts))) if self.texts else 0,
                "tokenizer",
            )
        times_ms = [(t - self.start_s) * 1e3 for t in self.content_s]
        ttft_ms = times_ms[0] if times_ms else None
        e2e_ms = times_ms[-1] if times_ms else None
        return RequestRecord(
            status=Status.OK if error is None else Status.ERROR,
            prompt_tokens=int(usage.prompt_tokens)
            if usage.prompt_tokens is not None
            else request.prompt_tokens,
            cached_prompt_tokens=int(usage.cached_tokens) if usage.cached_tokens is not None else None,
            output_tokens=output_tokens,
            output_tokens_source=source,
            ttft_ms=ttft_ms,
            e2e_ms=e2e_ms,
            itl_ms=tuple(b - a for a, b in zip(times_ms, times_ms[1:])),
            output_token_ids=None if self.output_token_ids is None else tuple(self.output_token_ids),
            prompt_token_ids=None if self.prompt_token_ids is None else tuple(self.prompt_token_ids),
            output_text="".join(self.texts),
            error=error,
            http_status=self.http_status,
            replica_id=self.replica_id,
        )
