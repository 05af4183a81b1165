"""Text trace generators: shared-prefix, multi-prefix, one-off, plus what every generator shares.

Each generator is a pure function ``(config, tokenizer) -> Trace``, deterministic in
``config.seed``; token lengths are exact in the tokenizer (``kvbench.workloads.text_fit``).

* ``shared-prefix``: one system prompt of exactly ``system_tokens`` tokens shared by every request,
  plus a unique user question of exactly ``question_tokens`` tokens (the shared_2k workload).
* ``multi-prefix-text``: ``num_prefixes`` system prompts of ``prefix_tokens`` tokens, chosen per
  request by Zipf (P(k) ~ 1/k**s) or round-robin popularity, plus ``unique_tokens`` unique tokens.
* ``one-off``: prompts that never repeat (cache polluters): a single user message whose first line
  carries a random 16-hex-digit request tag, so no two share even their first block.

Shared options (:class:`MixOptions`):

* ``one_off_ratio``: that fraction of the final trace is one-off requests of ``one_off_tokens``
  tokens and :data:`ONE_OFF_MAX_TOKENS` output tokens, at uniform times over the trace's span.
* ``volatile_header``: ``start`` puts ``Current time: <unix time of the arrival, in microseconds>``
  as the first line of the system prompt (different per request, and inside the first 16-token
  block, so no two requests share any block), ``end`` as its last line (the blocks before it stay
  shared); the system prompt keeps its ``system_tokens`` tokens and the header's 12 come on top.
* ``num_tenants``: > 0 gives session i the tenant salt ``tenant-{i % num_tenants}``.

Arrivals are Poisson (exponential gaps) at the configured rate; ``arrival_ms`` starts at 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from kvbench.request import Message
from kvbench.workloads import text
from kvbench.workloads.dists import IntDist
from kvbench.workloads.formats.kvbench_trace import Trace, TraceRequest, new_trace
from kvbench.workloads.text_fit import PieceCounter, fit_text
from kvbench.workloads.token_ids import MultiPrefixShape, Popularity, zipf_weights
from kvbench.workloads.tokenizer import Tokenizer, render_all

ONE_OFF_MAX_TOKENS = 64  # output budget of one-off requests mixed into other traces
MIN_MESSAGE_TOKENS = 16  # smallest user message / observation: the opening line needs ~10 tokens
_CLOCK_ORIGIN_S = 1_735_689_600  # volatile header time at arrival 0: 2025-01-01T00:00:00Z, unix seconds


class HeaderPlacement(str, Enum):
    """Where the volatile ``Current time:`` line goes in the system prompt."""

    NONE = "none"
    START = "start"
    END = "end"

    def __str__(self) -> str:
        return self.value


def check_numbers(config: Any, names: Sequence[str], minimum: float = 1) -> None:
    """Raise ``ValueError`` naming the first field of ``names`` that is not a number >= ``minimum``."""
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= minimum:
            raise ValueError(f"{name} must be a number >= {minimum}, got {value!r}")


# one generated text (a ``*_tokens`` field): 1 Mi tokens, beyond any model's context
MAX_TEXT_TOKENS = 1 << 20
MAX_COUNT = (
    1_000_000  # requests, conversations, prefixes... (any other field but a seed): ~GBs of token ids already
)


def check_ints(config: Any, names: Sequence[str], minimum: int = 1) -> None:
    """Raise ``ValueError`` naming the first field of ``names`` that is not an integer >= ``minimum``,
    or that is larger than generating it could ever finish: :data:`MAX_TEXT_TOKENS` for a
    ``*_tokens`` field, :data:`MAX_COUNT` for any other but ``seed`` and sizes in bytes (``system_tokens =
    1e8`` hung
    the generator, ``num_requests = 1e12`` ran out of memory)."""
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
        maximum = (
            None
            if name == "seed" or name.endswith("_bytes")
            else MAX_TEXT_TOKENS
            if name.endswith("_tokens")
            else MAX_COUNT
        )
        if maximum is not None and value > maximum:
            raise ValueError(f"{name} must be at most {maximum:,}, got {value:,}")


@dataclass(frozen=True)
class MixOptions:
    """Options every text generator with a system prompt shares (module docstring)."""

    seed: int = 0
    one_off_ratio: float = 0.0
    one_off_tokens: int = 1000
    volatile_header: HeaderPlacement = HeaderPlacement.NONE
    num_tenants: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "volatile_header", HeaderPlacement(self.volatile_header))
        check_ints(self, ("seed", "num_tenants"), minimum=0)
        check_ints(self, ("one_off_tokens",), minimum=MIN_MESSAGE_TOKENS)
        if isinstance(self.one_off_ratio, bool) or not 0 <= self.one_off_ratio < 1:
            raise ValueError(f"one_off_ratio must be in [0, 1), got {self.one_off_ratio!r}")


@dataclass(frozen=True)
class SharedPrefixConfig(MixOptions):
    """``shared-prefix``: one system prompt + a unique question per request (module docstring)."""

    num_requests: int = 2000
    system_tokens: int = 2000
    question_tokens: int = 50
    max_tokens: int = 64
    request_rate_per_s: float = 8.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_ints(self, ("num_requests", "max_tokens", "system_tokens"))
        check_ints(self, ("question_tokens",), minimum=MIN_MESSAGE_TOKENS)
        check_numbers(self, ("request_rate_per_s",), minimum=1e-9)


@dataclass(frozen=True)
class MultiPrefixTextConfig(MultiPrefixShape, MixOptions):
    """``multi-prefix-text``: the multi-prefix workload as text (module docstring); its prefixes,
    requests and popularity are :class:`MultiPrefixShape`'s (fields after :class:`MixOptions`')."""

    max_tokens: int = 64
    request_rate_per_s: float = 8.0

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "popularity", Popularity(self.popularity))
        check_ints(self, ("num_prefixes", "prefix_tokens", "num_requests", "max_tokens"))
        check_ints(self, ("unique_tokens",), minimum=MIN_MESSAGE_TOKENS)
        check_numbers(self, ("request_rate_per_s",), minimum=1e-9)
        check_numbers(self, ("zipf_exponent",), minimum=0)


@dataclass(frozen=True)
class OneOffConfig:
    """``one-off``: ``num_requests`` prompts that never repeat, of ``prompt_tokens`` tokens each."""

    num_requests: int = 500
    prompt_tokens: IntDist = IntDist("const", (1000.0,))
    max_tokens: int = 64
    request_rate_per_s: float = 8.0
    seed: int = 0

    def __post_init__(self) -> None:
        IntDist.parse_field(self, "prompt_tokens")
        check_ints(self, ("num_requests", "max_tokens"))
        check_ints(self, ("seed",), minimum=0)
        check_numbers(self, ("request_rate_per_s",), minimum=1e-9)


@dataclass(frozen=True)
class Draft:
    """A request before ids and token counts: what generators produce."""

    session_id: str
    turn: int
    arrival_ms: float
    max_tokens: int
    messages: tuple[Message, ...] | None = None
    prompt: str | None = None
    salt: str | None = None
    output_tokens: int | None = None  # the real output length, when the source records one


def config_params(config: Any) -> dict[str, Any]:
    """A config's fields as JSON values (enums by value, distributions by spelling)."""
    params = {}
    for item in dataclasses.fields(config):
        value = getattr(config, item.name)
        if isinstance(value, (Enum, IntDist)):
            value = value.value if isinstance(value, Enum) else value.spec
        params[item.name] = value
    return params


