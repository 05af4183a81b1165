"""``kvbench break shared-salt``: without per-tenant salts, TTFT tells tenant B what tenant A sent.

Tenant A sends a private prompt, which the cache keeps. Tenant B then sends guesses of it: a correct
guess (the same prompt) is served from A's blocks and its first token comes back sooner than a wrong
guess (a different prompt of the same length). Timing alone answers "did someone send exactly
this?" (the prompt-cache side channel of e.g. Gu et al., "Auditing Prompt Caching in Language Model
APIs", 2025). vLLM's ``cache_salt`` (mixed into block 0's hash) closes it: with a salt per tenant,
B's keys never match A's, B gets 0 cached tokens and both kinds of guesses cost the same.

Each trial uses a fresh private prompt and a fresh wrong guess, and B sends the two guesses in a
seeded random order. The TTFTs of correct and wrong guesses are compared with a one-sided
Mann-Whitney U test (normal approximation with tie correction; no scipy needed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from rich.table import Table

from kvbench.breaks.common import (
    ParquetTable, Progress, VariantRun, break_schema, format_ms, run_variant, variant_engine,
    verdict_table, warm_up,
)
from kvbench.cache.base import CacheConfig
from kvbench.run.config import EngineKind
from kvbench.engine.model import LoadedModel
from kvbench.request import Request
from kvbench.results.summary import percentile
from kvbench.sim.bounds import unbounded_capacity_blocks
from kvbench.workloads.formats.kvbench_trace_reader import trace_requests
from kvbench.workloads.dists import IntDist
from kvbench.workloads.generators import OneOffConfig, check_ints, generate_one_off
from kvbench.workloads.tokenizer import Tokenizer, load_tokenizer

EXPERIMENT = "shared-salt"
SALTS = {"unsalted": ("", ""), "salted": ("tenant-a", "tenant-b")}  # variant -> (A's salt, B's salt)
PRIVATE, CORRECT, WRONG = "private", "correct-guess", "wrong-guess"
EXTRA_FIELDS = (
    pa.field("tenant", pa.string()),  # "a" (the victim) or "b" (the prober)
    pa.field("probe", pa.string()),   # "private" (A's prompt), "correct-guess" or "wrong-guess"
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


def mann_whitney_less(first: Sequence[float], second: Sequence[float]) -> tuple[float, float]:
    """One-sided Mann-Whitney U test that ``first`` tends to be smaller than ``second``.

    Returns ``(u, p)``: ``u`` counts pairs with ``first > second`` (ties count one half), ``p`` is
    P(U <= u) under the null hypothesis by the normal approximation with tie correction and a
    continuity correction (Mann & Whitney 1947; the formulas of ``scipy.stats.mannwhitneyu``).

    Raises:
        ValueError: either sample is empty.
    """
    x, y = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    n1, n2 = x.size, y.size
    if not n1 or not n2:
        raise ValueError("both samples need at least one value")
    values, inverse, counts = np.unique(np.concatenate([x, y]), return_inverse=True, return_counts=True)
    mean_ranks = np.cumsum(counts) - (counts - 1) / 2.0  # average rank of each distinct value
    u = float(mean_ranks[inverse[:n1]].sum() - n1 * (n1 + 1) / 2.0)
    n = n1 + n2
    tie_term = float((counts**3 - counts).sum()) / (n * (n - 1)) if n > 1 else 0.0
    sigma = math.sqrt(n1 * n2 / 12.0 * ((n + 1) - tie_term))
    if sigma == 0:
        return u, 1.0
    z = (u + 0.5 - n1 * n2 / 2.0) / sigma
    return u, 0.5 * math.erfc(-z / math.sqrt(2.0))


@dataclass(frozen=True)
class ChannelTest:
    """B's guesses in one variant: TTFT medians, cached tokens and the test's p-value."""

    p50_correct_ttft_ms: float
    p50_wrong_ttft_ms: float
    p_value: float
    max_correct_cached_tokens: int
    max_wrong_cached_tokens: int

    @property
    def ttft_ratio(self) -> float:
        """Wrong-guess over correct-guess TTFT median: how much faster a correct guess comes back."""
        return self.p50_wrong_ttft_ms / self.p50_correct_ttft_ms if self.p50_correct_ttft_ms else math.nan


def channel_test(run: VariantRun) -> ChannelTest:
    """Compare the TTFTs of B's correct and wrong guesses in ``run``."""
    correct = [row for row in run.rows if row["probe"] == CORRECT]
    wrong = [row for row in run.rows if row["probe"] == WRONG]
    _, p_value = mann_whitney_less([r["ttft_ms"] for r in correct], [r["ttft_ms"] for r in wrong])
    return ChannelTest(percentile((r["ttft_ms"] for r in correct), 50), percentile((r["ttft_ms"] for r in wrong), 50),
                       p_value, max(r["cached_prompt_tokens"] for r in correct),
                       max(r["cached_prompt_tokens"] for r in wrong))


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

    @property
    def verdict(self) -> str:
        shared, salted = self.test("unsalted"), self.test("salted")
        return (f"unsalted: correct guesses come back {shared.ttft_ratio:.1f}x faster (p = {shared.p_value:.1e}), "
                f"so B {'learns' if self.leaks('unsalted') else 'cannot tell'} whether A sent that prompt; "
                f"per-tenant salts: {salted.ttft_ratio:.2f}x (p = {salted.p_value:.2f}) and "
                f"{salted.max_correct_cached_tokens} cached tokens for B: "
                f"{'still a difference' if self.leaks('salted') else 'nothing leaks'}")

    def parquet_tables(self) -> list[ParquetTable]:
        return [ParquetTable([row for run in self.runs for row in run.rows], break_schema(EXTRA_FIELDS))]

    def metadata(self) -> dict:
        return {"config": vars(self.config), "verdict": self.verdict,
                "tests": {run.variant: vars(channel_test(run)) for run in self.runs}}


