"""Rich tables for ``kvbench memory``: one function per table, each returns a ``rich.table.Table``."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from kvbench.memory.layout import BudgetFit, KvLayout, ModelShape, ParameterCounts, format_bytes
from kvbench.memory.sharing import SharingConfig, SharingResult
from kvbench.memory.waste import WasteResult, WasteStats


def _bytes_cells(num_bytes: float) -> tuple[str, str]:
    return f"{round(num_bytes):,}", format_bytes(num_bytes)


def model_table(shape: ModelShape, layout: KvLayout) -> Table:
    table = Table(title=f"Model {shape.name}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", justify="right")
    rows = [
        ("layers", f"{shape.num_layers}"),
        ("hidden size", f"{shape.hidden_size:,}"),
        ("query heads / KV heads", f"{shape.num_attention_heads} / {shape.num_kv_heads}"),
        ("head dim", f"{shape.head_dim}"),
        ("MLP intermediate size", f"{shape.intermediate_size:,}"),
        ("vocabulary", f"{shape.vocab_size:,}"),
        ("tied embeddings", "yes" if shape.tie_word_embeddings else "no"),
        ("context length (tokens)", f"{shape.max_position_embeddings:,}"),
        ("weight dtype / KV dtype", f"{shape.dtype.value} / {layout.kv_dtype.value}"),
    ]
    for row in rows:
        table.add_row(*row)
    return table


def weights_table(shape: ModelShape) -> Table:
    counts = ParameterCounts.of(shape)
    table = Table(title=f"Weights ({shape.dtype.value}, {shape.dtype.num_bytes} B per parameter)")
    table.add_column("component")
    table.add_column("parameters", justify="right")
    table.add_column("bytes", justify="right")
    table.add_column("size", justify="right")
    lm_head = "tied to embedding" if shape.tie_word_embeddings else "lm_head"
    rows = [
        ("embedding", counts.embedding),
        ("attention q/k/v/o", counts.attention),
        ("MLP gate/up/down", counts.mlp),
        ("RMSNorm weights", counts.norms),
        (lm_head, counts.lm_head),
    ]
    for name, count in rows:
        table.add_row(name, f"{count:,}", *_bytes_cells(count * shape.dtype.num_bytes))
    table.add_row(
        "total", f"{counts.total:,}", *_bytes_cells(counts.total * shape.dtype.num_bytes), style="bold"
    )
    return table


def kv_table(shape: ModelShape, layout: KvLayout, prompt_tokens: int) -> Table:
    table = Table(
        title=f"KV cache ({layout.kv_dtype.value})",
        caption_justify="left",
        caption=f"bytes per token = 2 (K, V) x {layout.num_layers} layers x "
        f"{layout.num_kv_heads} KV heads x {layout.head_dim} head_dim x "
        f"{layout.kv_dtype.num_bytes} B",
    )
    table.add_column("what")
    table.add_column("tokens", justify="right")
    table.add_column("bytes", justify="right")
    table.add_column("size", justify="right")
    rows = [
        ("one token", 1),
        (f"one block ({layout.block_size} tokens)", layout.block_size),
        ("one prompt", prompt_tokens),
        ("full context", shape.max_position_embeddings),
    ]
    for name, num_tokens in rows:
        table.add_row(name, f"{num_tokens:,}", *_bytes_cells(layout.bytes_for_tokens(num_tokens)))
    return table


def budget_table(
    shape: ModelShape, layout: KvLayout, fit: BudgetFit, memory: str, utilization: float, prompt_tokens: int
) -> Table:
    table = Table(
        title=f"What fits in {memory} x {utilization:g}",
        caption_justify="left",
        caption="ignores activations and runtime overhead, so a real server fits less",
    )
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("memory budget", format_bytes(fit.budget_bytes))
    table.add_row(f"weights ({shape.dtype.value})", format_bytes(fit.weight_bytes))
    if not fit.weights_fit:
        table.add_row("KV space", "[red]0: the weights alone do not fit[/red]")
        return table
    table.add_row("KV space", format_bytes(fit.kv_bytes))
    table.add_row("KV tokens", f"{fit.num_tokens:,}")
    table.add_row(f"KV blocks ({layout.block_size} tokens)", f"{fit.num_blocks:,}")
    table.add_row(f"prompts of {prompt_tokens:,} tokens at once", f"{fit.num_tokens // prompt_tokens:,}")
    table.add_row(
        f"full-context sequences ({shape.max_position_embeddings:,} tokens)", f"{fit.num_max_len_sequences:,}"
    )
    return table


def _waste_rows(stats: WasteStats, bytes_per_token: int, pool_bytes: int) -> list[str]:
    def size(tokens: float) -> str:
        return format_bytes(tokens * bytes_per_token)

    def share(tokens: float, whole: float) -> str:
        return f"{100 * tokens / whole:.1f}%" if whole else "-"

    return [
        f"{stats.num_served:,}",
        f"{stats.num_never_fit:,}",
        f"{stats.peak_running:,}",
        f"{stats.num_waited:,}",
        f"{stats.mean_wait_ms / 1000:,.1f} / {stats.max_wait_ms / 1000:,.1f}",
        f"{stats.num_preemptions:,} / {stats.num_recomputed_tokens:,}",
        f"{size(stats.mean_holding_tokens)} / {size(stats.peak_holding_tokens)}",
        f"{size(stats.mean_reserved_tokens)} / {size(stats.peak_reserved_tokens)}",
        share(stats.mean_holding_tokens * bytes_per_token, pool_bytes),
        f"{size(stats.mean_internal_fragmentation_tokens)} "
        f"({share(stats.mean_internal_fragmentation_tokens, stats.mean_reserved_tokens)} of reserved)",
        f"{size(stats.mean_stranded_tokens)} / {size(stats.peak_stranded_tokens)}",
        f"{stats.blocked_by_fragmentation_ms / 1000:,.1f}",
        f"{stats.mean_waste_per_seq_tokens:,.1f} / {stats.max_waste_per_seq_tokens:,}",
        f"{stats.makespan_ms / 1000:,.1f}",
    ]


_WASTE_METRICS = (
    "requests served",
    "never fit in the pool",
    "peak concurrent requests",
    "requests that waited",
    "wait before admission, mean / max (s)",
    "preemptions / recomputed tokens",
    "KV held, mean / peak",
    "reserved (slabs or blocks), mean / peak",
    "pool holding KV, mean",
    "internal fragmentation, mean",
    "external fragmentation, mean / peak",
    "head blocked by fragmentation (s)",
    "waste per sequence, mean / max (tokens)",
    "makespan (s)",
)


def waste_notes(result: WasteResult, shape: ModelShape) -> list[str]:
    """How to read :func:`waste_table`: the replay's settings and definitions, one line each."""
    config = result.config
    hint = " (raise --max-model-len to keep them)" if result.num_too_long else ""
    return [
        f"{result.num_requests:,} requests read, {result.num_too_long:,} refused as longer than "
        f"max-model-len {config.max_model_len:,}{hint}",
        f"{format_bytes(config.bytes_per_token)} per token ({shape.name}); pool "
        f"{config.pool_tokens:,} tokens = {config.num_blocks:,} blocks of {config.block_size} tokens",
        f"{config.decode_tok_s:g} tok/s per running sequence, instant prefill, FIFO queue, "
        f"contiguous reserves {config.reserve.value}",
        "paged preempts the newest sequence when out of blocks and prefills it again (recompute)",
        "external fragmentation = free memory in holes smaller than every waiting request",
    ]


