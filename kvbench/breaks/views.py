"""``kvbench break views``: caching views instead of copies keeps whole requests alive.

A cached block should own exactly its bytes: ``(layers, 2, kv_heads, block_size, head_dim)``. If it
is instead a slice (a view) of the request's whole KV tensor, the slice keeps that tensor's entire
storage alive: every layer, every prompt token and every generated token. A request that hits a
long shared prefix and adds two blocks of its own then pins its whole KV in memory through those two
blocks, and the cache's byte accounting (blocks x bytes per block) never sees it.

Both variants serve the same shared-prefix trace on a cache sized in bytes
(:func:`kvbench.engine.kv.capacity_blocks_for_bytes`). After every request it records:

* ``nominal_kv_bytes``: what the cache believes it holds (``HFEngine.nominal_kv_bytes``);
* ``held_kv_bytes``: the sum of the distinct tensor storages the cached blocks reference
  (``HFEngine.held_kv_bytes``; a view counts its whole base);
* ``rss_bytes``: the process's resident set size (``psutil``), which includes the model.

The copies variant runs first, so the views variant's RSS growth is not hidden by memory the
allocator kept from an earlier run.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path

import psutil
import pyarrow as pa

from kvbench.breaks.common import (
    ParquetTable,
    Progress,
    VariantRun,
    VerdictTable,
    break_schema,
    format_mib,
    run_variant,
    shared_prefix_requests,
    variant_backend,
)
from kvbench.cache.base import CacheConfig
from kvbench.engine.factory import make_engine
from kvbench.engine.kv import capacity_blocks_for_bytes
from kvbench.engine.model import LoadedModel
from kvbench.engine.sampling import SamplingParams
from kvbench.workloads.generators import check_ints
from kvbench.workloads.tokenizer import Tokenizer, load_tokenizer

EXPERIMENT = "views"
VARIANTS = ("copies", "views")  # correct first: see the module docstring
EXTRA_FIELDS = (
    pa.field("configured_kv_bytes", pa.int64()),
    pa.field("nominal_kv_bytes", pa.int64()),
    pa.field("held_kv_bytes", pa.int64()),
    pa.field("rss_bytes", pa.int64()),
)


@dataclass(frozen=True)
class ViewsConfig:
    """Settings of the views experiment.

    Attributes:
        num_requests: requests per variant.
        system_tokens: the shared system prompt, in tokens.
        question_tokens: each request's own question (>= 16); its blocks are what pins a request.
        max_tokens: output tokens per request (their KV is in the viewed tensor too).
        cache_bytes: the cache's size in bytes (whole blocks of the model's layout).
        block_size: tokens per block.
        seed: the trace's seed.
    """

    num_requests: int = 48  # enough to fill the default cache and start evicting
    system_tokens: int = 1000
    question_tokens: int = 32  # 2 unique blocks per request hold a ~1,050-token KV each
    max_tokens: int = 4
    cache_bytes: int = 16 * 2**20  # 128 blocks of the default model (128 KiB per 16-token block)
    block_size: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        check_ints(self, ("num_requests", "system_tokens", "max_tokens", "cache_bytes", "block_size"))
        check_ints(self, ("question_tokens",), minimum=16)
        check_ints(self, ("seed",), minimum=0)


@dataclass(eq=False)
class ViewsResult:
    """Both variants, copies then views, and the configured size actually used (whole blocks)."""

    config: ViewsConfig
    configured_kv_bytes: int
    runs: list[VariantRun]

    def run(self, variant: str) -> VariantRun:
        return next(run for run in self.runs if run.variant == variant)

    def peak(self, variant: str, column: str) -> int:
        """Largest value of ``column`` after any request of ``variant``."""
        return max(self.run(variant).column(column))

    def rss_growth_bytes(self, variant: str) -> int:
        """Peak RSS during the variant minus RSS before its first request."""
        run = self.run(variant)
        return self.peak(variant, "rss_bytes") - run.rows[0].extra["rss_before_bytes"]

    @property
    def verdict(self) -> str:
        held, configured = self.peak("views", "held_kv_bytes"), self.configured_kv_bytes
        return (
            "views: the cache believes it holds at most "
            f"{format_mib(self.peak('views', 'nominal_kv_bytes'))} "
            f"MiB but keeps {format_mib(held)} MiB alive ({held / configured:.1f}x the configured "
            f"{format_mib(configured)} MiB); copies: at most "
            f"{format_mib(self.peak('copies', 'held_kv_bytes'))} "
            f"MiB held, within the configured size"
        )

    def parquet_tables(self) -> list[ParquetTable]:
        rows = [
            {k: v for k, v in row.items() if k != "rss_before_bytes"}
            for run in self.runs
            for row in run.parquet_rows()
        ]
        return [ParquetTable(rows, break_schema(EXTRA_FIELDS))]

    def metadata(self) -> dict:
        return {
            "config": vars(self.config),
            "verdict": self.verdict,
            "configured_kv_bytes": self.configured_kv_bytes,
            "summaries": {run.variant: run.summary.as_dict() for run in self.runs},
        }


def run_views(
    loaded: LoadedModel,
    config: ViewsConfig = ViewsConfig(),
    tokenizer: Tokenizer | None = None,
    progress: Progress | None = None,
) -> ViewsResult:
    """Serve the shared-prefix trace with copies, then with views, measuring bytes after each request.

    Raises:
        InputError: ``cache_bytes`` holds not even one block of this model.
    """
    requests = shared_prefix_requests(config, tokenizer or load_tokenizer())
    layout = loaded.kv_layout(config.block_size)
    capacity = capacity_blocks_for_bytes(config.cache_bytes, layout)
    configured = capacity * layout.bytes_per_block
    process = psutil.Process()
    # One request of the same shape, cache off: the allocator's growth for prefill activations is
    # then paid before the first variant's "RSS before", not counted as that variant's KV.
    make_engine(loaded).generate(
        requests[0].token_ids, SamplingParams(max_tokens=config.max_tokens, ignore_eos=True)
    )
    runs = []
    for variant in VARIANTS:
        gc.collect()  # the previous variant's engine and its KV are gone before this one starts
        backend = variant_backend(
            loaded, CacheConfig(capacity, config.block_size), store_views=variant == "views"
        )
        engine = backend.engine
        rss_before = process.memory_info().rss

        def hook(request, result, engine=engine, rss_before=rss_before):
            return {
                "configured_kv_bytes": configured,
                "nominal_kv_bytes": engine.nominal_kv_bytes(),
                "held_kv_bytes": engine.held_kv_bytes(),
                "rss_bytes": process.memory_info().rss,
                "rss_before_bytes": rss_before,
            }

        runs.append(run_variant(backend, requests, EXPERIMENT, variant, hook, progress))
        engine.wait_idle()  # its worker thread has let go of it: the next variant starts without this KV
        del backend, engine, hook
    return ViewsResult(config, configured, runs)


def views_table(result: ViewsResult) -> VerdictTable:
    """Configured, believed (nominal) and really held KV bytes, and RSS growth, per variant."""
    rows = []
    for run in result.runs:
        variant, held = run.variant, result.peak(run.variant, "held_kv_bytes")
        rows.append(
            (
                variant,
                format_mib(result.configured_kv_bytes),
                format_mib(result.peak(variant, "nominal_kv_bytes")),
                format_mib(held),
                format_mib(run.rows[-1].extra["held_kv_bytes"]),
                f"{held / result.configured_kv_bytes:.2f}",
                format_mib(result.rss_growth_bytes(variant)),
            )
        )
    config = result.config
    notes = [
        f"{config.num_requests} requests per variant: a {config.system_tokens:,}-token shared system prompt "
        "+ "
        f"a {config.question_tokens}-token question, {config.max_tokens} output tokens; MiB = 2**20 bytes",
        "believed = cached blocks x bytes per block; held = distinct storages the cached blocks keep alive "
        "(a view keeps its whole base tensor); RSS growth = peak RSS - RSS before the variant",
    ]
    return VerdictTable(
        "kvbench break views: cached views keep whole requests alive",
        (
            "variant",
            "configured",
            "believed (peak)",
            "held (peak)",
            "held (final)",
            "held / configured",
            "RSS growth",
        ),
        rows,
        result.verdict,
        notes,
    )


def plot_views(result: ViewsResult, path: Path) -> Path:
    """PNG of held and believed KV bytes after each request, both variants, with the configured size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(9, 5))
    for run, color in zip(result.runs, ("tab:blue", "tab:red")):
        held = [value / 2**20 for value in run.column("held_kv_bytes")]
        nominal = [value / 2**20 for value in run.column("nominal_kv_bytes")]
        axis.plot(range(1, len(held) + 1), held, color=color, label=f"{run.variant}: really held")
        axis.plot(
            range(1, len(nominal) + 1), nominal, color=color, linestyle=":", label=f"{run.variant}: believed"
        )
    axis.axhline(result.configured_kv_bytes / 2**20, color="black", linestyle="--", label="configured size")
    axis.set(
        xlabel="requests served", ylabel="KV bytes (MiB)", title="kvbench break views: KV bytes per request"
    )
    axis.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
