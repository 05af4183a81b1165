"""Output text of a response, token by token: incremental UTF-8 decoding and stop sequences.

Why incremental: one token is not always whole characters. cl100k spells "🚀" (4 UTF-8 bytes) as
two tokens of 2 and 2 bytes (or more), so decoding each token alone gives two U+FFFD instead of the
emoji ("emoji 🙂🚀" came back "emoji 🙂���"). :class:`TextStream` keeps the bytes of an
unfinished character until the token that completes it arrives:

* a tokenizer with ``token_bytes(id)`` (tiktoken) feeds each token's bytes through Python's
  incremental UTF-8 decoder (``errors="replace"``: bytes that can never form a character become U+FFFD);
* any other tokenizer (Hugging Face) uses vLLM's ``detokenize_incrementally`` scheme: decode a few
  tokens of context before and after the unread ones and emit the difference once it no longer ends
  in U+FFFD.

Stop sequences follow the OpenAI API: generation ends at the first occurrence of any stop string,
and the returned text excludes it. While stop strings are set, the last ``max(len(stop)) - 1``
characters are held back from the stream (they might begin a stop string), as vLLM does; they are
released when the response ends.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

REPLACEMENT = "\ufffd"  # the text of a token id the tokenizer cannot decode (unassigned cl100k ids)
_CONTEXT_TOKENS = 5  # vLLM's prefix window for incremental detokenization


class TextStream:
    """The text of one response as its tokens arrive; not thread-safe (one owner at a time).

    Args:
        tokenizer: ``decode(ids) -> str``; ``token_bytes(id) -> bytes`` when it has one.
        stops: stop strings (non-empty); the text ends before the first one found.
    """

    def __init__(self, tokenizer, stops: Sequence[str] = ()) -> None:
        self._tokenizer = tokenizer
        self._stops = tuple(stops)
        self._hold_chars = max((len(stop) for stop in self._stops), default=1) - 1
        self._bytes_decoder = (
            codecs.getincrementaldecoder("utf-8")("replace") if hasattr(tokenizer, "token_bytes") else None
        )
        self._ids: list[int] = []
        self._prefix_offset = self._read_offset = 0
        self._text = ""  # decoded so far, cut at a stop string once one is found
        self._num_released = 0  # characters of _text already handed out
        self.stopped = False  # a stop string was found: generation should end

    @property
    def text(self) -> str:
        """All the text so far (ending before the stop string, if one was found)."""
        return self._text

    def push(self, token_id: int) -> str:
        """Add one output token; return the text that may be sent now (possibly empty)."""
        if not self.stopped:
            self._text += self._decode_next(int(token_id))
            self._find_stop()
        return self._release(final=self.stopped)

    def finish(self) -> str:
        """The response ended: the held-back text (and any unfinished character as U+FFFD)."""
        if not self.stopped:
            if self._bytes_decoder is not None:
                self._text += self._bytes_decoder.decode(b"", final=True)
            elif self._read_offset < len(self._ids):
                self._text += self._decode(self._ids[self._read_offset :]) or REPLACEMENT
            self._find_stop()
        return self._release(final=True)

    def _decode_next(self, token_id: int) -> str:
        if self._bytes_decoder is not None:
            try:
                return self._bytes_decoder.decode(self._tokenizer.token_bytes(token_id))
            # an id without text: flush what is pending, then U+FFFD
            except (
                KeyError,
                ValueError,
                OverflowError,
            ):
                return self._bytes_decoder.decode(b"", final=True) + REPLACEMENT
        self._ids.append(token_id)
        before = self._decode(self._ids[self._prefix_offset : self._read_offset])
        after = self._decode(self._ids[self._prefix_offset :])
        if len(after) > len(before) and not after.endswith(REPLACEMENT):
            self._prefix_offset = max(self._read_offset, len(self._ids) - _CONTEXT_TOKENS)
            self._read_offset = len(self._ids)
            return after[len(before) :]
        return ""

    def _decode(self, token_ids: Sequence[int]) -> str:
        try:
            return self._tokenizer.decode(token_ids)
        except (KeyError, ValueError, OverflowError):
            return REPLACEMENT

    def _find_stop(self) -> None:
        if not self._stops:
            return
        search_from = max(self._num_released - self._hold_chars, 0)
        found = [i for i in (self._text.find(stop, search_from) for stop in self._stops) if i >= 0]
        if found:
            self._text = self._text[: min(found)]
            self.stopped = True

    def _release(self, final: bool) -> str:
        end = len(self._text) if final else max(len(self._text) - self._hold_chars, self._num_released)
        piece = self._text[self._num_released : end]
        self._num_released = end
        return piece