def waste_table(result: WasteResult, trace: Path, pool: str) -> Table:
    config = result.config
    table = Table(title=f"KV memory waste: {trace.name}, pool {pool}")
    table.add_column("metric")
    table.add_column("contiguous", justify="right")
    table.add_column("paged", justify="right")
    contiguous = _waste_rows(result.contiguous, config.bytes_per_token, config.pool_bytes)
    paged = _waste_rows(result.paged, config.bytes_per_token, config.pool_bytes)
    for row in zip(_WASTE_METRICS, contiguous, paged):
        table.add_row(*row)
    return table


def sharing_title(config: SharingConfig, beam_search: bool) -> str:
    """``"parallel sampling, n = 4, ..."`` or ``"beam search, width 4, ..."``."""
    mode = (
        f"beam search, width {config.num_sequences}"
        if beam_search
        else f"parallel sampling, n = {config.num_sequences}"
    )
    return (
        f"{mode}, prompt {config.prompt_tokens:,} tokens, {config.max_tokens:,} new tokens each, "
        f"{config.block_size}-token blocks"
    )


def sharing_table(result: SharingResult, beam_search: bool, shape: ModelShape, layout: KvLayout) -> Table:
    config = result.config
    block_bytes = layout.bytes_per_block
    table = Table(
        title=sharing_title(config, beam_search),
        caption_justify="left",
        caption=f"{format_bytes(block_bytes)} per block ({shape.name}, {layout.kv_dtype.value})",
    )
    table.add_column("what")
    table.add_column("blocks", justify="right")
    table.add_column("size", justify="right")
    full, partial = divmod(config.prompt_tokens, config.block_size)
    rows = [
        (f"prompt blocks ({full:,} full + {int(partial > 0)} partial)", result.num_prompt_blocks),
        (
            f"prompt blocks shared (ref {config.num_sequences}) after the forks",
            result.num_shared_prompt_blocks,
        ),
        (
            "blocks shared after every sequence wrote its first token",
            result.num_shared_blocks_after_first_token,
        ),
        ("copy-on-write copies after the first token", result.num_copies_after_first_token),
        ("copy-on-write copies, whole run", result.num_copies),
        ("forks / sequences freed early", f"{result.num_forks:,} / {result.num_freed_sequences:,}"),
        ("peak blocks, shared + copy-on-write", result.peak_used_blocks),
        ("peak blocks, private copy per sequence", result.peak_unshared_blocks),
        ("blocks in use after every sequence finished", result.num_used_blocks_after_free),
    ]
    for name, value in rows:
        if isinstance(value, str):
            table.add_row(name, value, "")
        else:
            table.add_row(name, f"{value:,}", format_bytes(value * block_bytes))
    table.add_row("memory saved by sharing", f"{100 * result.saved_fraction:.1f}%", "", style="bold")
    return table