def poisson_arrivals_ms(rng: np.random.Generator, num_events: int, rate_per_s: float) -> np.ndarray:
    """Arrival offsets of a Poisson process, ms, starting at 0; shape (num_events,)."""
    gaps_ms = rng.exponential(1000.0 / rate_per_s, size=num_events)
    return np.round(np.cumsum(gaps_ms) - gaps_ms[0], 3) if num_events else gaps_ms


def volatile_header_line(arrival_ms: float) -> str:
    """``Current time: <unix seconds, 6 decimals>`` at an arrival offset (0 = 2025-01-01T00:00:00Z).

    Unix time to the microsecond (like ``time.time()``) rather than a calendar string: the whole
    line is 12 cl100k tokens, so with the 3 ChatML tokens before it, it lies inside the first
    16-token block and two requests at different times share no block at all. A calendar time
    (``2025-01-01 00:00:12.345``) differs only after the first block, which would stay shared.
    """
    micros = round(float(arrival_ms) * 1000)
    return f"Current time: {_CLOCK_ORIGIN_S + micros // 1_000_000}.{micros % 1_000_000:06d}\n"


def system_message(system_text: str, placement: HeaderPlacement, arrival_ms: float) -> Message:
    """The system message, with the volatile header line where ``placement`` says."""
    if placement is HeaderPlacement.START:
        system_text = volatile_header_line(arrival_ms) + system_text
    elif placement is HeaderPlacement.END:
        system_text = system_text + volatile_header_line(arrival_ms)
    return Message("system", system_text)


