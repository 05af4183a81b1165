"""Option aliases shared by the commands (typer ``Annotated`` types), so one flag reads the same
everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvbench.cache.base import CacheKind, ReleaseOrder
from kvbench.cache.block_hash import HashAlgo
from kvbench.commands.choices import CacheSwitch, check_device, check_dtype, check_positive
from kvbench.run.config import Schedule, TurnMode

Source = Annotated[
    Path,
    typer.Argument(
        help="Scenario (.toml) or trace (.jsonl: kvbench, Mooncake, hash-id or prompts; .json: ShareGPT; "
        ".csv: BurstGPT)."
    ),
]
Device = Annotated[str, typer.Option(callback=check_device, help="cpu, cuda, cuda:N or mps.")]
DTypeName = Annotated[
    str, typer.Option(callback=check_dtype, help="float32, bfloat16 or float16 (or fp32, bf16, fp16).")
]
CacheKindOption = Annotated[CacheKind | None, typer.Option(help="Cache structure.")]
CacheOnOff = Annotated[CacheSwitch | None, typer.Option(help="Prefix cache on or off.")]
CacheSize = Annotated[str | None, typer.Option(help="Capacity in blocks (4096) or bytes (2GiB).")]
BlockSize = Annotated[int | None, typer.Option(min=1, help="Tokens per block (default: the scenario's).")]
Release = Annotated[ReleaseOrder | None, typer.Option(help="Free-list release order.")]
HashAlgoOption = Annotated[HashAlgo | None, typer.Option(help="Block hash function.")]
HashBits = Annotated[int | None, typer.Option(help="Keep only N bits of every key (8..256).")]
MaxTokens = Annotated[
    int | None, typer.Option(min=1, help="Output tokens per request (default: the trace's).")
]
PromptOnly = Annotated[
    bool,
    typer.Option(
        "--prompt-only",
        help="Cache prompt blocks only (default: every full block of prompt + output - 1 tokens, as vLLM).",
    ),
]
Requests = Annotated[
    int | None,
    typer.Option(
        "--requests",
        "--num-requests",
        "--num-prompts",
        min=1,
        help="Run only the first N requests (--num-prompts: vLLM's spelling).",
    ),
]
ScheduleOption = Annotated[
    Schedule | None,
    typer.Option(
        "--schedule",
        help="openai: rate = closed loop or --request-rate (default); trace = at the trace's own arrival "
        "times.",
    ),
]
TimeScale = Annotated[
    float | None,
    typer.Option(
        "--time-scale",
        callback=check_positive,
        help="openai, --schedule trace: replay X times faster, > 0 (0.5 = half speed; default 1).",
    ),
]
TurnsOption = Annotated[
    TurnMode | None,
    typer.Option(
        "--turns",
        help="scripted = a multi-turn trace's own assistant text (default); live = each real reply fed into "
        "the session's next turn.",
    ),
]
PreflightOption = Annotated[
    bool,
    typer.Option(
        "--preflight/--no-preflight",
        help="openai: check server, model, streaming, cached_tokens and cache_salt first.",
    ),
]
Threads = Annotated[
    int | None,
    typer.Option(
        help="Torch intra-op threads (default: the usable cores left free by the "
        "load at start, at least 1, at most torch's one per core)."
    ),
]
