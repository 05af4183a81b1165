"""``kvbench memory``: KV bytes of real model shapes, reservation vs paged waste, block sharing.

* ``kvbench memory --model llama-3.1-8b``: the calculator (bytes per token / block / prompt,
  weights, what fits in a memory budget).
* ``kvbench memory waste TRACE --pool 2GiB``: a trace replayed through a contiguous and a paged
  allocator over the same pool; a table and a PNG of memory over time.
* ``kvbench memory sharing --n 4`` / ``--beam-width 4``: copy-on-write sharing on the block manager;
  ``--engine paged`` also runs the paged engine and reports its pool's measured blocks next to it.
"""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Annotated

import typer

from kvbench.commands import memory_tables as tables
from kvbench.commands.choices import positive_bytes
from kvbench.commands.common import make_console
from kvbench.errors import InputError
from kvbench.memory.layout import KvLayout, ModelShape, fit_in_budget, parse_bytes, parse_dtype
from kvbench.memory.presets import DEFAULT_PRESET, PRESETS, resolve_model
from kvbench.memory.replay import replay_waste
from kvbench.memory.sharing import SharingConfig, simulate_beam_search, simulate_parallel_sampling
from kvbench.memory.trace import read_waste_trace
from kvbench.memory.waste import Reservation, WasteConfig
from kvbench.results.parquet import check_output_path

_MODEL_HELP = f"Preset ({', '.join(PRESETS)}) or a path to a config.json or its folder."
_DTYPE_HELP = "Weight dtype: fp32, fp16, bf16 or fp8 (default: the model's)."
_KV_DTYPE_HELP = "KV-cache dtype (default: the weight dtype); fp8 halves bf16's bytes."
_PLOT_HELP = "Where to write the PNG (default: under results/)."

ModelOption = Annotated[str, typer.Option("--model", help=_MODEL_HELP)]
DTypeOption = Annotated[str | None, typer.Option("--dtype", help=_DTYPE_HELP)]
KvDTypeOption = Annotated[str | None, typer.Option("--kv-dtype", help=_KV_DTYPE_HELP)]
BlockSizeOption = Annotated[int, typer.Option("--block-size", min=1, help="Tokens per KV block.")]
PlotOption = Annotated[Path | None, typer.Option("--plot", help=_PLOT_HELP, dir_okay=False)]
NoPlotOption = Annotated[bool, typer.Option("--no-plot", help="Write no PNG.")]
PromptTokensOption = Annotated[int, typer.Option("--prompt-tokens", min=1, help="Prompt length, tokens.")]
MemoryOption = Annotated[str, typer.Option("--memory", help="Device memory, e.g. 80GiB or 24GB.")]
UtilizationOption = Annotated[
    float,
    typer.Option("--gpu-memory-utilization", min=0.01, max=1.0, help="Share of --memory the server may use."),
]
TraceArgument = Annotated[Path, typer.Argument(help="Trace: kvbench JSONL or Mooncake JSONL.")]
PoolOption = Annotated[str, typer.Option("--pool", help="KV memory both allocators share, e.g. 2GiB.")]
ReserveOption = Annotated[
    Reservation,
    typer.Option(
        "--reserve",
        help="Contiguous slab: prompt + max_tokens, the model's context length, or "
        "prompt + actual output (an oracle).",
    ),
]
DecodeRateOption = Annotated[
    float,
    typer.Option(
        "--decode-tok-s", min=0.001, help="Tokens per second per running sequence; prefill is instant."
    ),
]
MaxModelLenOption = Annotated[
    int | None,
    typer.Option("--max-model-len", min=1, help="Context length, tokens (default: the model's)."),
]
MaxTokensOption = Annotated[
    int | None,
    typer.Option(
        "--max-tokens",
        min=1,
        help="max_tokens for traces without one (Mooncake); default max-model-len - prompt, as vLLM.",
    ),
]
LimitOption = Annotated[
    int | None,
    typer.Option("--requests", "--num-requests", "--limit", min=1, help="Replay the first N requests."),
]
SamplesOption = Annotated[int | None, typer.Option("--n", min=1, help="Parallel samples (default 4).")]
BeamWidthOption = Annotated[
    int | None,
    typer.Option("--beam-width", min=1, help="Run beam search of this width instead of parallel sampling."),
]
NewTokensOption = Annotated[
    int, typer.Option("--max-tokens", min=1, help="Tokens each sample or beam generates.")
]
SeedOption = Annotated[
    int, typer.Option("--seed", help="Seeds the beam scores (and --engine paged's prompt and samples).")
]


class MeasureEngine(str, enum.Enum):
    """Where ``kvbench memory sharing`` and ``waste`` get their numbers."""

    REPLAY = "replay"  # the replay alone (no model runs)
    PAGED = "paged"  # the replay, then the paged engine measured on the default model


