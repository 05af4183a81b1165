"""Pydantic's validation errors as one OpenAI error: a 400 whose ``param`` names the field.

FastAPI reports a bad body as a list of pydantic errors whose ``loc`` mixes field names with the
tags of union members (``("body", "prompt", "list[int]", 0)``) and whose first entry is often one
arm of a union. This keeps what a client needs: the field's dotted path (``messages[0].role``,
``stream_options.include_usage``) as ``param``, one message, and a plain sentence for the cases
pydantic words badly (a missing body, a union none of whose arms matched).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvbench.server.schemas import ApiError

# What each union field accepts, said once (pydantic lists one complaint per arm).
UNION_FIELDS = {
    "prompt": "a string, a list of token ids, or a list of one string or one list of token ids",
    "stop": "a string or a list of at most 4 strings",
    "content": "a string, a list of text parts, or null",
}


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _path(loc: Sequence[Any]) -> str:
    """``("body", "messages", 0, "role")`` -> ``messages[0].role``; union tags dropped."""
    path = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.isidentifier() and part not in _TYPE_TAGS:
            path += f".{part}" if path else part
        # else: a union member's tag such as "str", "list[int]" or "function-after[...]"
    return path


def invalid_body_error(errors: Sequence[dict[str, Any]]) -> ApiError:
    """The one ``ApiError`` (400) for FastAPI's ``RequestValidationError.errors()``."""
    if not errors:
        return ApiError(400, "invalid request body")
    # A union reports one error per arm; an arm whose type matched but whose value did not (a token id
    # out of range) says more than the arms of other types ("Input should be a valid string").
    specific = [e for e in errors if not str(e.get("type", "")).endswith("_type")]
    problem = (specific or errors)[0]
    if problem.get("type") == "json_invalid":
        return ApiError(400, f"malformed JSON body: {problem.get('msg')}")
    path = _path(problem.get("loc", ()))
    if not path:
        if problem.get("type") == "missing":
            return ApiError(400, "the request body is missing: send a JSON object with the request's fields")
        return ApiError(400, f"the request body must be a JSON object: {problem.get('msg')}")
    field = path.split(".")[-1].split("[")[0]
    if not specific and field in UNION_FIELDS and len(errors) > 1:
        return ApiError(400, f"{path}: must be {UNION_FIELDS[field]}", path)
    return ApiError(400, f"{path}: {problem.get('msg')}", path)
