"""``kvbench break shared-salt``: without per-tenant salts, TTFT tells tenant B what tenant A sent.

Tenant A sends a private prompt, which the cache keeps. Tenant B then sends guesses of it: a correct
guess (the same prompt) is served from A's blocks and its first token comes back sooner than a wrong
guess (a different prompt of the same length). Timing alone answers "did someone send exactly
this?" (the prompt-cache side channel of e.g. Gu et al., "Auditing Prompt Caching in Language Model
APIs", 2025). vLLM's ``cache_salt`` (mixed into block 0's hash) closes it: with a salt per tenant,
B's keys never match A's, B gets 0 cached tokens and both kinds of guesses cost the same.

Each trial uses a fresh private prompt and a fresh wrong guess, and B sends the two guesses in a
seeded random order. The TTFTs of correct and wrong guesses are compared with a one-sided
Mann-Whitney U test (:mod:`kvbench.breaks.rank_test`). The verdict says what the trials can show: a
p below alpha is a leak; with too few trials to reach alpha at all (3 trials: p >= 0.040 whatever the
TTFTs) it is "inconclusive" with the trials that could; otherwise not significant, with the effect
size measured, P(correct faster), and Noether's trials to detect it with 80% power.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from kvbench.breaks.common import (
    ParquetTable,
    Progress,
    VariantRun,
    VerdictTable,
    break_schema,
    format_ms,
    run_variant,
    variant_backend,
    warm_up,
)
from kvbench.breaks.rank_test import (
    POWER,
    detectable_effect,
    mann_whitney_less,
    probability_first_smaller,
    smallest_p_value,
    trials_for_effect,
    trials_to_reach,
)
from kvbench.cache.base import CacheConfig
from kvbench.engine.model import LoadedModel
from kvbench.request import Request
from kvbench.results.summary import percentile
from kvbench.run.config import EngineKind
from kvbench.sim.bounds import unbounded_capacity_blocks
from kvbench.workloads.dists import IntDist
from kvbench.workloads.formats.kvbench_trace_reader import trace_requests
from kvbench.workloads.generators import OneOffConfig, check_ints, generate_one_off
from kvbench.workloads.tokenizer import Tokenizer, load_tokenizer

EXPERIMENT = "shared-salt"
SALTS = {"unsalted": ("", ""), "salted": ("tenant-a", "tenant-b")}  # variant -> (A's salt, B's salt)
PRIVATE, CORRECT, WRONG = "private", "correct-guess", "wrong-guess"
EXTRA_FIELDS = (
    pa.field("tenant", pa.string()),  # "a" (the victim) or "b" (the prober)
    pa.field("probe", pa.string()),  # "private" (A's prompt), "correct-guess" or "wrong-guess"
    pa.field("trial", pa.int64()),
)


@dataclass(frozen=True)
class SharedSaltConfig:
    """Settings of the shared-salt experiment.

    Attributes:
        num_trials: private prompts; each gets one correct and one wrong guess from B.
        prompt_tokens: length of every prompt's message (>= 16).
        max_tokens: output tokens per request (TTFT only needs one).
        block_size: tokens per block.
        alpha: significance level for calling a TTFT difference a leak.
        seed: seeds the prompts and the order of B's guesses.
        engine: the in-process engine every variant runs on (``--engine copy|paged``).
    """

    num_trials: int = 40  # 40 + 40 TTFTs: a large effect is significant far below alpha
    prompt_tokens: int = 128
    max_tokens: int = 1
    block_size: int = 16
    alpha: float = 0.01
    seed: int = 0
    engine: EngineKind = EngineKind.COPY  # the seed's engine; paged: one KV pool, block tables

    def __post_init__(self) -> None:
        check_ints(self, ("num_trials", "max_tokens", "block_size"))
        check_ints(self, ("prompt_tokens",), minimum=16)
        check_ints(self, ("seed",), minimum=0)
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha!r}")


@dataclass(frozen=True)
class ChannelTest:
    """B's guesses in one variant: TTFT medians, cached tokens and the one-sided Mann-Whitney U test
    (:mod:`kvbench.breaks.rank_test`): its p-value, the smallest p these numbers of TTFTs can give,
    and P(correct faster), the share of (correct, wrong) pairs where the correct guess was faster."""

    p50_correct_ttft_ms: float
    p50_wrong_ttft_ms: float
    p_value: float
    max_correct_cached_tokens: int
    max_wrong_cached_tokens: int
    smallest_p_value: float = 0.0
    prob_correct_faster: float = math.nan

    @property
    def ttft_ratio(self) -> float:
        """Wrong-guess over correct-guess TTFT median: how much faster a correct guess comes back."""
        return self.p50_wrong_ttft_ms / self.p50_correct_ttft_ms if self.p50_correct_ttft_ms else math.nan


def channel_test(run: VariantRun) -> ChannelTest:
    """Compare the TTFTs of B's correct and wrong guesses in ``run``."""
    correct = [row.result for row in run.rows if row.extra["probe"] == CORRECT]
    wrong = [row.result for row in run.rows if row.extra["probe"] == WRONG]
    u, p_value = mann_whitney_less([r.ttft_ms for r in correct], [r.ttft_ms for r in wrong])
    return ChannelTest(
        percentile((r.ttft_ms for r in correct), 50),
        percentile((r.ttft_ms for r in wrong), 50),
        p_value,
        max(r.cached_prompt_tokens for r in correct),
        max(r.cached_prompt_tokens for r in wrong),
        smallest_p_value(len(correct), len(wrong)),
        probability_first_smaller(u, len(correct), len(wrong)),
    )


