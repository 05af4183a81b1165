"""``kvbench explain`` on files: a scenario or trace (a cache-only replay with ``kvbench run``'s cache
flags), or a run's Parquet file (the rows' reported ``cached_tokens`` against what the run's cache
config allows, on the requests re-read from the run's source file).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from kvbench.bill.rules import CacheRules
from kvbench.cache.base import CacheConfig
from kvbench.errors import InputError, checked
from kvbench.explain.api import Explanation, explain_requests, unbounded_config
from kvbench.explain.fix_kinds import fix_list
from kvbench.explain.fixes import Fix, FixOptions
from kvbench.explain.lint import LintReport, lint
from kvbench.explain.ran import RunRules, engine_rules, server_block_size, server_rules
from kvbench.memory.layout import ModelShape
from kvbench.memory.presets import DEFAULT_PRESET, resolve_model
from kvbench.request import Request
from kvbench.results.sweep import Fit, fit_ttft_vs_miss_rate
from kvbench.run.config import CacheFlags
from kvbench.run.setup import cache_config
from kvbench.run.source import RunSource, limit_requests, load_source
from kvbench.workloads.tokenizer import load_tokenizer


@dataclass(frozen=True)
class ExplainConfig:
    """What to explain and through which cache.

    Attributes:
        source: a scenario (``.toml``), a trace (``.jsonl``) or a run's results (``.parquet``).
        cache: the cache flags (``--cache-size`` is a number of blocks; none = room for everything).
        salt: the namespace of requests without their own salt.
        num_requests: explain only the first N requests.
        min_cacheable_tokens: a provider's minimum prompt length (OpenAI, Anthropic: 1,024).
    """

    source: Path
    cache: CacheFlags = CacheFlags()
    salt: str | None = None
    num_requests: int | None = None
    min_cacheable_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_requests", "min_cacheable_tokens"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"--{name.replace('_', '-')}: {value} must be positive")


@dataclass(frozen=True)
class FixConfig:
    """How :func:`explain_and_fix` sizes and prices the fixes.

    Attributes:
        model_shape: a named model shape the capacity fix gives bytes for too (a preset of
            :data:`kvbench.memory.presets.PRESETS` or a ``config.json``), besides the run's model.
        ttft_fit: a sweep summary or a run's results to fit TTFT on (a run's results file explains
            with its own fit by default).
        rules: a provider's rules and prices for the bill columns (``None``: no bill).
        num_replicas: > 1 adds the routing fix (:mod:`kvbench.route`).
    """

    model_shape: str = "llama-3.1-8b"
    ttft_fit: Path | None = None
    rules: CacheRules | None = None
    num_replicas: int = 1

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError(f"--replicas: {self.num_replicas} must be positive")


@dataclass(frozen=True)
class Explained:
    """A file's explanation, the requests it explains (arrival order) and the model it ran on."""

    explanation: Explanation
    requests: list[Request]
    tokenizer: object
    model: str | None
    run_path: Path | None = None


def explain_file(config: ExplainConfig) -> Explanation:
    """Explain ``config.source`` (see the module docstring).

    Raises:
        InputError: a bad file or flag (one line naming it).
    """
    return _explained(config).explanation


@dataclass(frozen=True)
class FixedExplanation:
    """:func:`explain_and_fix`'s answer: the explanation, its ranked fixes, and ``ttft_note``: where
    the TTFT estimates come from (the fit's line and file), ``None`` without a fit."""

    explanation: Explanation
    fixes: list[Fix]
    ttft_note: str | None = None


def explain_and_fix(config: ExplainConfig, fix: FixConfig = FixConfig()) -> FixedExplanation:
    """:func:`explain_file` and its ranked fixes (:func:`kvbench.explain.fix_kinds.fix_list`).

    Raises:
        InputError: a bad file or flag, an unknown model shape, an unreadable ``ttft_fit`` file.
    """
    explained = _explained(config)
    shapes = [resolve_model(fix.model_shape)]
    run_model = _model_shape(explained.model)
    if run_model is not None and run_model.name != shapes[0].name:
        shapes.insert(0, run_model)
    fit_path = fix.ttft_fit or explained.run_path
    fit = None if fit_path is None else ttft_fit(fit_path)
    options = FixOptions(tuple(shapes), fit, fix.rules, fix.num_replicas)
    fixes = fix_list(
        explained.explanation, explained.requests, explained.tokenizer, config.min_cacheable_tokens, options
    )
    note = None if fit is None else f"TTFT estimates: {fit.describe()}, fitted on {fit_path}"
    return FixedExplanation(explained.explanation, fixes, note)


