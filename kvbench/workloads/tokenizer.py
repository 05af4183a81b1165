"""Tokenizers: text <-> token ids, and trace requests -> the token ids a server would prefill.

One small interface (:class:`Tokenizer`), two implementations:

* :class:`TiktokenTokenizer` (the default): ``cl100k_base`` through tiktoken, from the ranks file
  kvbench ships as package data, checked by its SHA-256 (:mod:`kvbench.cl100k`; recorded
  under the name ``cl100k_base_offline``, as traces always have). Nothing is ever downloaded.
* :class:`kvbench.engine.hf_tokenizer.HFTokenizer`: a local Hugging Face checkpoint's tokenizer
(``AutoTokenizer`` with
  ``local_files_only=True``) and its chat template.

Chat format ``chatml`` (the default tokenizer's; also the fallback for checkpoints without a chat
template)::

    for each message:   <|im_start|>{role}\\n{content}<|im_end|>\\n
    then (generation):  <|im_start|>assistant\\n

For cl100k, ``<|im_start|>`` = 100264 and ``<|im_end|>`` = 100265, the ids OpenAI's ChatML gives
them (tiktoken README, "Extending tiktoken": ``cl100k_im``). ``cl100k_base`` itself leaves ids
100261..100275 unassigned, and both ids are below the default model's vocabulary size (100,277).
**Special tokens in text are parsed**: a literal ``<|im_end|>`` inside a message or a
prompt is the control token 100265, as Hugging Face tokenizers, and so vLLM, SGLang and
transformers on ``kvbench model export``'s ``tokenizer.json``, encode it (their default; a server
renders the chat template to text and encodes that text whole). ``a<|im_end|>b`` is
``[64, 100265, 65]`` everywhere: here, ``kvbench serve``'s ``/tokenize`` and prefill, the export,
and ``kvbench peer vllm`` checks the vLLM it runs against (``kvbench.peer.special_tokens``). So trace
text *can* end a turn early, as it can on those servers; nothing is added to plain prompts (no BOS).

Why per-piece caching is exact for cl100k: the ChatML control tokens split the text into chunks
that are encoded independently, so a message's tokens do not depend on its neighbours. Inside a
chunk, cl100k's pre-tokenizer regex never produces a piece containing ``"\\n"`` followed by a
non-whitespace character (newlines only appear in pieces of whitespace, or trailing a run of
punctuation), and its only end-anchored branch (``\\s++$``) matches the same span as ``\\s*[\\r\\n]``
would. Hence ``encode(a + b) == encode(a) + encode(b)`` whenever ``a`` ends with ``"\\n"`` and ``b``
starts with a non-whitespace character (:data:`LINE_BOUNDARY`). Tests check it on random text.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from kvbench.constants import (
    CHATML,
    CL100K_IM_END_ID,
    CL100K_IM_START_ID,
    DEFAULT_TOKENIZER,
    IM_END,
    IM_START,
)
from kvbench.errors import InputError
from kvbench.request import Message

__all__ = [
    "CHATML",
    "CL100K_IM_END_ID",
    "CL100K_IM_START_ID",
    "DEFAULT_TOKENIZER",
    "IM_END",
    "IM_START",
    "TiktokenTokenizer",
    "Tokenizer",
    "load_tokenizer",
    "render",
    "render_all",
]

if TYPE_CHECKING:
    from kvbench.workloads.formats.kvbench_trace import TraceRequest

LINE_BOUNDARY = re.compile(r"(?<=\n)(?=\S)")  # where cl100k tokenization splits exactly (see above)
_CACHE_ENTRIES = 1 << 16  # cached message / line encodings per tokenizer (bounded memory)
# ... and at most 64 MiB of memoized text + ids per cache (bytes, not entries)
_CACHE_BYTES = 64 << 20
# longer texts are encoded every time: one huge (or rejected) text leaves nothing behind
_MAX_MEMO_CHARS = 1 << 16


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> token ids plus rendering of trace requests.

    Attributes:
        name: what trace headers record (``cl100k_base_offline``, ``hf:/path/to/checkpoint``).
        chat_format: how messages become tokens (``chatml``, or ``hf-template:<sha256 prefix>``).
        splits_at_lines: ``encode(a + b) == encode(a) + encode(b)`` whenever ``a`` ends with a
            newline and ``b`` starts with non-whitespace (proved for cl100k; unknown otherwise).
    """

    name: str
    chat_format: str
    splits_at_lines: bool

    def encode(self, text: str) -> list[int]:
        """Ordinary text -> token ids (no special tokens, nothing added)."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Token ids -> text (control tokens written out)."""
        ...

    def render_messages(self, messages: Sequence[Message]) -> np.ndarray:
        """Chat messages plus the generation prompt -> token ids, shape (num_tokens,), uint32."""
        ...

    def render_prompt(self, prompt: str) -> np.ndarray:
        """A plain-text prompt -> token ids as a completions endpoint would see them; uint32."""
        ...

    def render(self, request: TraceRequest) -> np.ndarray:
        """A trace request's prompt token ids (see :func:`render`); shape (n,), uint32."""
        ...


