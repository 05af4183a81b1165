"""``kvbench trace gen KIND ... -o FILE``: generate a text trace (JSONL) with exact token counts, one
command per kind."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from kvbench.commands.signature import OptionGroup, with_options
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
NumRequests = Annotated[int, typer.Option("--requests", "--num-requests", min=1, help="Requests.")]
OutputBudget = Annotated[int, typer.Option(help="Output budget per request.")]
PoissonRate = Annotated[float, typer.Option(help="Poisson arrival rate.")]


# The options every kind but one-off and mooncake ends with, in this --help order (see with_options).
MIX: OptionGroup = {
    "seed": (Seed, 0),
    "one_off_ratio": (OneOffRatio, 0.0),
    "one_off_tokens": (OneOffTokens, 1000),
    "volatile_header": (Volatile, False),
    "volatile_header_at": (VolatileAt, HeaderAt.START),
    "tenants": (Tenants, 0),
    "tokenizer": (TokenizerName, None),
}


@dataclass(frozen=True)
class Mix:
    """The :data:`MIX` flags of one command: what any kind can mix into its trace (one-off requests, a
    volatile header, tenant salts), its seed, and the tokenizer that counts the tokens."""

    seed: int
    one_off_ratio: float
    one_off_tokens: int
    volatile_header: bool
    volatile_header_at: HeaderAt
    tenants: int
    tokenizer: str | None

    def config_fields(self) -> dict[str, Any]:
        """The fields of a kind's config these flags set (the tokenizer is not one)."""
        at = HeaderPlacement(self.volatile_header_at.value) if self.volatile_header else HeaderPlacement.NONE
        return {
            "seed": self.seed,
            "one_off_ratio": self.one_off_ratio,
            "one_off_tokens": self.one_off_tokens,
            "volatile_header": at,
            "num_tenants": self.tenants,
        }


def _generate_mixed(kind: str, out: Path, cls: type, flags: dict[str, Any]) -> None:
    """Build ``cls`` from a command's ``flags``: the kind's own options (its config's fields) and the
    :data:`MIX` ones, then generate the trace."""
    mix = Mix(**{name: flags[name] for name in MIX})
    own = {name: value for name, value in flags.items() if name not in MIX}
    _generate(kind, make_config(cls, **own, **mix.config_fields()), out, mix.tokenizer)


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


def _option(kind: type, help_text: str) -> Any:
    """``Annotated[kind, typer.Option(help=help_text)]``: one of a kind's own options."""
    return Annotated[kind, typer.Option(help=help_text)]


def _kind_options(cls: type, **annotations: Any) -> OptionGroup:
    """A kind's own options (see :func:`with_options`), each defaulting to ``cls``'s field of its name
    (a token distribution as its spec, e.g. ``uniform:2,10``)."""
    defaults = {name: getattr(cls, name) for name in annotations}
    return {
        name: (annotation, getattr(defaults[name], "spec", defaults[name]))
        for name, annotation in annotations.items()
    }


_SHARED_PREFIX = _kind_options(
    SharedPrefixConfig,
    num_requests=NumRequests,
    system_tokens=_option(int, "Tokens of the shared system prompt (S)."),
    question_tokens=_option(int, "Tokens of each unique question (Q)."),
    max_tokens=OutputBudget,
    request_rate_per_s=PoissonRate,
)
_MULTI_PREFIX = _kind_options(
    MultiPrefixTextConfig,
    num_prefixes=_option(int, "System prompts (P)."),
    prefix_tokens=_option(int, "Tokens of each system prompt (L)."),
    unique_tokens=_option(int, "Unique tokens per request (U)."),
    num_requests=NumRequests,
    popularity=_option(Popularity, "zipf: P(k) ~ 1/k**s; rr: round robin."),
    zipf_exponent=_option(float, "Zipf exponent s."),
    max_tokens=OutputBudget,
    request_rate_per_s=PoissonRate,
)
_CHAT = _kind_options(
    ChatConfig,
    num_conversations=_option(int, "Conversations (C)."),
    turns=_option(str, "Turns per conversation (6, uniform:A,B, geometric:M, lognormal:MED,SIGMA)."),
    system_tokens=_option(int, "Tokens of the shared system prompt."),
    user_tokens=_option(str, "Tokens per user message (distribution)."),
    reply_tokens=_option(str, "Tokens per assistant reply (distribution)."),
    conversation_rate_per_s=_option(float, "New conversations per second (Poisson)."),
    think_time_s=_option(float, "Mean gap between turns (exponential)."),
)
_AGENT = _kind_options(
    AgentConfig,
    num_agents=_option(int, "Agent runs (A), interleaved."),
    steps=_option(str, "Steps per agent run (distribution)."),
    system_tokens=_option(int, "Tokens of each system prompt (rules + tool schemas)."),
    num_system_prompts=_option(int, "Distinct system prompts; run a uses a % N."),
    task_tokens=_option(int, "Tokens of each run's task."),
    observation_tokens=_option(str, "Tokens per tool observation (distribution)."),
    final_tokens=_option(int, "Output budget of a run's last step."),
    agent_rate_per_s=_option(float, "New agent runs per second (Poisson)."),
    step_time_s=_option(float, "Mean gap between steps (exponential)."),
)


def _mixed_command(kind: str, cls: type, options: OptionGroup, doc: str) -> Any:
    """``kvbench trace gen NAME``: ``options`` (the kind's own) then :data:`MIX`, built into ``cls``."""

    @with_options(options, MIX)
    def command(out: Out, **flags: Any) -> None:
        _generate_mixed(kind, out, cls, flags)

    command.__doc__ = doc  # the command's --help
    return command


# command name -> (generator kind, config class, own options, --help)
_MIXED_KINDS = {
    "shared-prefix": (
        "shared-prefix",
        SharedPrefixConfig,
        _SHARED_PREFIX,
        "One S-token system prompt shared by every request + a unique Q-token question (shared_2k).",
    ),
    "multi-prefix": (
        "multi-prefix-text",
        MultiPrefixTextConfig,
        _MULTI_PREFIX,
        "P system prompts of L tokens with Zipf or round-robin popularity, U unique tokens each.",
    ),
    "chat": (
        "chat",
        ChatConfig,
        _CHAT,
        "Multi-turn conversations: each turn resends the history (the trace's own replies) + a new message.",
    ),
    "agent": (
        "agent",
        AgentConfig,
        _AGENT,
        "Agent loops: system prompt + task + every earlier (tool call, observation) pair, step by step.",
    ),
}
for _name, (_kind, _cls, _options, _doc) in _MIXED_KINDS.items():
    gen_app.command(_name)(_mixed_command(_kind, _cls, _options, _doc))


@gen_app.command("one-off")
def gen_one_off(
    out: Out,
    num_requests: NumRequests = OneOffConfig.num_requests,
    prompt_tokens: Annotated[
        str, typer.Option(help="Prompt tokens (distribution).")
    ] = OneOffConfig.prompt_tokens.spec,
    max_tokens: OutputBudget = OneOffConfig.max_tokens,
    request_rate_per_s: PoissonRate = OneOffConfig.request_rate_per_s,
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
