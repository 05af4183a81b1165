"""Closed choices of the command line as ``str`` Enums, and the up-front checks of ``--device`` / ``--dtype``.

``--device`` and ``--dtype`` stay strings (``cuda:1`` and ``bf16`` are not Enum members) but are checked
while the flags are parsed, by a typer callback, so a bad value is one usage line and exit 2 before
any model (or torch) loads. Whether the device exists is checked later, where torch is loaded
(:func:`kvbench.engine.model.resolve_device`).
"""

from __future__ import annotations

import re
from enum import Enum

import typer

from kvbench.errors import InputError
from kvbench.memory.layout import DType, parse_bytes, parse_dtype

ENGINE_DTYPES = (DType.FP32, DType.BF16, DType.FP16)  # what torch computes in (engine/model.py torch_dtype)
_DEVICE = re.compile(r"cpu|mps|cuda(:\d+)?")  # ModelConfig's rule (engine/model.py), without torch


class CacheSwitch(str, Enum):
    """``--cache``: the prefix cache on or off."""

    ON = "on"
    OFF = "off"


class LogLevel(str, Enum):
    """``kvbench serve --log-level``: uvicorn's levels (uvicorn.config.LOG_LEVELS)."""

    CRITICAL = "critical"
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"
    DEBUG = "debug"
    TRACE = "trace"


def check_device(value: str | None) -> str | None:
    """typer callback: ``cpu``, ``cuda``, ``cuda:N`` or ``mps``, else ``typer.BadParameter`` (exit 2)."""
    if value is not None and not _DEVICE.fullmatch(value):
        raise typer.BadParameter("use cpu, cuda, cuda:N or mps")
    return value


def check_dtype(value: str | None) -> str | None:
    """typer callback: a dtype the engine computes in, in any :func:`parse_dtype` spelling (``bf16``,
    ``bfloat16``, ...), else ``typer.BadParameter`` (exit 2). The spelling is passed on unchanged."""
    if value is None:
        return value
    try:
        dtype = parse_dtype(value)
    except InputError:
        dtype = None
    if dtype not in ENGINE_DTYPES:
        raise typer.BadParameter("the engine runs in float32, bfloat16 or float16 (fp32, bf16, fp16)")
    return value


def check_positive(value: float | None) -> float | None:
    """typer callback for a float that must be > 0 (rates, scales): typer's ``min`` is inclusive only."""
    if value is not None and not value > 0:
        raise typer.BadParameter("must be > 0")
    return value


def positive_bytes(text: str, flag: str, must: str = "a positive size, e.g. 80GiB") -> int:
    """``parse_bytes(text)`` (``2GiB``, ``1e9``), refused as an ``InputError`` naming ``flag`` when it is
    not a size or not positive (``FLAG TEXT: must be MUST``)."""
    try:
        value = parse_bytes(text)
    except InputError as exc:
        raise InputError(f"{flag}: {exc}") from None
    if value <= 0:
        raise InputError(f"{flag} {text}: must be {must}")
    return value
