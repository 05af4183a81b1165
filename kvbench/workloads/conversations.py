"""Multi-turn text traces: ``chat`` conversations and ``agent`` tool loops, in replay mode.

Replay mode: the assistant text in a later turn's history is the trace's own text, written by the
generator, and the turn that "produced" it has ``max_tokens`` equal to its token count. So every
backend sees the same histories whatever it generates, and turn k+1's prompt starts with every token
of turn k's prompt (tests check this on token ids, after rendering).

* ``chat``: ``num_conversations`` conversations sharing one system prompt of ``system_tokens``
  tokens. Conversation c has ``turns`` turns (a distribution); turn t sends the system prompt, the
  t earlier (user, assistant) pairs and a new user message (``user_tokens``); its reply has
  ``reply_tokens`` tokens. Conversations start as a Poisson process (``conversation_rate_per_s``);
  turns follow after exponential think times (mean ``think_time_s``), so conversations interleave.
* ``agent``: ``num_agents`` agent runs. Run a uses system prompt ``a % num_system_prompts`` of
  ``system_tokens`` tokens (role, rules, JSON schemas of tools, examples) and a task of
  ``task_tokens`` tokens. Step s sends system + task + the s earlier (assistant tool call, user
  observation) pairs; the call is one JSON line (its natural length is the step's ``max_tokens``),
  the observation ``observation_tokens`` tokens in the tool's style (file listing, code, JSON, logs,
  stack traces). The last step's output budget is ``final_tokens``. Runs start as a Poisson process
  (``agent_rate_per_s``); steps follow after exponential gaps (mean ``step_time_s``).

Observations are ``user`` messages rather than ``tool`` messages so that every OpenAI-compatible
endpoint and chat template accepts the trace (``tool`` messages need ``tool_calls`` ids). Message
and observation sizes below 16 tokens are raised to 16 (the opening line needs about 10).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvbench.request import Message
from kvbench.workloads import text
from kvbench.workloads.dists import IntDist
from kvbench.workloads.formats.kvbench_trace import Trace
from kvbench.workloads.generators import (
    MIN_MESSAGE_TOKENS,
    Draft,
    MixOptions,
    check_ints,
    check_numbers,
    finish_trace,
    mix_one_offs,
    poisson_arrivals_ms,
    system_message,
    system_prompt_text,
    tenant_salt,
)
from kvbench.workloads.text_fit import PieceCounter, fit_text
from kvbench.workloads.tokenizer import Tokenizer


@dataclass(frozen=True)
class ChatConfig(MixOptions):
    """``chat`` (module docstring). Distributions: see :mod:`kvbench.workloads.dists`."""

    num_conversations: int = 100
    turns: IntDist = IntDist.parse("uniform:2,10")
    system_tokens: int = 300
    user_tokens: IntDist = IntDist.parse("lognormal:60,0.5")
    reply_tokens: IntDist = IntDist.parse("lognormal:180,0.5")
    conversation_rate_per_s: float = 0.5
    think_time_s: float = 10.0

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("turns", "user_tokens", "reply_tokens"):
            IntDist.parse_field(self, name)
        check_ints(self, ("num_conversations", "system_tokens"))
        check_numbers(self, ("conversation_rate_per_s", "think_time_s"), minimum=1e-9)


@dataclass(frozen=True)
class AgentConfig(MixOptions):
    """``agent`` (module docstring). Distributions: see :mod:`kvbench.workloads.dists`."""

    num_agents: int = 16
    steps: IntDist = IntDist.parse("uniform:4,12")
    system_tokens: int = 2000
    num_system_prompts: int = 1
    task_tokens: int = 120
    observation_tokens: IntDist = IntDist.parse("lognormal:300,0.6")
    final_tokens: int = 200
    agent_rate_per_s: float = 0.2
    step_time_s: float = 3.0

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("steps", "observation_tokens"):
            IntDist.parse_field(self, name)
        check_ints(self, ("num_agents", "system_tokens", "num_system_prompts", "final_tokens"))
        check_ints(self, ("task_tokens",), minimum=MIN_MESSAGE_TOKENS)
        check_numbers(self, ("agent_rate_per_s", "step_time_s"), minimum=1e-9)


def _session_arrivals_ms(
    rng: np.random.Generator, start_ms: float, num_turns: int, mean_gap_s: float
) -> np.ndarray:
    """Turn times of one session: ``start_ms``, then exponential gaps; shape (num_turns,)."""
    gaps_ms = rng.exponential(mean_gap_s * 1000.0, size=num_turns)
    gaps_ms[0] = 0.0
    return np.round(start_ms + np.cumsum(gaps_ms), 3)


def _conversation(
    config: ChatConfig,
    index: int,
    system_text: str,
    start_ms: float,
    num_turns: int,
    counter: PieceCounter,
    rng: np.random.Generator,
) -> list[Draft]:
    user_sizes = config.user_tokens.sample(rng, num_turns, minimum=MIN_MESSAGE_TOKENS)
    reply_sizes = config.reply_tokens.sample(rng, num_turns, minimum=MIN_MESSAGE_TOKENS)
    arrivals = _session_arrivals_ms(rng, start_ms, num_turns, config.think_time_s)
    history: list[Message] = []
    drafts = []
    for turn in range(num_turns):
        lines = text.question_lines(rng) if turn == 0 else text.followup_lines(rng)
        user = Message("user", fit_text(counter, lines, int(user_sizes[turn]), rng))
        reply = Message("assistant", fit_text(counter, text.reply_pieces(rng), int(reply_sizes[turn]), rng))
        system = system_message(system_text, config.volatile_header, float(arrivals[turn]))
        drafts.append(
            Draft(
                f"chat-{index:04d}",
                turn,
                float(arrivals[turn]),
                int(reply_sizes[turn]),
                messages=(system, *history, user),
                salt=tenant_salt(config, index),
            )
        )
        history += [user, reply]
    return drafts


def generate_chat(config: ChatConfig, tokenizer: Tokenizer) -> Trace:
    """The ``chat`` trace (module docstring), deterministic in ``config.seed``."""
    counter, rng = PieceCounter(tokenizer), np.random.default_rng(config.seed)
    role = "You are a friendly support assistant for engineers. Be precise and brief.\n"
    system_text = system_prompt_text(counter, rng, config.system_tokens, role, num_extra_tools=0)
    turns = config.turns.sample(rng, config.num_conversations)
    starts = poisson_arrivals_ms(rng, config.num_conversations, config.conversation_rate_per_s)
    drafts = []
    for index in range(config.num_conversations):
        drafts += _conversation(
            config, index, system_text, float(starts[index]), int(turns[index]), counter, rng
        )
    return finish_trace("chat", config, tokenizer, mix_one_offs(drafts, config, counter))


def _agent_run(
    config: AgentConfig,
    index: int,
    system_text: str,
    start_ms: float,
    num_steps: int,
    counter: PieceCounter,
    rng: np.random.Generator,
) -> list[Draft]:
    task = Message("user", fit_text(counter, text.task_lines(rng), config.task_tokens, rng))
    sizes = config.observation_tokens.sample(rng, num_steps, minimum=MIN_MESSAGE_TOKENS)
    arrivals = _session_arrivals_ms(rng, start_ms, num_steps, config.step_time_s)
    history: list[Message] = []
    drafts = []
    for step in range(num_steps):
        system = system_message(system_text, config.volatile_header, float(arrivals[step]))
        messages = (system, task, *history)
        if step == num_steps - 1:
            max_tokens = config.final_tokens
        else:
            tool = text.pick(rng, text.AGENT_TOOLS)
            call = Message("assistant", text.tool_call_line(rng, tool))
            pieces = text.observation_pieces(rng, tool, step + 1)
            history += [call, Message("user", fit_text(counter, pieces, int(sizes[step]), rng))]
            max_tokens = counter.count(call.content)
        drafts.append(
            Draft(
                f"agent-{index:04d}",
                step,
                float(arrivals[step]),
                max_tokens,
                messages=messages,
                salt=tenant_salt(config, index),
            )
        )
    return drafts


def generate_agent(config: AgentConfig, tokenizer: Tokenizer) -> Trace:
    """The ``agent`` trace (module docstring), deterministic in ``config.seed``."""
    counter, rng = PieceCounter(tokenizer), np.random.default_rng(config.seed)
    systems = [
        system_prompt_text(
            counter,
            rng,
            config.system_tokens,
            f"You are coding agent {k + 1}: you fix bugs in a large repository "
            "by calling tools, one call per reply.\n",
        )
        for k in range(config.num_system_prompts)
    ]
    steps = config.steps.sample(rng, config.num_agents)
    starts = poisson_arrivals_ms(rng, config.num_agents, config.agent_rate_per_s)
    drafts = []
    for index in range(config.num_agents):
        drafts += _agent_run(
            config,
            index,
            systems[index % len(systems)],
            float(starts[index]),
            int(steps[index]),
            counter,
            rng,
        )
    return finish_trace("agent", config, tokenizer, mix_one_offs(drafts, config, counter))
