"""ShareGPT conversations (a JSON array) as growing multi-turn chat requests.

The file is one JSON array; each element is a conversation ``{"id": ..., "conversations": [{"from":
"human" | "gpt" | "system", "value": "..."}, ...]}`` (the layout of the ShareGPT dumps that
``vllm bench serve --dataset-name sharegpt`` reads; ``user`` / ``assistant`` / ``chatgpt`` /
``bing`` / ``bard`` are accepted as synonyms). A conversation of n user messages becomes n requests
of one session: request t is the history up to and including user message t (the recorded
assistant replies included), and its ``max_tokens`` is the token count of the reply that follows
it (what the next request's history carries, as in kvbench's chat traces), or 64 for a last user
message without a reply.

ShareGPT has no timestamps: conversation c starts at ``c * conversation_gap_s`` and its turn t is
due ``t * think_time_s`` later (both options of the import).
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any

from kvbench.errors import InputError
from kvbench.request import Message
from kvbench.workloads.formats.json_array import json_array_items
from kvbench.workloads.formats.rows import BadRows
from kvbench.workloads.generators import Draft
from kvbench.workloads.token_ids import DEFAULT_MAX_TOKENS
from kvbench.workloads.tokenizer import Tokenizer

ROLES = MappingProxyType(
    {
        "human": "user",
        "user": "user",
        "gpt": "assistant",
        "assistant": "assistant",
        "chatgpt": "assistant",
        "bing": "assistant",
        "bard": "assistant",
        "system": "system",
    }
)


def _messages(path: Path, index: int, item: Any) -> list[Message]:
    where = f"{path}: conversation {index}"
    turns = item.get("conversations") if isinstance(item, dict) else None
    if not isinstance(turns, list) or not turns:
        raise InputError(f"{where}: field 'conversations': expected a non-empty list of turns")
    messages = []
    for k, turn in enumerate(turns):
        speaker = turn.get("from") if isinstance(turn, dict) else None
        if speaker not in ROLES:
            raise InputError(
                f"{where}: field 'conversations[{k}].from': expected one of "
                f"{', '.join(ROLES)}, got {speaker!r}"
            )
        if not isinstance(turn.get("value"), str):
            raise InputError(f"{where}: field 'conversations[{k}].value': expected a string")
        messages.append(Message(ROLES[speaker], turn["value"]))
    if not any(m.role == "user" for m in messages):
        raise InputError(f"{where}: field 'conversations': no human turn")
    return messages


def _conversation(
    messages: list[Message], session: str, start_ms: float, think_ms: float, tokenizer: Tokenizer
) -> list[Draft]:
    drafts = []
    for position, message in enumerate(messages):
        if message.role != "user":
            continue
        following = messages[position + 1] if position + 1 < len(messages) else None
        reply = following.content if following is not None and following.role == "assistant" else None
        budget = max(1, len(tokenizer.encode(reply))) if reply is not None else DEFAULT_MAX_TOKENS
        turn = len(drafts)
        drafts.append(
            Draft(
                session,
                turn,
                round(start_ms + turn * think_ms, 3),
                budget,
                messages=tuple(messages[: position + 1]),
            )
        )
    return drafts


def read_sharegpt_drafts(
    path: Path,
    tokenizer: Tokenizer,
    bad: BadRows,
    conversation_gap_s: float,
    think_time_s: float,
    limit: int | None = None,
) -> list[Draft]:
    """The drafts of a ShareGPT file, conversation by conversation (at most ``limit`` requests).
    The array is streamed (:func:`.json_array.json_array_items`): one conversation in memory at a time.

    Raises:
        InputError: the file is not a JSON array, a conversation is longer than the line bound, or (without
        ``bad.skip``) a conversation is
            malformed (names the file, the conversation's index and the field).
    """
    drafts: list[Draft] = []
    for index, item in json_array_items(path, "conversations"):
        messages = bad.guard(lambda: _messages(path, index, item))
        if messages is None:
            continue
        drafts += _conversation(
            messages, f"sharegpt-{index:06d}", index * conversation_gap_s * 1e3, think_time_s * 1e3, tokenizer
        )
        if limit is not None and len(drafts) >= limit:
            return drafts[:limit]
    return drafts