WasteEngineOption = Annotated[
    MeasureEngine,
    typer.Option(
        "--engine",
        help="replay: the two allocators replayed; paged: also run the trace on the paged engine "
        "(default model, real time) and report its measured waste next to the replay.",
    ),
]
SharingEngineOption = Annotated[
    MeasureEngine,
    typer.Option(
        "--engine",
        help="replay: the block-manager replay; paged: also run n samples on the paged engine "
        "(default model) and report its pool's measured blocks next to the replay.",
    ),
]


def register(app: typer.Typer) -> None:
    """Add the ``memory`` group (calculator as its own callback, plus ``waste`` and ``sharing``)."""
    sub = typer.Typer(
        help="KV-cache memory: bytes per token, block and prompt, weights, and what fits in --memory "
        "(without a command).",
        no_args_is_help=False,
    )
    sub.callback(invoke_without_command=True)(calculator)
    sub.command("waste")(waste)
    sub.command("sharing")(sharing)
    app.add_typer(sub, name="memory")


def _model_and_layout(
    model: str, dtype: str | None, kv_dtype: str | None, block_size: int
) -> tuple[ModelShape, KvLayout]:
    """Resolve ``--model``; ``--dtype`` replaces the weight dtype, ``--kv-dtype`` the KV dtype."""
    shape = resolve_model(model)
    if dtype is not None:
        shape = dataclasses.replace(shape, dtype=parse_dtype(dtype))
    layout = KvLayout.of(shape, parse_dtype(kv_dtype) if kv_dtype else None, block_size)
    return shape, layout


def _default_plot_path(name: str) -> Path:
    stem = "".join(char if char.isalnum() or char in "-_." else "_" for char in name)
    return Path("results") / f"{stem}.png"


def calculator(
    ctx: typer.Context,
    model: ModelOption = DEFAULT_PRESET,
    dtype: DTypeOption = None,
    kv_dtype: KvDTypeOption = None,
    block_size: BlockSizeOption = 16,  # vLLM's default block size
    prompt_tokens: PromptTokensOption = 2000,
    memory: MemoryOption = "80GiB",  # one 80 GB H100 / A100
    utilization: UtilizationOption = 0.9,  # vLLM's --gpu-memory-utilization default
) -> None:
    """KV bytes per token, block and prompt for a model shape, its weights, and what fits in memory.

    Bytes per token = 2 (K and V) x layers x kv_heads x head_dim x dtype bytes.
    """
    if ctx.invoked_subcommand is not None:
        return
    shape, layout = _model_and_layout(model, dtype, kv_dtype, block_size)
    fit = fit_in_budget(shape, layout, int(positive_bytes(memory, "--memory") * utilization))
    console = make_console()
    console.print(tables.model_table(shape, layout))
    console.print(tables.weights_table(shape))
    console.print(tables.kv_table(shape, layout, prompt_tokens))
    console.print(tables.budget_table(shape, layout, fit, memory, utilization, prompt_tokens))


def waste(
    trace: TraceArgument,
    pool: PoolOption,
    model: ModelOption = DEFAULT_PRESET,
    dtype: DTypeOption = None,
    kv_dtype: KvDTypeOption = None,
    block_size: BlockSizeOption = 16,  # vLLM's default block size
    reserve: ReserveOption = Reservation.MAX_TOKENS,
    decode_tok_s: DecodeRateOption = 20.0,  # the default model decodes ~20 tok/s on 2 CPU cores
    max_model_len: MaxModelLenOption = None,
    max_tokens: MaxTokensOption = None,
    limit: LimitOption = None,
    plot: PlotOption = None,
    no_plot: NoPlotOption = False,
    engine: WasteEngineOption = MeasureEngine.REPLAY,
) -> None:
    """Replay a trace through a contiguous (reserve-per-request) and a paged allocator.

    Both see the same arrivals, prompt lengths and real output lengths over one pool.
    Each running sequence emits --decode-tok-s tokens per second; requests wait FIFO.
    Paged preempts the newest sequence (recompute) when it runs out of blocks.
    With --engine paged, the trace also runs on the paged engine and its pool's waste is measured.
    """
    _check_measured_model(engine, model, dtype, kv_dtype)
    shape, layout = _model_and_layout(model, dtype, kv_dtype, block_size)
    if plot is not None and not no_plot:
        check_output_path(plot, "--plot")  # before the replay, not after it
    requests = read_waste_trace(trace, default_max_tokens=max_tokens, limit=limit)
    try:
        config = WasteConfig(
            pool_bytes=parse_bytes(pool),
            bytes_per_token=layout.bytes_per_token,
            block_size=block_size,
            decode_tok_s=decode_tok_s,
            reserve=reserve,
            max_model_len=max_model_len or shape.max_position_embeddings,
        )
    except ValueError as exc:
        raise InputError(f"--pool {pool}: {exc}") from None
    console = make_console()
    with console.status(f"replaying {len(requests):,} requests through both allocators"):
        try:
            result = replay_waste(requests, config)
        except ValueError as exc:
            raise InputError(f"{trace}: {exc} (raise --max-model-len)") from None
    console.print(tables.waste_table(result, trace, pool))
    for note in tables.waste_notes(result, shape):
        console.print(f"[dim]{note}[/dim]")
    if not no_plot:
        from kvbench.memory.plots import plot_waste

        path = plot or _default_plot_path(f"memory_waste_{trace.stem}_{pool}_{reserve.value}")
        plot_waste(result, path, f"KV memory over time: {trace.name}, pool {pool}, {shape.name}")
        console.print(f"plot: {path}")
    if engine is MeasureEngine.PAGED:
        _measure_waste(console, result, requests, config)


