"""``kvbench explain`` on files: a scenario or trace (a cache-only replay with ``kvbench run``'s cache
flags), or a run's Parquet file (the rows' reported ``cached_tokens`` against what the run's cache
config allows, on the requests re-read from the run's source file).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from kvbench.cache.base import CacheConfig
from kvbench.errors import InputError, checked
from kvbench.explain.api import Explanation, explain_requests, unbounded_config
from kvbench.explain.lint import LintReport, lint
from kvbench.request import Request
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


def explain_file(config: ExplainConfig) -> Explanation:
    """Explain ``config.source`` (see the module docstring).

    Raises:
        InputError: a bad file or flag (one line naming it).
    """
    tokenizer = load_tokenizer()
    if Path(config.source).suffix == ".parquet":
        return _explain_results(config, tokenizer)
    source = load_source(config.source, tokenizer, limit=config.num_requests)
    requests = _salted(limit_requests(source.requests, config.num_requests), config.salt)
    cache = _cache(source, config.cache, requests, source.block_size)
    return explain_requests(requests, cache, tokenizer, min_cacheable_tokens=config.min_cacheable_tokens,
                            name=source.name)


def lint_file(config: ExplainConfig) -> LintReport:
    """``--lint``: the layout rules of :mod:`kvbench.explain.lint` on a scenario or trace."""
    if Path(config.source).suffix == ".parquet":
        raise InputError(f"{config.source}: --lint checks a scenario or trace, not a results file")
    tokenizer = load_tokenizer()
    source = load_source(config.source, tokenizer, limit=config.num_requests)
    return lint(limit_requests(source.requests, config.num_requests), tokenizer)


def _salted(requests: list[Request], salt: str | None) -> list[Request]:
    return requests if not salt else [replace(r, salt=r.salt or salt) for r in requests]


def _cache(source: RunSource, flags: CacheFlags, requests: list[Request], block_size: int,
           capacity: int | None = None) -> CacheConfig:
    size = flags.cache_size if flags.cache_size is not None else capacity
    if size is not None and not str(size).replace("_", "").isdigit():
        raise InputError(f"--cache-size {size}: explain takes a number of blocks")
    config = cache_config(source.cache, flags, int(str(size).replace("_", "")) if size else 1,
                          flags.block_size or block_size)
    return config if size else unbounded_config(requests, config)


def _explain_results(config: ExplainConfig, tokenizer) -> Explanation:
    from kvbench.results.files import load_result

    result = load_result(config.source)
    if result.kind != "run":
        raise InputError(f"{config.source}: results of kvbench {result.kind}; explain reads kvbench run results")
    run = result.run
    if not run.get("source"):
        raise InputError(f"{config.source}: the run's metadata names no source file")
    source = load_source(run["source"], tokenizer)
    rows = [row for row in result.rows if row["status"] == "ok"][:config.num_requests]
    by_index = {r.index: r for r in source.requests}
    missing = [row["request_index"] for row in rows if row["request_index"] not in by_index]
    if missing:
        raise InputError(f"{config.source}: row for request {missing[0]} is not in {run['source']}")
    requests = _salted([replace(by_index[row["request_index"]], max_tokens=row["max_tokens"],
                                output_tokens=row["output_tokens"] or None) for row in rows], config.salt)
    cache_info = result.cache
    flags = config.cache
    if cache_info.get("enabled") and cache_info.get("block_size"):
        flags = replace(flags, block_size=flags.block_size or cache_info["block_size"],
                        cache_kind=flags.cache_kind or cache_info.get("kind"),
                        prompt_only=flags.prompt_only or cache_info.get("prompt_only"))
    capacity = cache_info.get("capacity_blocks") if cache_info.get("enabled") else None
    cache = checked(lambda: _cache(source, flags, requests, 16 if not cache_info.get("block_size") else
                                   cache_info["block_size"], capacity))
    return explain_requests(requests, cache, tokenizer, reported=[row["cached_prompt_tokens"] for row in rows],
                            min_cacheable_tokens=config.min_cacheable_tokens, name=result.name)
