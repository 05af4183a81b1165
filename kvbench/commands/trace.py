"""``kvbench trace gen KIND ... -o FILE``, ``kvbench trace import FORMAT SRC -o FILE`` and
``kvbench trace stats FILE``: text traces."""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from kvbench.commands.trace_common import Out, Seed, TokenizerName, make_config, write_replacing
from kvbench.commands.trace_gen import gen_app
from kvbench.errors import InputError
from kvbench.request import Request
from kvbench.run.scenario import parse_int_list
from kvbench.run.source import load_source
from kvbench.sim.replay import ideal_hit_rate, prepare_prompts
from kvbench.words import counted
from kvbench.workloads.formats.importing import ImportConfig, import_trace
from kvbench.workloads.formats.kvbench_trace import Trace
from kvbench.workloads.tokenizer import load_tokenizer
from kvbench.workloads.trace_stats import longest_cached_prefixes, reuse_breakdown, summarize

trace_app = typer.Typer(
    help="Generate text traces and show what they offer a prefix cache.", no_args_is_help=True
)
trace_app.add_typer(gen_app, name="gen")


class ImportFormat(str, Enum):
    JSONL = "jsonl"
    SHAREGPT = "sharegpt"
    BURSTGPT = "burstgpt"
    MOONCAKE = "mooncake"
    HASH_IDS = "hash-ids"


@trace_app.command("import")
def import_(
    format: Annotated[
        ImportFormat,
        typer.Argument(
            help="jsonl (prompt or messages per line), sharegpt (JSON array), "
            "burstgpt (CSV), mooncake (512-token hash ids), hash-ids "
            "(16-token hash ids with chat_id / parent_chat_id)."
        ),
    ],
    source: Annotated[Path, typer.Argument(help="The file to import.")],
    out: Out,
    block_size: Annotated[
        int | None, typer.Option(help="mooncake / hash-ids: tokens per hash id (default 512 / 16).")
    ] = None,
    skip_bad: Annotated[
        bool, typer.Option("--skip-bad", help="Leave malformed rows out and count them.")
    ] = False,
    num_requests: Annotated[
        int | None,
        typer.Option("--requests", "--num-requests", min=1, help="Import only the first N requests."),
    ] = None,
    conversation_gap_s: Annotated[
        float, typer.Option(help="sharegpt: seconds between conversation starts (it has no timestamps).")
    ] = ImportConfig.conversation_gap_s,
    think_time_s: Annotated[
        float, typer.Option(help="sharegpt: seconds between a conversation's turns.")
    ] = ImportConfig.think_time_s,
    seed: Seed = 0,
    tokenizer: TokenizerName = None,
) -> None:
    """Import other people's traffic as a kvbench trace; token counts are the tokenizer's."""
    config = make_config(
        ImportConfig,
        format=format.value,
        source=str(source),
        block_size=block_size,
        seed=seed,
        conversation_gap_s=conversation_gap_s,
        think_time_s=think_time_s,
        num_requests=num_requests,
        skip_bad=skip_bad,
    )
    tokenizer_ = load_tokenizer(tokenizer)
    started = time.perf_counter()
    with Console(stderr=True).status(f"importing {format.value}"):
        imported = import_trace(config, tokenizer_)
    replaced = write_replacing(imported.trace, out)
    trace = imported.trace
    num_tokens = sum(r.expected_prompt_tokens for r in trace.requests)
    Console().print(
        f"imported {counted(len(trace.requests), 'request')} ({counted(trace.num_sessions, 'session')}, "
        f"{num_tokens:,} prompt tokens, {tokenizer_.name}) to {out}{replaced} in "
        f"{time.perf_counter() - started:.1f} s",
        markup=False,
    )
    if imported.num_skipped:
        Console(stderr=True).print(
            f"skipped {imported.num_skipped:,} bad row(s); first: {imported.first_skipped}",
            soft_wrap=True,
            markup=False,
        )


def _summary_table(path: Path, requests: list[Request], trace: Trace | None) -> Table:
    summary = summarize(requests, trace)
    sessions = f", {summary.num_sessions:,} sessions" if summary.num_sessions is not None else ""
    table = Table(
        title=f"kvbench trace stats: {path.name} ({counted(summary.num_requests, 'request')}{sessions})"
    )
    for column in ("tokens", "mean", "p50", "p99", "total"):
        table.add_column(column, justify="right")
    for label, values in (("prompt", summary.prompt_tokens), ("output budget", summary.output_budget_tokens)):
        table.add_row(
            label, f"{values.mean:,.1f}", f"{values.p50:,.0f}", f"{values.p99:,.0f}", f"{values.total:,}"
        )
    if trace is not None:
        header = trace.header
        table.caption = (
            f"generator {header.generator}, seed {header.seed}, {header.tokenizer} ({header.chat_format})"
        )
    return table


def _reuse_table(requests: list[Request], block_sizes: list[int]) -> Table:
    lcp, lengths = longest_cached_prefixes(requests)
    table = Table(title="token hit rate of an unbounded cache")
    for column in ("block", "ideal (sim)", "lost: last token", "lost: partial", "reusable"):
        table.add_column(column, justify="right")
    for block_size in block_sizes:
        ideal = ideal_hit_rate(prepare_prompts(requests, block_size))
        breakdown = reuse_breakdown(lcp, lengths, block_size)
        table.add_row(
            f"{block_size}",
            f"{ideal.token_hit_rate:.4f}",
            f"{breakdown.lost_to_last_token_rule:.4f}",
            f"{breakdown.lost_to_partial_blocks:.4f}",
            f"{breakdown.reusable_rate:.4f}",
        )
    table.caption = (
        "cached prompt tokens / prompt tokens; ideal + lost = reusable, the longest token "
        "prefix shared with any earlier request (same salt)"
    )
    return table


@trace_app.command("stats")
def stats(
    path: Annotated[Path, typer.Argument(help="Trace file (kvbench JSONL; Mooncake JSONL also works).")],
    block_sizes: Annotated[str, typer.Option(help="Block sizes for the ideal hit rate.")] = "16,64",
    num_requests: Annotated[
        int | None, typer.Option("--requests", "--num-requests", min=1, help="Only the first N requests.")
    ] = None,
) -> None:
    """Requests, sessions, prompt tokens, output budget, and the ideal hit rate with its losses."""
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if num_requests is not None and num_requests <= 0:
        raise InputError(f"--num-requests: {num_requests} is not a positive number of requests")
    sizes = parse_int_list(block_sizes, "--block-sizes")
    console = Console()
    with Console(stderr=True).status("reading and rendering"):
        if path.suffix == ".toml":
            raise InputError(f"{path}: not a trace file (kvbench JSONL or Mooncake JSONL)")
        loaded = load_source(path, limit=num_requests)
        requests, trace = loaded.requests, loaded.trace
    console.print(_summary_table(path, requests, trace))
    with Console(stderr=True).status("replaying through an unbounded cache"):
        table = _reuse_table(requests, sizes)
    console.print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(trace_app, name="trace")