def render(tokenizer: Tokenizer, request: TraceRequest) -> np.ndarray:
    """The prompt token ids of a trace request (its messages or its prompt); shape (n,), uint32."""
    if request.messages is not None:
        return tokenizer.render_messages(request.messages)
    return tokenizer.render_prompt(request.prompt or "")


_RENDER_CHUNK = 4096  # requests rendered together by render_all (their prompts' arrays held at once)


def render_all(tokenizer: Tokenizer, requests: Sequence[TraceRequest]) -> Iterator[np.ndarray]:
    """:func:`render` of each request, in order, ``_RENDER_CHUNK`` at a time: plain prompts through
    the tokenizer's batch ``render_prompts`` when it has one (equal arrays), messages one by one."""
    batch = getattr(tokenizer, "render_prompts", None)
    for start in range(0, len(requests), _RENDER_CHUNK):
        chunk = requests[start : start + _RENDER_CHUNK]
        if batch is None:
            yield from (render(tokenizer, request) for request in chunk)
            continue
        prompts = iter(batch([request.prompt or "" for request in chunk if request.messages is None]))
        for request in chunk:
            yield next(prompts) if request.messages is None else tokenizer.render_messages(request.messages)


class _BoundedCache:
    """A thread-safe memo bounded both in entries and in bytes (oldest entries dropped first).

    An entry's size is its key's text (``sys.getsizeof`` of each string) plus its value's ``nbytes``;
    keys whose text is longer than :data:`_MAX_MEMO_CHARS` characters are computed and never stored, so
    a stream of distinct huge texts (a hostile client's rejected requests) cannot grow the memo.
    """

    def __init__(self, max_entries: int, max_bytes: int = _CACHE_BYTES) -> None:
        self._entries: dict = {}
        self._sizes: dict = {}
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self.num_bytes = 0  # what the stored entries take, by the rule above
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get_or_compute(self, key, compute):
        """The cached value of ``key``, or ``compute(key)`` (then cached unless its text is too long)."""
        with self._lock:
            value = self._entries.get(key)
        if value is not None:
            return value
        value = compute(key)
        texts = [part for part in (key if isinstance(key, tuple) else (key,)) if isinstance(part, str)]
        if sum(len(text) for text in texts) > _MAX_MEMO_CHARS:
            return value
        size = sum(sys.getsizeof(text) for text in texts) + int(getattr(value, "nbytes", 0))
        with self._lock:
            if key in self._entries:
                return value
            while self._entries and (
                len(self._entries) >= self._max_entries or self.num_bytes + size > self._max_bytes
            ):
                oldest = next(iter(self._entries))
                del self._entries[oldest]
                self.num_bytes -= self._sizes.pop(oldest)
            self._entries[key] = value
            self._sizes[key] = size
            self.num_bytes += size
        return value


