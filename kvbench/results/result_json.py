"""The summary as JSON (``--save-result``), with the keys ``vllm bench serve --save-result`` writes.

Top level, as vLLM (vllm/benchmarks/serve.py): ``date``, ``endpoint_type``, ``backend``, ``label``,
``model_id``, ``tokenizer_id``, ``num_prompts``, ``request_rate`` (``"inf"`` for a closed loop),
``burstiness``, ``max_concurrency``, then every summary key (:class:`~kvbench.results.summary.RunSummary`:
vLLM's ``duration``, ``completed``, ..., ``p99_e2el_ms``, ``request_goodput`` and kvbench's own
beside them), the server's hit rates (``reported_hit_rate``, ``metrics_hit_rate``, HTTP runs),
``error_rate`` (failed / all requests, warm-up included), and kvbench's context: ``run`` (the run
config, as in the Parquet footer), ``versions``, ``machine``.

``--save-detailed`` adds vLLM's per-request arrays over the measured requests in serve order,
in vLLM's units (seconds): ``input_lens``, ``output_lens``, ``ttfts``, ``itls`` (one list per
request), ``start_times`` (sent, s from the start of the run), ``errors`` (``""`` when it
succeeded); and kvbench's ``request_ids``, ``cached_tokens``, ``expected_cached_tokens``. A value
that was not measured (the TTFT of a failed request) is ``null``, not vLLM's 0.

The Parquet file stays the primary record; this file is a view of it.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from kvbench.errors import InputError
from kvbench.results.parquet import check_output_path, machine, versions
from kvbench.results.rows import ResultRow
from kvbench.results.secrets import environment_secrets, scrub
from kvbench.results.summary import RunSummary

DETAILED_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "errors")  # vLLM's
SERVER_RATES = ("reported_hit_rate", "metrics_hit_rate")


def _seconds(value_ms: float | None) -> float | None:
    return None if value_ms is None else value_ms / 1e3


def _run_date(started_at: str | None) -> str:
    """vLLM's ``date`` format (``20261201-102725``) of when the run started (now, if unknown)."""
    try:
        return datetime.strptime(started_at or "", "%Y-%m-%dT%H:%M:%S%z").strftime("%Y%m%d-%H%M%S")
    except ValueError:
        return time.strftime("%Y%m%d-%H%M%S")


def _header(metadata: Mapping[str, Any], summary: RunSummary) -> dict[str, Any]:
    run = metadata.get("run") or {}
    load = run.get("load") or {}
    rate = load.get("request_rate_per_s")
    return {
        "date": _run_date(run.get("started_at")),
        "endpoint_type": "openai" if run.get("backend") == "openai" else "kvbench-inprocess",
        "backend": run.get("backend"),
        "label": run.get("scenario"),
        "model_id": run.get("model"),
        "tokenizer_id": run.get("tokenizer") or "cl100k_base",
        "num_prompts": summary.num_requests,
        "request_rate": "inf" if rate is None or rate == math.inf else rate,
        "burstiness": load.get("burstiness", 1.0),
        "max_concurrency": load.get("concurrency", run.get("concurrency")),
    }


def detailed_arrays(rows: Sequence[ResultRow]) -> dict[str, list]:
    """vLLM's ``--save-detailed`` arrays (seconds) plus kvbench's, over the measured rows."""
    measured = [r for r in rows if r.measured]
    return {
        "input_lens": [r.prompt_tokens for r in measured],
        "output_lens": [r.output_tokens for r in measured],
        "ttfts": [_seconds(r.ttft_ms) for r in measured],
        "itls": [[gap / 1e3 for gap in (r.itl_ms or ())] for r in measured],
        "start_times": [_seconds(r.sent_ms) for r in measured],
        "errors": ["" if r.status == "ok" else (r.error or "error") for r in measured],
        "request_ids": [r.request_id for r in measured],
        "cached_tokens": [r.cached_prompt_tokens for r in measured],
        "expected_cached_tokens": [r.expected_cached_tokens for r in measured],
    }


def result_dict(
    summary: RunSummary,
    metadata: Mapping[str, Any],
    rows: Sequence[ResultRow],
    detailed: bool = False,
) -> dict[str, Any]:
    """The result JSON of one run (see the module docstring). ``metadata`` is the Parquet footer's
    (``run``, ``reconciliation``, ``versions``, ``machine``); missing parts are filled from here."""
    reconciliation = metadata.get("reconciliation") or {}
    result = {**_header(metadata, summary), **summary.as_dict()}
    result.update({key: reconciliation.get(key) for key in SERVER_RATES})
    failed = sum(1 for r in rows if r.status != "ok")
    result["error_rate"] = failed / len(rows) if rows else None
    result.update(
        run=metadata.get("run") or {},
        versions=metadata.get("versions") or versions(),
        machine=metadata.get("machine") or machine(),
    )
    if detailed:
        result.update(detailed_arrays(rows))
    return result


def json_ready(value: Any) -> Any:
    """JSON has no NaN or infinity: those become ``null``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


def write_result(path: str | Path, result: Mapping[str, Any]) -> Path:
    """Write ``result`` as JSON to ``path`` atomically (a ``.partial`` file renamed). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    # no API key in a results file
    result = scrub(json_ready(dict(result)), environment_secrets())
    partial.write_text(json.dumps(result, indent=2, default=str, allow_nan=False) + "\n")
    os.replace(partial, path)
    return path


def result_path(
    save_result: Path | None,
    result_dir: Path | None,
    result_filename: str | None,
    parquet_path: Path | None = None,
) -> Path | None:
    """Where the JSON goes: ``--save-result PATH``, or vLLM's ``--result-dir`` / ``--result-filename``
    (either one turns saving on; the file name defaults to the Parquet file's stem + ``.json``, the
    folder to the current one). ``None`` when none is given; before the run (``parquet_path``
    ``None``), a placeholder name stands in so the folder can be checked.

    Raises:
        InputError: ``--save-result`` given with ``--result-dir`` or ``--result-filename``, or a
            file name that holds a folder.
    """
    if save_result is not None:
        if result_dir is not None or result_filename is not None:
            raise InputError("--save-result PATH: give it alone, or --result-dir / --result-filename instead")
        return Path(save_result)
    if result_dir is None and result_filename is None:
        return None
    if result_filename is not None and Path(result_filename).name != result_filename:
        raise InputError(
            f"--result-filename {result_filename}: a file name, without a folder (see --result-dir)"
        )
    name = result_filename or (f"{parquet_path.stem}.json" if parquet_path is not None else "result.json")
    return Path(result_dir or ".") / name


def check_result_path(path: Path | None) -> None:
    """Fail before anything is measured when the JSON could not be written. Raises ``InputError``."""
    if path is not None:
        check_output_path(path, "--save-result")
