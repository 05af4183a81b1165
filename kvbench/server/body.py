"""Request bodies of the generation routes, parsed and validated off the event loop, their size in
objects bounded.

Why: FastAPI parses and validates a body on the event loop, and a large but allowed body (900,000
empty chat messages, 28 MB, under the 32 MiB limit) held it for 8.5 s: ``/health`` and every open
stream waited. Here the JSON is parsed in a worker thread with an ``object_hook`` that
counts the body's JSON objects, which also hands the GIL back to the event loop between objects
(the C parser alone holds it for the whole body), and stops the parse once the count passes
``max_objects``; pydantic then validates at most that many objects. ``max_objects`` is the model's
context in tokens plus :data:`OBJECT_SLACK` (:meth:`EngineService.max_body_objects`): every message
renders to at least one token, so a body with more messages than the context has tokens can never
fit (content parts count too: a request of empty parts is refused, none is useful).
"""

from __future__ import annotations

import asyncio
import json
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from kvbench.server.schemas import ApiError
from kvbench.server.validation import invalid_body_error

OBJECT_SLACK = 64  # objects beside the messages: the body itself, stream_options, metadata, ...

Body = TypeVar("Body", bound=BaseModel)


class _TooManyObjects(Exception):
    pass


class _ObjectCounter:
    """``json.loads``'s ``object_hook``: counts objects, raises once there are more than ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit, self.count = limit, 0

    def __call__(self, item: dict) -> dict:
        self.count += 1
        if self.count > self.limit:
            raise _TooManyObjects
        return item


def parse_body(model: type[Body], raw: bytes, max_objects: int) -> Body:
    """``raw`` as a validated ``model``. Raises ``ApiError`` (400): no body, malformed JSON, more than
    ``max_objects`` JSON objects, or a field pydantic refuses (``param`` naming it)."""
    if not raw.strip():
        raise ApiError(400, "the request body is missing: send a JSON object with the request's fields")
    try:
        data = json.loads(raw, object_hook=_ObjectCounter(max_objects))
    except _TooManyObjects:
        raise ApiError(
            400,
            f"the request body holds more than {max_objects:,} JSON objects (messages and "
            "content parts): more messages than this model's context has tokens",
            "messages",
            "too_many_objects",
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"malformed JSON body: {exc}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid_body_error(exc.errors()) from None


async def read_body(http: Request, model: type[Body], max_objects: int) -> Body:
    """The route's body (:func:`parse_body`), parsed in a worker thread."""
    return await asyncio.to_thread(parse_body, model, await http.body(), max_objects)