def tenant_salt(options: MixOptions, session_index: int) -> str | None:
    """``tenant-{i % num_tenants}`` for session i, or ``None`` without tenants."""
    return f"tenant-{session_index % options.num_tenants}" if options.num_tenants else None


def one_off_text(counter: PieceCounter, rng: np.random.Generator, num_tokens: int) -> str:
    """A never-repeating text of exactly ``num_tokens`` tokens (random request tag first)."""

    def pieces():
        yield f"Request {int(rng.integers(1 << 62)):016x}:\n"
        yield from text.document_pieces(rng)

    return fit_text(counter, pieces(), num_tokens, rng)


def mix_one_offs(drafts: list[Draft], options: MixOptions, counter: PieceCounter) -> list[Draft]:
    """``drafts`` plus one-off requests making up ``options.one_off_ratio`` of the result."""
    if options.one_off_ratio == 0 or not drafts:
        return drafts
    count = round(len(drafts) * options.one_off_ratio / (1 - options.one_off_ratio))
    rng = np.random.default_rng([options.seed, 0x0FF])  # its own stream: the main trace is unchanged
    span_ms = max(d.arrival_ms for d in drafts)
    arrivals = np.round(np.sort(rng.uniform(0, span_ms, size=count)), 3)
    extra = [
        Draft(
            f"one-off-{i:05d}",
            0,
            float(arrivals[i]),
            ONE_OFF_MAX_TOKENS,
            messages=(Message("user", one_off_text(counter, rng, options.one_off_tokens)),),
        )
        for i in range(count)
    ]
    return drafts + extra


def finish_trace(generator: str, config: Any, tokenizer: Tokenizer, drafts: list[Draft]) -> Trace:
    """Sort drafts by arrival (stable), number them ``r000000``.., count their rendered tokens."""
    ordered = sorted(drafts, key=lambda d: d.arrival_ms)
    requests = []
    for index, (draft, token_ids) in enumerate(zip(ordered, render_all(tokenizer, ordered))):
        requests.append(
            TraceRequest(
                f"r{index:06d}",
                draft.session_id,
                draft.turn,
                draft.arrival_ms,
                draft.max_tokens,
                int(token_ids.shape[0]),
                messages=draft.messages,
                prompt=draft.prompt,
                salt=draft.salt,
                output_tokens=draft.output_tokens,
            )
        )
    return new_trace(
        generator,
        config_params(config),
        getattr(config, "seed", None),
        tokenizer.name,
        tokenizer.chat_format,
        requests,
    )


def system_prompt_text(
    counter: PieceCounter, rng: np.random.Generator, num_tokens: int, role_line: str, num_extra_tools: int = 4
) -> str:
    """A system prompt of exactly ``num_tokens`` tokens: role, rules, tool schemas, examples."""
    tools = list(text.AGENT_TOOLS) + [text.made_up_tool(rng, i) for i in range(num_extra_tools)]
    return fit_text(counter, text.system_prompt_pieces(rng, role_line, tools), num_tokens, rng)