class TiktokenTokenizer:
    """cl100k_base (offline data file) with the ChatML control tokens; see the module docstring.

    Raises:
        InputError: the shipped ranks file is missing or damaged (:mod:`kvbench.cl100k`).
    """

    name = DEFAULT_TOKENIZER
    chat_format = CHATML
    splits_at_lines = True

    def __init__(self) -> None:
        from kvbench.cl100k import cl100k_encoding

        self._encoding = cl100k_encoding(
            {IM_START: CL100K_IM_START_ID, IM_END: CL100K_IM_END_ID}, DEFAULT_TOKENIZER
        )
        self._newline = np.asarray(self._encoding.encode_ordinary("\n"), dtype=np.uint32)
        self._generation = self._segment(("assistant", None))
        self._segments = _BoundedCache(_CACHE_ENTRIES)
        self._lines = _BoundedCache(_CACHE_ENTRIES)

    @property
    def vocab_size(self) -> int:
        """Token ids are below this (100,277 for cl100k with its special tokens)."""
        return self._encoding.n_vocab

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """The longest token's UTF-8 bytes (128 for cl100k): a text of ``n`` bytes is at least
        ``ceil(n / max_token_bytes)`` tokens, so a server can refuse one too long for its context
        without encoding it."""
        return max(len(token) for token in self._encoding.token_byte_values())

    def encode(self, text: str) -> list[int]:
        """Text -> token ids, special tokens in it parsed (module docstring), nothing added."""
        return self._encoding.encode(text, allowed_special="all")

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._encoding.decode([int(t) for t in token_ids])

    def token_bytes(self, token_id: int) -> bytes:
        """One token's bytes (possibly part of a UTF-8 character). Raises ``KeyError`` for an id
        without bytes (cl100k leaves 100261..100275 unassigned)."""
        return self._encoding.decode_single_token_bytes(int(token_id))

    def _segment(self, key: tuple[str, str | None]) -> np.ndarray:
        """``<|im_start|>role\\ncontent<|im_end|>\\n``, or the generation prompt when content is None."""
        role, content = key
        body = self.encode(f"{role}\n{content if content is not None else ''}")
        if content is None:
            return np.asarray([CL100K_IM_START_ID, *body], dtype=np.uint32)
        return np.asarray(
            [CL100K_IM_START_ID, *body, CL100K_IM_END_ID, *self._newline.tolist()], dtype=np.uint32
        )

    def render_messages(self, messages: Sequence[Message]) -> np.ndarray:
        parts = [self._segments.get_or_compute((m.role, m.content), self._segment) for m in messages]
        return np.concatenate([*parts, self._generation])

    def render_prompt(self, prompt: str) -> np.ndarray:
        lines = LINE_BOUNDARY.split(prompt)
        parts = [self._lines.get_or_compute(line, self._encode_array) for line in lines if line]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)

    def render_prompts(self, prompts: Sequence[str]) -> list[np.ndarray]:
        """:meth:`render_prompt` of each prompt (equal arrays), many at once: each distinct line is
        encoded once, without the memo's lock and bookkeeping, and a one-line prompt's array is that line's
        (shared between equal prompts; treat it as read-only). Before, a 1M-request file of
        tiny prompts spent most of its time in one memo look-up and one encode call per request."""
        split = [LINE_BOUNDARY.split(prompt) if "\n" in prompt else (prompt,) for prompt in prompts]
        distinct = list(dict.fromkeys(line for lines in split for line in lines if line))
        encode = self._encoding.encode_ordinary  # not encode_ordinary_batch: a thread-pool task per text
        arrays = {line: np.asarray(encode(line), dtype=np.uint32) for line in distinct}
        rendered = []
        for lines in split:
            parts = [arrays[line] for line in lines if line]
            rendered.append(
                parts[0]
                if len(parts) == 1
                else np.concatenate(parts)
                if parts
                else np.zeros(0, dtype=np.uint32)
            )
        return rendered

    def render(self, request: TraceRequest) -> np.ndarray:
        return render(self, request)

    def _encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.uint32)


def load_tokenizer(name: str | None = None) -> Tokenizer:
    """``None``, ``cl100k_base_offline`` or ``cl100k`` -> the default; ``hf:PATH`` or a directory -> its
    tokenizer. (``server``, the server's ``/tokenize``, is resolved by ``kvbench run --backend openai``.)

    Raises:
        InputError: an unknown name, or a directory without a loadable tokenizer.
    """
    if name is None or name in (DEFAULT_TOKENIZER, "cl100k", "cl100k_base"):
        return TiktokenTokenizer()
    path = name[3:] if name.startswith("hf:") else name
    if Path(path).is_dir():
        from kvbench.engine.hf_tokenizer import HFTokenizer  # transformers lives in engine/

        return HFTokenizer(path)
    raise InputError(
        f"tokenizer {name!r}: not {DEFAULT_TOKENIZER} (cl100k), not a local checkpoint directory"
        " (and 'server' works only with kvbench run --backend openai)"
    )
