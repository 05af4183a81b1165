"""``kvbench run``: replay a scenario or trace through the in-process engine or an OpenAI-compatible server.

``--backend inprocess`` (default): the transformers engine in this process, cache on or off;
``--model PATH`` is a local checkpoint. ``--backend openai``: any OpenAI-compatible endpoint at
``--base-url``; ``--model NAME`` is the served model's name (default: the first one ``/v1/models``
lists), the API key comes from the environment variable ``--api-key-env`` names, and the local
tokenizer (cl100k, or ``--tokenizer PATH``) computes expectations and counts output tokens when the
server sends no usage. Options that apply to one backend only are refused with the other.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import typer

from kvbench.commands import options as opt
from kvbench.commands import result_options as res
from kvbench.commands import run_options
from kvbench.commands.common import build, make_console, run_with_progress
from kvbench.commands.signature import with_options
from kvbench.results.summary import SummaryOptions
from kvbench.run.config import CacheFlags, EngineFlags, ModelFlags, RunConfig, RunFlags, ServerFlags
from kvbench.run.load_section import load_backend
from kvbench.words import counted


@with_options(*run_options.ALL)
def run(source: opt.Source, **flags: Any) -> None:
    """Replay a scenario or trace through the in-process engine or an OpenAI-compatible server and
    measure TTFT, TPOT, hit rate; with a server, reconcile its cached tokens with what the trace allows."""
    from kvbench.run.api import run as run_file

    f = SimpleNamespace(**flags)
    results = res.result_flags(
        f.metric_percentiles,
        f.percentile_metrics,
        f.goodput,
        f.save_result,
        f.result_dir,
        f.result_filename,
        f.save_detailed,
        f.asserts,
        f.max_error_rate,
    )
    config = _run_config(source, f, results.summary)
    outcome = run_with_progress(
        lambda on_progress, on_status: run_file(config, on_progress, on_status), on_interrupt=print_kept
    )
    show_outcome(outcome)
    res.finish_run(outcome, results)


def _run_config(source: Path, f: SimpleNamespace, summary: SummaryOptions) -> RunConfig:
    """The frozen :class:`RunConfig` of the flags ``f`` (``summary``: the result flags' percentiles and
    goodput); its ``ValueError`` becomes one ``InputError`` line naming the flag."""
    return build(
        lambda: RunConfig(
            source,
            f.backend or load_backend(source),
            model=ModelFlags(path=f.model, device=f.device, dtype=f.dtype, threads=f.threads),
            cache=CacheFlags(
                cache=f.cache and f.cache.value,
                cache_kind=f.cache_kind,
                block_size=f.block_size,
                cache_size=f.cache_size,
                ttl=f.ttl,
                release=f.release,
                hash_algo=f.hash_algo,
                hash_bits=f.hash_bits,
                verify=f.verify,
                prompt_only=f.prompt_only or None,
            ),
            run=RunFlags(
                num_requests=f.requests,
                concurrency=f.concurrency,
                warmup=f.warmup,
                max_tokens=f.max_tokens,
                ignore_eos=f.ignore_eos,
                temperature=f.temperature,
                top_p=f.top_p,
                seed=f.seed,
            ),
            server=_server_flags(f),
            salt=f.salt,
            out=f.out,
            summary=summary,
            engine=EngineFlags(
                engine=f.engine,
                max_num_seqs=f.max_num_seqs,
                max_num_batched_tokens=f.max_num_batched_tokens,
                batch_invariant=f.batch_invariant,
                host_tier=f.host_tier,
            ),
        )
    )


def show_outcome(outcome) -> None:
    """The run's notes, summary and latency tables, the HTTP checks, and where the rows went."""
    from kvbench.commands.run_tables import http_tables, latency_table, summary_table

    console, err = make_console(), make_console(stderr=True)
    for note in [*outcome.notes, *outcome.metadata.get("warnings", [])]:
        err.print(note, soft_wrap=True)
    console.print(summary_table(outcome.name, outcome.metadata["run"], outcome.summary))
    console.print(latency_table(outcome.summary))
    if outcome.reconciliation is not None:
        for table in http_tables(outcome.rows, outcome.reconciliation) + _replica_tables(outcome):
            console.print(table)
    console.print(f"wrote {counted(len(outcome.rows), 'row')} to {outcome.path}")


def _server_flags(f: SimpleNamespace) -> ServerFlags:
    """The server flags; ``--base-url`` once: that endpoint; several: the first, plus all of them to
    route over."""
    several = tuple(f.base_url) if f.base_url and len(f.base_url) > 1 else ()
    return ServerFlags(
        base_url=f.base_url[0] if f.base_url else None,
        api_key_env=f.api_key_env,
        tokenizer=f.tokenizer,
        request_rate=f.request_rate,
        burstiness=f.burstiness,
        duration=f.duration,
        hygiene=f.hygiene,
        reset_cache=f.reset_cache,
        timeout=f.timeout,
        server_block_size=f.server_block_size,
        expected_cache_size=f.expected_cache_size,
        schedule=f.schedule,
        time_scale=f.time_scale,
        preflight=f.preflight,
        turns=f.turns,
        base_urls=several,
        route=f.route.value if f.route else None,
        client=f.client,
        session_header=f.session_header,
        header=tuple(f.header or ()),
        extra_body=f.extra_body,
        replica_metrics=tuple(f.replica_metrics or ()),
        router_metrics=f.router_metrics,
        fleet_policy=f.fleet_policy,
        fleet_replicas=f.fleet_replicas,
        kv_events=tuple(f.kv_events or ()),
    )


def _replica_tables(outcome) -> list:
    """The per-endpoint table of a client-routed run; the replicas' own /metrics (``--replica-metrics``)."""
    from kvbench.commands.run_tables import replica_metrics_table, replica_table

    run_info = outcome.metadata["run"]
    table = replica_table(outcome.rows, run_info.get("base_urls", []), run_info.get("route", ""))
    fleet = replica_metrics_table(outcome.metadata.get("replica_metrics"))
    return [found for found in (table, fleet) if found is not None]


def print_kept(interrupted) -> None:
    """Ctrl-C or SIGTERM during a run: the summary table of the rows that were measured and written."""
    from kvbench.commands.run_tables import summary_table

    outcome = interrupted.outcome
    make_console().print(summary_table(outcome.name, outcome.metadata["run"], outcome.summary))


def register(app: typer.Typer) -> None:
    app.command("run")(run)