def _check_measured_model(engine: MeasureEngine, model: str, dtype: str | None, kv_dtype: str | None) -> None:
    """``--engine paged`` runs the default model, so the replay must use its shape to compare."""
    if engine is MeasureEngine.PAGED and (model != DEFAULT_PRESET or dtype or kv_dtype):
        raise InputError(
            f"--engine paged runs the default model: drop --model/--dtype/--kv-dtype "
            f"(the replay then uses its shape, {DEFAULT_PRESET})"
        )


def _measure_waste(console, replay, requests, config: WasteConfig) -> None:
    """``--engine paged``: the trace on the paged engine (default model), its pool measured."""
    from kvbench.engine.model import load_model
    from kvbench.engine.paged.measure import measure_waste

    with console.status(f"running {len(requests):,} requests on the paged engine at their arrival times"):
        measured = measure_waste(load_model(), requests, config.pool_bytes, config.block_size)
    console.print(tables.measured_waste_table(replay, measured))


def sharing(
    n: SamplesOption = None,
    beam_width: BeamWidthOption = None,
    prompt_tokens: PromptTokensOption = 2008,  # 125 full 16-token blocks + 8 tokens
    max_tokens: NewTokensOption = 256,
    model: ModelOption = DEFAULT_PRESET,
    dtype: DTypeOption = None,
    kv_dtype: KvDTypeOption = None,
    block_size: BlockSizeOption = 16,  # vLLM's default block size
    seed: SeedOption = 0,
    plot: PlotOption = None,
    no_plot: NoPlotOption = False,
    engine: SharingEngineOption = MeasureEngine.REPLAY,
) -> None:
    """Copy-on-write sharing on the paged block manager: parallel sampling (--n) or beam search.

    Samples or beams share the prompt's blocks (ref count = n).
    Before writing into a shared partial block, a sequence copies it (copy-on-write).
    Compares peak blocks with sharing against a private copy per sequence.
    With --engine paged, n samples also run on the paged engine and its pool's blocks are measured.
    """
    if n is not None and beam_width is not None:
        raise InputError("give either --n (parallel sampling) or --beam-width (beam search), not both")
    if engine is MeasureEngine.PAGED and beam_width is not None:
        raise InputError("--beam-width: the paged engine does not run beam search (use --engine replay)")
    _check_measured_model(engine, model, dtype, kv_dtype)
    shape, layout = _model_and_layout(model, dtype, kv_dtype, block_size)
    if plot is not None and not no_plot:
        check_output_path(plot, "--plot")
    beam_search = beam_width is not None
    num_sequences = beam_width if beam_search else (n or 4)
    config = SharingConfig(prompt_tokens, max_tokens, num_sequences, block_size, seed)
    # refuses before the replay prints
    loaded = _paged_model(config) if engine is MeasureEngine.PAGED else None
    result = (simulate_beam_search if beam_search else simulate_parallel_sampling)(config)
    console = make_console()
    console.print(tables.sharing_table(result, beam_search, shape, layout))
    if not no_plot:
        from kvbench.memory.plots import plot_sharing

        mode = f"beam{num_sequences}" if beam_search else f"n{num_sequences}"
        path = plot or _default_plot_path(f"memory_sharing_{mode}")
        title = f"KV memory in use: {tables.sharing_title(config, beam_search)}"
        plot_sharing(result, path, title, layout.bytes_per_block)
        console.print(f"plot: {path}")
    if loaded is not None:
        _measure_sharing(console, result, loaded)


def _paged_model(config: SharingConfig):
    """``--engine paged``: the default model, once the samples are known to fit its context."""
    from kvbench.engine.model import load_model
    from kvbench.engine.paged.measure import check_fits

    loaded = load_model()
    check_fits(loaded, config)
    return loaded


def _measure_sharing(console, replay, loaded) -> None:
    """``--engine paged``: the same samples on the paged engine (default model), measured."""
    from kvbench.engine.paged.measure import measure_parallel_sampling

    config = replay.config
    with console.status(
        f"running {config.num_sequences} samples of {config.prompt_tokens:,} tokens on the paged engine"
    ):
        measured = measure_parallel_sampling(loaded, config)
    console.print(tables.measured_sharing_table(replay, measured))
