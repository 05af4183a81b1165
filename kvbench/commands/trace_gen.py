"""``kvbench trace gen KIND ... -o FILE``: generate a text trace (JSONL) with exact token counts, one
command per kind."""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from kvbench.commands.trace_common import Out, Seed, TokenizerName, make_config, write_replacing
from kvbench.errors import InputError, checked
from kvbench.words import counted
from kvbench.workloads.conversations import AgentConfig, ChatConfig
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

gen_app = typer.Typer(help="Generate a text trace (JSONL) with exact token counts.", no_args_is_help=True)


class HeaderAt(str, Enum):
    START = "start"
    END = "end"


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


def _generate(
    kind: str, config: Any, out: Path, tokenizer_name: str | None, base_dir: Path = Path(".")
) -> None:
    console, err = Console(), Console(stderr=True)
    tokenizer = load_tokenizer(tokenizer_name)
    started = time.perf_counter()
    with err.status(f"generating {kind} trace"):
        trace = checked(lambda: generate_trace(kind, config, tokenizer, base_dir))
    replaced = write_replacing(trace, out)
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
    config = make_config(
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
    config = make_config(
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
    config = make_config(
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
    config = make_config(
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
    config = make_config(
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
    config = make_config(MooncakeTextConfig, path=str(source), num_requests=num_requests, seed=seed)
    _generate("mooncake-text", config, out, None)