def measured_sharing_table(replay: SharingResult, measured) -> Table:
    """The block-manager replay next to the paged engine's measured pool
    (:class:`kvbench.engine.paged.measure.MeasuredSharing`), both in the engine model's bytes."""
    block_bytes = measured.bytes_per_block
    table = Table(
        title=f"measured on the paged engine: {sharing_title(replay.config, False)}",
        caption_justify="left",
        caption=f"{format_bytes(block_bytes)} per block ({measured.model_name}); "
        f"run {measured.elapsed_s:.1f} s",
    )
    table.add_column("what")
    for column in ("replay, blocks", "measured, blocks", "replay", "measured"):
        table.add_column(column, justify="right")
    rows = [
        (
            f"prompt blocks shared (ref {replay.config.num_sequences}) after the forks",
            replay.num_shared_prompt_blocks,
            measured.num_shared_prompt_blocks,
        ),
        ("copy-on-write copies, whole run", replay.num_copies, measured.num_copies),
        (
            "peak blocks held (running; nothing cached before the run)",
            replay.peak_used_blocks,
            measured.peak_running_blocks,
        ),
        (
            "blocks in use after every sample finished",
            replay.num_used_blocks_after_free,
            measured.num_used_blocks_after_free,
        ),
    ]
    for name, predicted, actual in rows:
        table.add_row(
            name,
            f"{predicted:,}",
            f"{actual:,}",
            format_bytes(predicted * block_bytes),
            format_bytes(actual * block_bytes),
        )
    unshared = replay.peak_unshared_blocks
    table.add_row(
        "peak blocks, private copy per sequence",
        f"{unshared:,}",
        "",
        format_bytes(unshared * block_bytes),
        "",
    )
    table.add_row(
        "measured / replay peak",
        "",
        f"{measured.peak_running_blocks / replay.peak_used_blocks:.3f}",
        "",
        "",
        style="bold",
    )
    return table


def measured_waste_table(replay: WasteResult, measured) -> Table:
    """The replay's paged allocator next to the paged engine's measured pool
    (:class:`kvbench.engine.paged.measure.MeasuredWaste`); means are over time (replay) and over
    engine steps (measured)."""
    paged, per_token = replay.paged, measured.bytes_per_token
    table = Table(
        title="measured on the paged engine: blocks held by running sequences",
        caption_justify="left",
        caption=f"{format_bytes(per_token)} per token ({measured.model_name}); pool {measured.num_blocks:,} "
        f"blocks; {measured.num_steps:,} engine steps in {measured.elapsed_s:.1f} s",
    )
    table.add_column("metric")
    table.add_column("replay, paged", justify="right")
    table.add_column("measured, paged engine", justify="right")
    rows = [
        (
            "requests served / refused",
            f"{paged.num_served:,} / {paged.num_never_fit:,}",
            f"{measured.num_served:,} / {measured.num_refused:,}",
        ),
        ("preemptions", f"{paged.num_preemptions:,}", f"{measured.num_preemptions:,}"),
        (
            "blocks held (reserved), mean / peak",
            f"{format_bytes(paged.mean_reserved_tokens * per_token)} / "
            f"{format_bytes(paged.peak_reserved_tokens * per_token)}",
            f"{format_bytes(measured.mean_running_bytes)} / {format_bytes(measured.peak_running_bytes)}",
        ),
        (
            "unfilled slots (internal fragmentation), mean",
            format_bytes(paged.mean_internal_fragmentation_tokens * per_token),
            format_bytes(measured.mean_unfilled_bytes),
        ),
        (
            "unfilled share of the held blocks, mean",
            f"{100 * paged.internal_fragmentation_fraction:.1f}%",
            f"{100 * measured.mean_unfilled_bytes / measured.mean_running_bytes:.1f}%"
            if measured.mean_running_bytes
            else "-",
        ),
    ]
    for row in rows:
        table.add_row(*row)
    return table