def _assistant_role(rng: np.random.Generator, index: int) -> str:
    return (
        f"You are assistant {index + 1} of the {text.pick(rng, text.PROJECTS)} team: "
        "you help engineers debug and ship code.\n"
    )


def _single_turn_drafts(
    options: MixOptions,
    systems: Sequence[str],
    choices: np.ndarray,
    question_tokens: int,
    max_tokens: int,
    rate_per_s: float,
    counter: PieceCounter,
    rng: np.random.Generator,
) -> list[Draft]:
    """One draft per choice: system prompt ``systems[choice]`` + a unique question."""
    arrivals = poisson_arrivals_ms(rng, len(choices), rate_per_s)
    drafts = []
    for index, choice in enumerate(choices.tolist()):
        question = fit_text(counter, text.question_lines(rng), question_tokens, rng)
        system = system_message(systems[choice], options.volatile_header, float(arrivals[index]))
        drafts.append(
            Draft(
                f"req-{index:06d}",
                0,
                float(arrivals[index]),
                max_tokens,
                messages=(system, Message("user", question)),
                salt=tenant_salt(options, index),
            )
        )
    return drafts


def generate_shared_prefix(config: SharedPrefixConfig, tokenizer: Tokenizer) -> Trace:
    """The ``shared-prefix`` trace (module docstring)."""
    counter, rng = PieceCounter(tokenizer), np.random.default_rng(config.seed)
    systems = [system_prompt_text(counter, rng, config.system_tokens, _assistant_role(rng, 0))]
    choices = np.zeros(config.num_requests, dtype=np.int64)
    drafts = _single_turn_drafts(
        config,
        systems,
        choices,
        config.question_tokens,
        config.max_tokens,
        config.request_rate_per_s,
        counter,
        rng,
    )
    return finish_trace("shared-prefix", config, tokenizer, mix_one_offs(drafts, config, counter))


def generate_multi_prefix(config: MultiPrefixTextConfig, tokenizer: Tokenizer) -> Trace:
    """The ``multi-prefix-text`` trace (module docstring)."""
    counter, rng = PieceCounter(tokenizer), np.random.default_rng(config.seed)
    systems = [
        system_prompt_text(counter, rng, config.prefix_tokens, _assistant_role(rng, k))
        for k in range(config.num_prefixes)
    ]
    if config.popularity is Popularity.ROUND_ROBIN:
        choices = np.arange(config.num_requests) % config.num_prefixes
    else:
        weights = zipf_weights(config.num_prefixes, config.zipf_exponent)
        choices = rng.choice(config.num_prefixes, size=config.num_requests, p=weights)
    drafts = _single_turn_drafts(
        config,
        systems,
        choices,
        config.unique_tokens,
        config.max_tokens,
        config.request_rate_per_s,
        counter,
        rng,
    )
    return finish_trace("multi-prefix-text", config, tokenizer, mix_one_offs(drafts, config, counter))


def generate_one_off(config: OneOffConfig, tokenizer: Tokenizer) -> Trace:
    """The ``one-off`` trace (module docstring); prompts shorter than 16 tokens are raised to 16."""
    counter, rng = PieceCounter(tokenizer), np.random.default_rng(config.seed)
    sizes = config.prompt_tokens.sample(rng, config.num_requests, minimum=MIN_MESSAGE_TOKENS)
    arrivals = poisson_arrivals_ms(rng, config.num_requests, config.request_rate_per_s)
    drafts = [
        Draft(
            f"one-off-{i:05d}",
            0,
            float(arrivals[i]),
            config.max_tokens,
            messages=(Message("user", one_off_text(counter, rng, int(sizes[i]))),),
        )
        for i in range(config.num_requests)
    ]
    return finish_trace("one-off", config, tokenizer, drafts)