@dataclass(eq=False)
class SharedSaltResult:
    """Both variants: unsalted (one namespace) then salted (one per tenant)."""

    config: SharedSaltConfig
    runs: list[VariantRun]

    def test(self, variant: str) -> ChannelTest:
        return channel_test(next(run for run in self.runs if run.variant == variant))

    def leaks(self, variant: str) -> bool:
        """Correct guesses are significantly faster (p < alpha)."""
        return self.test(variant).p_value < self.config.alpha

    def can_reach_alpha(self, variant: str) -> bool:
        """Whether any TTFTs of this many trials could give p < alpha (``False``: too few trials)."""
        return self.test(variant).smallest_p_value < self.config.alpha

    def leak_text(self, variant: str) -> str:
        """The table's leak column: ``yes`` (p < alpha), ``no``, or ``inconclusive`` when too few trials."""
        return "yes" if self.leaks(variant) else "no" if self.can_reach_alpha(variant) else "inconclusive"

    @property
    def verdict(self) -> str:
        return f"unsalted: {self._unsalted_verdict()}; per-tenant salts: {self._salted_verdict()}"

    def _unsalted_verdict(self) -> str:
        test, alpha, trials = self.test("unsalted"), self.config.alpha, self.config.num_trials
        faster = (
            f"correct guesses come back {test.ttft_ratio:.1f}x faster"
            if not test.ttft_ratio < 1
            else f"correct guesses come back slower, median TTFT wrong / correct {test.ttft_ratio:.2f}"
        )
        if self.leaks("unsalted"):
            return f"{faster} (p = {test.p_value:.1e} < {alpha:g}), so B learns whether A sent that prompt"
        if not self.can_reach_alpha("unsalted"):
            return (
                f"{faster}, but inconclusive: {trials} trials cannot reach p < {alpha:g} whatever the TTFTs "
                f"(the smallest p of a one-sided Mann-Whitney U test over {trials} + {trials} TTFTs is "
                f"{test.smallest_p_value:.3f}, every correct guess faster); --trials "
                f"{trials_to_reach(alpha)} "
                f"or more can"
            )
        effect = test.prob_correct_faster
        needed = trials_for_effect(effect, alpha)
        power = (
            f"Noether's formula: ~{needed:,} trials detect an effect this size with {POWER:.0%} power"
            if needed is not None
            else "no sign that correct guesses are faster"
        )
        return (
            f"{faster} (p = {test.p_value:.2f} >= {alpha:g}): not shown at {trials} trials, "
            f"P(correct faster) = {effect:.2f} ({power}; {trials} trials detect P >= "
            f"{detectable_effect(trials, alpha):.2f})"
        )

    def _salted_verdict(self) -> str:
        test = self.test("salted")
        timing = f"{test.ttft_ratio:.2f}x (p = {test.p_value:.2f}" + (
            ")" if self.can_reach_alpha("salted") else ", too few trials for the timing alone)"
        )
        if test.max_correct_cached_tokens:
            return (
                f"{timing}, but B still got {test.max_correct_cached_tokens} cached tokens of A's: "
                "the salts did not separate them"
            )
        if self.leaks("salted"):
            return f"{timing} with 0 cached tokens for B: a difference that is not the cache's"
        return (
            f"{timing} and 0 cached tokens for B: A's blocks are out of B's reach, nothing leaks through "
            "the cache"
        )

    def parquet_tables(self) -> list[ParquetTable]:
        return [
            ParquetTable([row for run in self.runs for row in run.parquet_rows()], break_schema(EXTRA_FIELDS))
        ]

    def metadata(self) -> dict:
        return {
            "config": vars(self.config),
            "verdict": self.verdict,
            "tests": {run.variant: vars(channel_test(run)) for run in self.runs},
        }