@dataclass(frozen=True)
class TrialStep:
    """One request of the protocol: who sends what, in which trial."""

    tenant: str  # "a" or "b"
    probe: str  # PRIVATE, CORRECT or WRONG
    trial: int


def trial_requests(prompts: Sequence[Request], num_trials: int, salts: tuple[str, str],
                   seed: int) -> tuple[list[Request], list[TrialStep]]:
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
    requests = [Request(index, f"t{step.trial}-{step.tenant}-{step.probe}", f"tenant-{step.tenant}", 0,
                        prompt.token_ids, max_tokens=prompt.max_tokens, salt=salt_of[step.tenant])
                for index, (step, prompt) in enumerate(zip(steps, chosen))]
    return requests, steps


def run_shared_salt(loaded: LoadedModel, config: SharedSaltConfig = SharedSaltConfig(),
                    tokenizer: Tokenizer | None = None, progress: Progress | None = None) -> SharedSaltResult:
    """Run the trials with one shared namespace, then with a salt per tenant (fresh cache each)."""
    tokenizer = tokenizer or load_tokenizer()
    trace = generate_one_off(OneOffConfig(num_requests=2 * config.num_trials,
                                          prompt_tokens=IntDist("const", (float(config.prompt_tokens),)),
                                          max_tokens=config.max_tokens, seed=config.seed), tokenizer)
    prompts = trace_requests(trace, tokenizer)
    # never evicts: each tenant's namespace may hold a copy of every block
    capacity = 2 * unbounded_capacity_blocks((p.num_tokens for p in prompts), config.block_size)
    warm_up(loaded, prompts[0].prompt_tokens)
    runs = []
    for variant, salts in SALTS.items():
        requests, steps = trial_requests(prompts, config.num_trials, salts, config.seed)
        engine = variant_engine(loaded, CacheConfig(capacity, config.block_size), config.engine)

        def hook(request, result, steps=steps):
            step = steps[request.index]
            return {"tenant": step.tenant, "probe": step.probe, "trial": step.trial}

        runs.append(run_variant(engine, requests, EXPERIMENT, variant, hook, progress))
    return SharedSaltResult(config, runs)


def shared_salt_table(result: SharedSaltResult) -> Table:
    """TTFT medians of B's correct and wrong guesses, B's cached tokens and the test, per variant."""
    rows = []
    for run in result.runs:
        test = channel_test(run)
        rows.append((run.variant, f"{test.max_correct_cached_tokens} / {test.max_wrong_cached_tokens}",
                     format_ms(test.p50_correct_ttft_ms), format_ms(test.p50_wrong_ttft_ms), f"{test.ttft_ratio:.2f}",
                     f"{test.p_value:.1e}", "yes" if result.leaks(run.variant) else "no"))
    config = result.config
    notes = [f"{config.num_trials} trials: A sends a private {config.prompt_tokens}-token prompt, then B sends a "
             f"correct and a wrong guess (random order); fresh prompts every trial",
             f"cached tokens: most B got on a correct / wrong guess; p: one-sided Mann-Whitney U (correct faster "
             f"than wrong), leak = p < {config.alpha}"]
    return verdict_table("kvbench break shared-salt: a TTFT side channel between tenants", (
        "namespace", "B cached tokens", "correct guess TTFT p50 (ms)", "wrong guess TTFT p50 (ms)",
        "wrong / correct", "p", "leak"), rows, result.verdict, notes)