def _explained(config: ExplainConfig) -> Explained:
    tokenizer = load_tokenizer()
    if Path(config.source).suffix == ".parquet":
        return _explain_results(config, tokenizer)
    source = load_source(config.source, tokenizer, limit=config.num_requests)
    requests = _salted(limit_requests(source.requests, config.num_requests), config.salt)
    cache = _cache(source, config.cache, requests, source.block_size)
    explanation = explain_requests(
        requests, cache, tokenizer, min_cacheable_tokens=config.min_cacheable_tokens, name=source.name
    )
    return Explained(explanation, requests, tokenizer, DEFAULT_PRESET)


def _model_shape(model: str | None) -> ModelShape | None:
    """The run's model as a shape (``None`` when it is no preset and no readable config)."""
    try:
        return None if not model else resolve_model(model)
    except InputError:
        return None


def ttft_fit(path: Path) -> Fit | None:
    """The TTFT fit of a sweep summary, or of a run's rows (TTFT against each request's miss rate);
    ``None`` when the file holds fewer than 2 distinct hit rates.

    Raises:
        InputError: not a sweep summary or run results file.
    """
    from kvbench.results.files import load_result

    result = load_result(path)
    if result.kind == "sweep":
        return result.sweep.fit if result.sweep is not None else None
    if result.kind != "run":
        raise InputError(f"--ttft-fit {path}: a {result.kind} file; give a sweep summary or a run's results")
    rows = [
        r
        for r in result.rows
        if r.status == "ok" and r.ttft_ms is not None and r.prompt_tokens and r.measured
    ]
    try:
        return fit_ttft_vs_miss_rate(
            [(r.cached_prompt_tokens or 0) / r.prompt_tokens for r in rows],
            [r.ttft_ms for r in rows],
        )
    except ValueError:
        return None


def lint_file(config: ExplainConfig) -> LintReport:
    """``--lint``: the layout rules of :mod:`kvbench.explain.lint` on a scenario or trace."""
    if Path(config.source).suffix == ".parquet":
        raise InputError(f"{config.source}: --lint checks a scenario or trace, not a results file")
    tokenizer = load_tokenizer()
    source = load_source(config.source, tokenizer, limit=config.num_requests)
    return lint(limit_requests(source.requests, config.num_requests), tokenizer)


def _salted(requests: list[Request], salt: str | None) -> list[Request]:
    return requests if not salt else [replace(r, salt=r.salt or salt) for r in requests]


def _cache(
    source: RunSource,
    flags: CacheFlags,
    requests: list[Request],
    block_size: int,
    capacity: int | None = None,
) -> CacheConfig:
    size = flags.cache_size if flags.cache_size is not None else capacity
    if size is not None and not str(size).replace("_", "").isdigit():
        raise InputError(f"--cache-size {size}: explain takes a number of blocks")
    config = cache_config(
        source.cache, flags, int(str(size).replace("_", "")) if size else 1, flags.block_size or block_size
    )
    return config if size else unbounded_config(requests, config)


def _refuse_other_files(path: Path) -> None:
    """One line saying what explain needs, for a results file that is not a run's.

    Raises:
        InputError: a sweep or load sweep summary (its run files, named), a break file (its traffic was
            generated in memory), a sim curve (the scenario or trace it replayed).
    """
    import pyarrow.parquet as pq

    from kvbench.results.parquet import read_metadata

    metadata = read_metadata(path) if path.is_file() else {}
    kind = metadata.get("command")
    if kind in ("sweep", "load-sweep"):
        runs = [
            Path(row["results_path"]).name
            for row in pq.read_table(path, columns=["results_path"]).to_pylist()
            if row["results_path"]
        ]
        raise InputError(
            f"{path}: a {'load ' if kind == 'load-sweep' else ''}sweep summary; explain one of its run "
            f"files (beside it: {', '.join(runs) or 'none written'})"
        )
    if kind == "break":
        raise InputError(
            f"{path}: results of kvbench break {metadata.get('experiment', '')}: its traffic was generated "
            "in memory, not read from a file; write the same traffic with kvbench trace gen (e.g. "
            "shared-prefix --volatile-header) and run kvbench explain TRACE.jsonl"
        )
    if kind == "sim":
        source = metadata.get("source") or {}
        where = source.get("scenario") or source.get("trace") or "SCENARIO_OR_TRACE"
        raise InputError(
            f"{path}: a kvbench sim curve; explain the source it replayed: kvbench explain {where} "
            "--cache-size N"
        )