@dataclass(frozen=True)
class TrialStep:
    """One request of the protocol: who sends what, in which trial."""

    tenant: str  # "a" or "b"
    probe: str  # PRIVATE, CORRECT or WRONG
    trial: int


def trial_requests(
    prompts: Sequence[Request], num_trials: int, salts: tuple[str, str], seed: int
) -> tuple[list[Request], list[TrialStep]]:
    """A's private prompt, then B's two guesses in a seeded random order, for every trial; and what
    each request is. ``prompts[t]`` is trial t's private prompt, ``prompts[num_trials + t]`` its
    wrong guess."""
    rng = np.random.default_rng([seed, 0x5A17])
    steps, chosen = [], []
    for trial in range(num_trials):
        guesses = [(CORRECT, prompts[trial]), (WRONG, prompts[num_trials + trial])]
        if rng.random() < 0.5:
            guesses.reverse()
        for tenant, (probe, prompt) in zip("abb", [(PRIVATE, prompts[trial]), *guesses]):
            steps.append(TrialStep(tenant, probe, trial))
            chosen.append(prompt)
    salt_of = {"a": salts[0], "b": salts[1]}
    requests = [
        Request(
            index,
            f"t{step.trial}-{step.tenant}-{step.probe}",
            f"tenant-{step.tenant}",
            0,
            prompt.token_ids,
            max_tokens=prompt.max_tokens,
            salt=salt_of[step.tenant],
        )
        for index, (step, prompt) in enumerate(zip(steps, chosen))
    ]
    return requests, steps


def run_shared_salt(
    loaded: LoadedModel,
    config: SharedSaltConfig = SharedSaltConfig(),
    tokenizer: Tokenizer | None = None,
    progress: Progress | None = None,
) -> SharedSaltResult:
    """Run the trials with one shared namespace, then with a salt per tenant (fresh cache each)."""
    tokenizer = tokenizer or load_tokenizer()
    trace = generate_one_off(
        OneOffConfig(
            num_requests=2 * config.num_trials,
            prompt_tokens=IntDist("const", (float(config.prompt_tokens),)),
            max_tokens=config.max_tokens,
            seed=config.seed,
        ),
        tokenizer,
    )
    prompts = trace_requests(trace, tokenizer)
    # never evicts: each tenant's namespace may hold a copy of every block
    capacity = 2 * unbounded_capacity_blocks((p.num_tokens for p in prompts), config.block_size)
    warm_up(loaded, prompts[0].prompt_tokens)
    runs = []
    for variant, salts in SALTS.items():
        requests, steps = trial_requests(prompts, config.num_trials, salts, config.seed)
        backend = variant_backend(loaded, CacheConfig(capacity, config.block_size), config.engine)

        def hook(request, result, steps=steps):
            step = steps[request.index]
            return {"tenant": step.tenant, "probe": step.probe, "trial": step.trial}

        runs.append(run_variant(backend, requests, EXPERIMENT, variant, hook, progress))
    return SharedSaltResult(config, runs)


def shared_salt_table(result: SharedSaltResult) -> VerdictTable:
    """TTFT medians of B's correct and wrong guesses, B's cached tokens and the test, per variant."""
    rows = []
    for run in result.runs:
        test = channel_test(run)
        rows.append(
            (
                run.variant,
                f"{test.max_correct_cached_tokens} / {test.max_wrong_cached_tokens}",
                format_ms(test.p50_correct_ttft_ms),
                format_ms(test.p50_wrong_ttft_ms),
                f"{test.ttft_ratio:.2f}",
                f"{test.p_value:.1e}",
                result.leak_text(run.variant),
            )
        )
    config = result.config
    smallest = channel_test(result.runs[0]).smallest_p_value
    notes = [
        f"{config.num_trials} trials: A sends a private {config.prompt_tokens}-token prompt, then B sends a "
        f"correct and a wrong guess (random order); fresh prompts every trial",
        f"cached tokens: most B got on a correct / wrong guess; p: one-sided Mann-Whitney U (correct faster "
        f"than wrong), leak = p < {config.alpha}; the smallest p {config.num_trials} trials can give is "
        f"{smallest:.2g} (inconclusive when it is >= {config.alpha})",
    ]
    return VerdictTable(
        "kvbench break shared-salt: a TTFT side channel between tenants",
        (
            "namespace",
            "B cached tokens",
            "correct guess TTFT p50 (ms)",
            "wrong guess TTFT p50 (ms)",
            "wrong / correct",
            "p",
            "leak",
        ),
        rows,
        result.verdict,
        notes,
    )
