"""What one ``kvbench peer vllm`` run is given and gives: its settings (:class:`PeerConfig`), what it
has measured so far (:class:`Measured`) and what it wrote (:class:`PeerReport`).

:mod:`kvbench.peer.vllm_peer` runs it; the settings are checked here, when the config is built.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.peer.comparisons import KV_EVENTS_REQUESTS, known_comparisons
from kvbench.peer.engines import EngineRow, EngineServer
from kvbench.peer.report import ComparisonSummary
from kvbench.peer.server import DTYPES
from kvbench.peer.vllm_events import KvEventsSummary


@dataclass(frozen=True)
class PeerConfig:
    """Settings of one peer run (CLI flags of ``kvbench peer vllm``).

    Attributes:
        out_dir: where the checkpoint, traces, logs, Parquet and Markdown go.
        venv: the vLLM virtual environment (created when missing unless ``install`` is false).
        model_path: a local checkpoint to serve instead of kvbench's default model.
        comparisons: which of ``shared_2k``, ``chat``, ``zipf``, ``kv_events`` to run (the last is
            not run unless chosen: a vLLM start of its own).
        block_size: vLLM ``--block-size`` and the prediction's block size (multiple of 32 on CPU).
        kv_cache_space_gib: ``VLLM_CPU_KVCACHE_SPACE`` of the default-pool server.
        small_pool_blocks: ``--num-gpu-blocks-override`` of the small-pool servers, zipf's and
            kv_events' (null block included).
        kv_events_requests: requests of the kv_events comparison (one block map checkpoint each).
        rounds: rounds of the engine comparison (0: none; ``kvbench.peer.engines``).
        kvbench_threads: ``kvbench serve --threads``; ``None`` = as many as vLLM's OpenMP threads.
        dtype: ``--dtype`` of every server (``float32`` or ``bfloat16``).
    """

    out_dir: Path
    venv: Path
    install: bool = True
    model_path: Path | None = None
    comparisons: tuple[str, ...] = ("shared_2k", "chat", "zipf")
    block_size: int = 32  # the CPU backend's smallest block size
    kv_cache_space_gib: int = 2
    small_pool_blocks: int = 40  # 39 usable blocks: the Zipf trace's 8 prefixes need 64
    kv_events_requests: int = KV_EVENTS_REQUESTS
    max_model_len: int = 4096
    rounds: int = 2  # the engine table's default: two rounds, interleaved
    kvbench_threads: int | None = None
    dtype: str = "float32"
    startup_timeout_s: float = 900.0
    seed: int = 0
    run_id: str = field(default_factory=lambda: time.strftime("%Y%m%dT%H%M%S"))

    def __post_init__(self) -> None:
        object.__setattr__(self, "out_dir", Path(self.out_dir).expanduser())
        object.__setattr__(self, "venv", Path(self.venv).expanduser().absolute())
        known = {c.name for c in known_comparisons()}
        unknown = sorted(set(self.comparisons) - known)
        if unknown or not self.comparisons:
            raise ValueError(
                f"comparisons must be a non-empty subset of {sorted(known)}, got {list(self.comparisons)}"
            )
        if self.block_size <= 0 or self.block_size % 32:
            raise ValueError(f"block_size must be a positive multiple of 32, got {self.block_size}")
        if self.kv_events_requests < 1:
            raise ValueError(f"--kv-events-requests must be >= 1, got {self.kv_events_requests}")
        if self.small_pool_blocks < 2:
            raise ValueError(f"small_pool_blocks must be >= 2, got {self.small_pool_blocks}")
        if self.kvbench_threads is not None and self.kvbench_threads < 1:
            raise ValueError(f"--threads must be >= 1 (or 0 for vLLM's count), got {self.kvbench_threads}")
        if self.rounds < 0:
            raise ValueError(f"--rounds must be >= 0, got {self.rounds}")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")


@dataclass(frozen=True)
class PeerReport:
    """What a run produced: summaries, the KV events checks, the engine table and the files written."""

    summaries: tuple[ComparisonSummary, ...]
    engines: tuple[EngineServer, ...]
    engine_rows: tuple[EngineRow, ...]
    parquet_path: Path
    markdown_path: Path
    markdown: str
    kv_events: tuple[KvEventsSummary, ...] = ()

    @property
    def num_disagreements(self) -> int:
        """Lines in the report's Disagreements section: requests whose reported ``cached_tokens``
        differs from the prediction, and KV events checks whose block maps differed."""
        return sum(len(summary.disagreements) for summary in self.summaries)


@dataclass
class Measured:
    """What a run has measured so far (written as it stands on any exit)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    summaries: list[ComparisonSummary] = field(default_factory=list)
    engines: list[EngineServer] = field(default_factory=list)
    rounds: list[Any] = field(default_factory=list)  # engines.RoundRecords
    kv_events: list[KvEventsSummary] = field(default_factory=list)
    special_tokens: str | None = None  # the server's rule for special-token text (special_tokens.py)
