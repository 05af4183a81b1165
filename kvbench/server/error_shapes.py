"""The error body of every refusal of ``kvbench serve``, in the shape its route's clients parse.

One rule for every error path (the guards' 400/401/413/415, validation, an unknown model, a failed or
stopped request's 500, an unexpected exception's 500, the connection cap's 503):

* OpenAI routes (everything but ``/v1/messages``): ``{"error": {"message", "type", "param",
  "code"}}``, ``type`` ``invalid_request_error`` below 500 and ``server_error`` from 500.
* ``/v1/messages`` (and any path under it): Anthropic's ``{"type": "error", "error": {"type",
  "message"}}``, ``error.type`` from the status as Anthropic's API reference lists them ("Errors":
  400 ``invalid_request_error``, 401 ``authentication_error``, 403 ``permission_error``, 404
  ``not_found_error``, 413 ``request_too_large``, 429 ``rate_limit_error``, 500 ``api_error``, 529
  ``overloaded_error``). The SDK reads ``error.type`` and ``error.message`` (``APIStatusError.type``,
  ``.api_message``). Anthropic's object has no ``param``, so a message that does not already start
  with the field it is about is prefixed with it (``max_tokens: ...``), as Anthropic's own messages are.

The connection cap answers before any request is read, so its path is unknown: its body
(:data:`OVERLOADED_BODY`) has both shapes' fields, which both SDKs read.
"""

from __future__ import annotations

import json
from typing import Any

ANTHROPIC_ROUTE = "/v1/messages"
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def is_anthropic_path(path: str) -> bool:
    """Whether ``path`` (the request's path, no query) is an Anthropic Messages route."""
    return path == ANTHROPIC_ROUTE or path.startswith(ANTHROPIC_ROUTE + "/")


def anthropic_type(status: int) -> str:
    """Anthropic's ``error.type`` for an HTTP ``status``: :data:`ANTHROPIC_TYPES`, else
    ``invalid_request_error`` below 500 and ``api_error`` from 500."""
    return ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def error_body(
    path: str, status: int, message: str, param: str | None = None, code: str | int | None = None
) -> dict[str, Any]:
    """The JSON error object for a refusal of ``path`` with ``status`` (the module docstring's rule)."""
    if is_anthropic_path(path):
        if param and not message.startswith(param):
            message = f"{param}: {message}"
        return {"type": "error", "error": {"type": anthropic_type(status), "message": message}}
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code or status}}


OVERLOADED_MESSAGE = "the server is at --max-connections and every connection is busy; try again"
OVERLOADED_BODY = json.dumps(
    {
        "type": "error",
        "error": {
            "type": "overloaded_error",
            "message": OVERLOADED_MESSAGE,
            "param": None,
            "code": "too_many_connections",
        },
    }
).encode()