def _explain_results(config: ExplainConfig, tokenizer) -> Explained:
    from kvbench.results.files import load_result

    _refuse_other_files(Path(config.source))
    result = load_result(config.source)
    run = result.run
    if not run.get("source"):
        raise InputError(
            f"{config.source}: the run's metadata names no source file (explain needs the scenario or "
            "trace the run replayed: kvbench explain SCENARIO_OR_TRACE --cache-size N)"
        )
    source = load_source(run["source"], tokenizer)
    rows = [row for row in result.rows if row.status == "ok"][: config.num_requests]
    by_index = {r.index: r for r in source.requests}
    missing = [row.request_index for row in rows if row.request_index not in by_index]
    if missing:
        raise InputError(f"{config.source}: row for request {missing[0]} is not in {run['source']}")
    requests = _salted(
        [
            replace(
                by_index[row.request_index],
                max_tokens=row.max_tokens,
                output_tokens=row.output_tokens or None,
            )
            for row in rows
        ],
        config.salt,
    )
    if run.get("nonce"):  # --hygiene nonce: the prompts as sent began with the run's nonce line
        from kvbench.backends.openai.hygiene import with_nonce

        requests = with_nonce(requests, run["nonce"], tokenizer)
    rules, cache = checked(lambda: _run_cache(result, config.cache, source, requests))
    rules, routed = _fleet(result.metadata.get("fleet_expectation"), rules, rows)
    explanation = explain_requests(
        requests,
        cache,
        tokenizer,
        reported=[row.cached_prompt_tokens for row in rows],
        min_cacheable_tokens=config.min_cacheable_tokens,
        name=result.name,
        rules=rules,
        routed=routed,
    )
    return Explained(explanation, requests, tokenizer, run.get("model"), Path(config.source))


def _fleet(fleet: dict | None, rules: RunRules, rows) -> tuple[RunRules, list[int | None] | None]:
    """A run behind a router with ``--fleet-policy`` (its ``fleet_expectation`` metadata): each row's
    expected cached tokens are the router's model's on the replica it picked, the routing bar's
    floor; the rules say so once. Otherwise ``(rules, None)``."""
    if not fleet:
        return rules, None
    note = (
        f"routed by {fleet['model']} over {fleet['num_replicas']} replicas (the run's --fleet-policy): "
        "lost to routing = one cache's hit minus the hit on the replica the router's model picked"
    )
    return replace(rules, notes=(*rules.notes, note)), [row.expected_cached_tokens for row in rows]


def _run_cache(result, flags: CacheFlags, source: RunSource, requests: list[Request]):
    """``(rules, cache)``: what the run's cache was (:mod:`kvbench.explain.ran`): an in-process run's
    engine and ``run.cache``, or a server's detected pool and caching state (``server_cache``);
    explain's own cache flags win over both."""
    cache_info, run = result.cache, result.run
    server_cache = result.metadata.get("server_cache")
    block_size = server_block_size(server_cache or {}) or cache_info.get("block_size") or 16
    flags = replace(
        flags,
        block_size=flags.block_size or block_size,
        cache_kind=flags.cache_kind or cache_info.get("kind"),
        prompt_only=flags.prompt_only or cache_info.get("prompt_only"),
    )
    if run.get("backend", "inprocess") != "inprocess" and server_cache is not None:
        given = None if flags.cache_size is None else _blocks(flags.cache_size)
        rules, capacity = server_rules(server_cache, given)
        return rules, _cache(source, replace(flags, cache_size=None), requests, block_size, capacity)
    enabled = cache_info.get("enabled")
    capacity = cache_info.get("capacity_blocks") if enabled else None
    engine = run.get("engine") or {}
    if not enabled and engine.get("num_pool_blocks"):
        capacity = engine["num_pool_blocks"]  # the paged engine's pool, with its prefix caching off
    cache = _cache(source, flags, requests, block_size, capacity)
    if run.get("backend", "inprocess") != "inprocess":
        return RunRules(
            "server", is_run=True, capacity_origin="flag" if flags.cache_size else "assumed"
        ), cache
    return engine_rules(run, cache if enabled or enabled is None else None), cache


def _blocks(size) -> int:
    if not str(size).replace("_", "").isdigit():
        raise InputError(f"--cache-size {size}: explain takes a number of blocks")
    return int(str(size).replace("_", ""))
