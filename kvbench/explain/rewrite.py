"""The traffic fixes: a trace re-rendered the way a cache-friendly client would send it.

Each function returns new requests (same ids, sessions, arrivals, budgets; new ``token_ids`` and
``messages``), or ``None`` when it changes nothing, so :mod:`kvbench.explain.fixes` can replay them:

* :func:`move_volatile`: every line of a message but the last that holds a volatile value
  (:data:`kvbench.explain.lint.LINT_KINDS`) that changes between requests moves to the end of the
  prompt's last message (the new turn), or is dropped (``remove=True``): the stable content before
  it is shared again;
* :func:`sort_json_keys`: every JSON object in a message is re-serialized with sorted keys;
* :func:`restore_reasoning`: an assistant message resent with its ``<think>``-style block stripped
  gets it back, byte for byte as an earlier request sent it;
* :func:`render_all`: every chat request rendered by one renderer (``tokenizer.render_messages``);
* :func:`resend_tokens`: a prompt whose text starts with an earlier prompt's text starts with that
  prompt's token ids (a reply resent as the ids it was generated as, not re-encoded text).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from kvbench.explain.content import REASONING, decode
from kvbench.explain.lint import LINT_KINDS
from kvbench.explain.volatile import find_volatile
from kvbench.request import Message, Request


def _rewrite_messages(
    requests: Sequence[Request], tokenizer, change: Callable[[tuple[Message, ...]], tuple[Message, ...]]
) -> list[Request] | None:
    """Apply ``change`` to every chat request's messages and re-render those that changed."""
    if not hasattr(tokenizer, "render_messages"):
        return None
    rewritten, changed = [], False
    for request in requests:
        messages = None if request.messages is None else change(request.messages)
        if messages is None or messages == request.messages:
            rewritten.append(request)
            continue
        changed = True
        rewritten.append(replace(request, messages=messages, token_ids=tokenizer.render_messages(messages)))
    return rewritten if changed else None


def _skeleton(message: Message) -> tuple[tuple[str, tuple[str | None, ...]], list[str]]:
    """``(role, lines with each volatile one as None)`` and the message's lines."""
    lines = message.content.splitlines(keepends=True)
    return (message.role, tuple(None if find_volatile(line, LINT_KINDS) else line for line in lines)), lines


def _changing_lines(requests: Sequence[Request]) -> dict[tuple, set[int]]:
    """Per message skeleton (all but each prompt's last message), the volatile line positions whose
    text differs between the requests that send it."""
    seen: dict[tuple, dict[int, set[str]]] = {}
    for request in requests:
        for message in (request.messages or ())[:-1]:
            key, lines = _skeleton(message)
            texts = seen.setdefault(key, {})
            for position, line in enumerate(key[1]):
                if line is None:
                    texts.setdefault(position, set()).add(lines[position])
    return {
        key: {p for p, texts in by_position.items() if len(texts) > 1} for key, by_position in seen.items()
    }


def move_volatile(requests: Sequence[Request], tokenizer, remove: bool = False) -> list[Request] | None:
    """Volatile lines out of every message but the last, appended to the last (module docstring).

    Only lines that change: a volatile line at a place where the requests sending the same message
    around it send two or more versions of it (a system prompt stamped per request). A line always
    resent the same (a tool's log output in the history, a false match) stays where it is.
    """
    changing = _changing_lines(requests)

    def change(messages: tuple[Message, ...]) -> tuple[Message, ...]:
        head, moved = [], []
        for message in messages[:-1]:
            key, lines = _skeleton(message)
            positions = changing.get(key, set())
            if positions:
                moved += [lines[p] for p in sorted(positions)]
                message = Message(
                    message.role, "".join(line for p, line in enumerate(lines) if p not in positions)
                )
            head.append(message)
        if not moved:
            return messages
        last = messages[-1]
        tail = "" if remove else "\n" + "".join(moved).rstrip("\n")
        return (*head, Message(last.role, last.content + tail))

    return _rewrite_messages(requests, tokenizer, change)


def _sorted_json(text: str) -> str:
    decoder, out, position = json.JSONDecoder(), [], 0
    while (start := text.find("{", position)) >= 0:
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            out.append(text[position : start + 1])
            position = start + 1
            continue
        out.append(text[position:start] + json.dumps(value, sort_keys=True))
        position = end
    return "".join(out) + text[position:]


def sort_json_keys(requests: Sequence[Request], tokenizer) -> list[Request] | None:
    """Every JSON object in every message re-serialized with sorted keys (``json.dumps(sort_keys=True)``)."""
    return _rewrite_messages(
        requests,
        tokenizer,
        lambda messages: tuple(Message(m.role, _sorted_json(m.content)) for m in messages),
    )


def restore_reasoning(requests: Sequence[Request], tokenizer) -> list[Request] | None:
    """Assistant messages that equal an earlier one with its reasoning block stripped get the block
    back (the earliest such text, byte for byte). ``requests`` in arrival order."""
    with_reasoning: dict[str, str] = {}

    def change(messages: tuple[Message, ...]) -> tuple[Message, ...]:
        restored = []
        for message in messages:
            if message.role == "assistant" and REASONING.search(message.content):
                with_reasoning.setdefault(REASONING.sub("", message.content, count=1), message.content)
            elif message.role == "assistant" and message.content in with_reasoning:
                message = Message("assistant", with_reasoning[message.content])
            restored.append(message)
        return tuple(restored)

    return _rewrite_messages(requests, tokenizer, change)


def render_all(requests: Sequence[Request], tokenizer) -> list[Request] | None:
    """Every chat request's ids re-rendered from its messages by ``tokenizer.render_messages``."""
    if not hasattr(tokenizer, "render_messages"):
        return None
    rewritten, changed = [], False
    for request in requests:
        if request.messages is not None:
            ids = tokenizer.render_messages(request.messages)
            if not np.array_equal(ids, request.token_ids):
                request, changed = replace(request, token_ids=ids), True
        rewritten.append(request)
    return rewritten if changed else None


def resend_tokens(
    requests: Sequence[Request], tokenizer, earlier_of: Mapping[str, str]
) -> list[Request] | None:
    """Per request id in ``earlier_of`` (-> the earlier request it diverges from), when its text
    starts with the earlier prompt's text: the earlier prompt's ids, then the rest of its text encoded."""
    by_id = {r.request_id: r for r in requests}
    rewritten, changed = [], False
    for request in requests:
        earlier = by_id.get(earlier_of.get(request.request_id, ""))
        if earlier is not None:
            text, before = decode(tokenizer, request.token_ids), decode(tokenizer, earlier.token_ids)
            if text.startswith(before) and len(text) > len(before):
                rest = np.asarray(tokenizer.encode(text[len(before) :]), dtype=np.uint32)
                ids = np.concatenate([np.asarray(earlier.token_ids, dtype=np.uint32), rest])
                if not np.array_equal(ids, request.token_ids):
                    request, changed = replace(request, token_ids=ids), True
        rewritten.append(request)
    return rewritten if changed else None
