"""The peer harness's HTTP driver: send trace requests one at a time and record what the server says.

Deliberately small (concurrency 1, no arrival times, no retries): it exists to compare a real vLLM
with kvbench's predictions request by request. Per request it uses the official ``openai`` client
with ``stream=True`` and ``stream_options={"include_usage": True}`` and records:

* ``cached_tokens``: ``usage.prompt_tokens_details.cached_tokens`` of the final chunk (vLLM sends it
  with ``--enable-prompt-tokens-details``; a missing value counts as 0);
* ``prompt_tokens`` / ``completion_tokens`` from the same usage, and with vLLM's ``return_token_ids``
  the prompt token ids it actually prefilled, so a tokenization difference is caught per request;
* TTFT: from sending to the first chunk carrying output (text or token ids), milliseconds; E2E: to
  the last chunk.

vLLM-specific fields go through ``extra_body``: ``cache_salt`` (a cache namespace), ``ignore_eos``
(output lengths are exactly ``max_tokens``, which the simulator needs) and ``return_token_ids``.

Overlap with ``kvbench/backends/openai/client.py`` and ``kvbench/backends/openai/reconcile.py`` (the HTTP backend,
built separately): the streaming call, the usage parsing and the ``/metrics`` scrape below do the
same jobs; once that backend runs at concurrency 1 with ``extra_body``, this module can shrink to a
call into it.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvbench.workloads.formats.kvbench_trace import TraceRequest

METRICS_TIMEOUT_S = 10.0
_METRIC_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class DriverConfig:
    """Where and how to send requests.

    Attributes:
        base_url: the server's OpenAI base URL, e.g. ``http://127.0.0.1:8000/v1``.
        model: the served model name.
        timeout_s: per-request timeout, seconds.
        return_token_ids: ask vLLM for the prompt and output token ids (a vLLM extension).
    """

    base_url: str
    model: str
    timeout_s: float = 600.0  # a cold 2k-token prefill on 2 CPU cores takes seconds, not minutes
    return_token_ids: bool = True

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {self.base_url!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s!r}")


@dataclass
class DrivenRequest:
    """What the server reported for one request (``None`` where it said nothing).

    Attributes:
        request_id: the trace request's id.
        status: ``ok`` or ``error`` (then ``error`` holds one line).
        prompt_tokens / completion_tokens / cached_tokens: from the final usage chunk.
        prompt_token_ids: the ids the server prefilled (vLLM ``return_token_ids``).
        output_token_ids: the generated ids, in order.
        ttft_ms / e2e_ms: from sending the request to the first output chunk / the last chunk.
    """

    request_id: str
    status: str = "ok"
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    prompt_token_ids: list[int] | None = field(default=None, repr=False)
    output_token_ids: list[int] = field(default_factory=list, repr=False)
    ttft_ms: float | None = None
    e2e_ms: float | None = None


def make_client(config: DriverConfig) -> Any:
    """An ``openai.OpenAI`` client for ``config`` (the API key is unused by a local server)."""
    import openai

    return openai.OpenAI(base_url=config.base_url, api_key="kvbench-peer", timeout=config.timeout_s,
                         max_retries=0)


def send(client: Any, config: DriverConfig, request: TraceRequest, salt: str | None) -> DrivenRequest:
    """Send one request, streaming, and collect its usage and timings. Errors become ``status=error``."""
    extra: dict[str, Any] = {"ignore_eos": True}
    if salt:
        extra["cache_salt"] = salt
    if config.return_token_ids:
        extra["return_token_ids"] = True
    common = dict(model=config.model, max_tokens=request.max_tokens, temperature=0.0, stream=True,
                  stream_options={"include_usage": True}, extra_body=extra)
    result = DrivenRequest(request.id)
    start_s = time.perf_counter()
    try:
        if request.messages is not None:
            stream = client.chat.completions.create(messages=request.openai_messages, **common)
        else:
            stream = client.completions.create(prompt=request.prompt, **common)
        for chunk in stream:
            _absorb(chunk, result, start_s)
    except Exception as exc:  # the driver records failures; it never stops a comparison halfway
        result.status, result.error = "error", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    result.e2e_ms = (time.perf_counter() - start_s) * 1e3
    return result


def _absorb(chunk: Any, result: DrivenRequest, start_s: float) -> None:
    """Fold one streamed chunk into ``result``."""
    extra = chunk.model_extra or {}
    if extra.get("prompt_token_ids") is not None:
        result.prompt_token_ids = list(extra["prompt_token_ids"])
    for choice in chunk.choices or ():
        text = choice.delta.content if hasattr(choice, "delta") else getattr(choice, "text", None)
        token_ids = (choice.model_extra or {}).get("token_ids") or []
        result.output_token_ids.extend(token_ids)
        if result.ttft_ms is None and (text or token_ids):
            result.ttft_ms = (time.perf_counter() - start_s) * 1e3
    usage = chunk.usage
    if usage is not None:
        result.prompt_tokens, result.completion_tokens = usage.prompt_tokens, usage.completion_tokens
        details = usage.prompt_tokens_details
        result.cached_tokens = (details.cached_tokens if details is not None else None) or 0


def drive(config: DriverConfig, requests: Sequence[TraceRequest], salt: str | None,
          progress: Callable[[DrivenRequest, int, int], None] | None = None) -> list[DrivenRequest]:
    """Send ``requests`` in order, each after the previous one finished (concurrency 1).

    ``salt`` (the run's cache namespace) is joined with a request's own salt as ``salt/own``.
    """
    client = make_client(config)
    results = []
    for index, request in enumerate(requests):
        own = request.salt
        request_salt = f"{salt}/{own}" if salt and own else (salt or own)
        results.append(send(client, config, request, request_salt))
        if progress is not None:
            progress(results[-1], index + 1, len(requests))
    return results


# ---------------------------------------------------------------- /metrics


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text format -> ``(name, labels, value)`` samples (comments and bad lines skipped)."""
    samples = []
    for line in text.splitlines():
        match = _METRIC_LINE.match(line.strip())
        if line.startswith("#") or match is None:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        samples.append((match["name"], dict(_LABEL.findall(match["labels"] or "")), value))
    return samples


@dataclass(frozen=True)
class PrefixCounters:
    """vLLM's prefix-cache counters at one moment, in tokens (summed over engines and models)."""

    queries_tokens: float
    hits_tokens: float

    def __sub__(self, other: "PrefixCounters") -> "PrefixCounters":
        return PrefixCounters(self.queries_tokens - other.queries_tokens, self.hits_tokens - other.hits_tokens)


def fetch_metrics(server_url: str) -> list[tuple[str, dict[str, str], float]]:
    """GET ``server_url/metrics`` and parse it. Raises ``OSError`` when the server does not answer."""
    with urllib.request.urlopen(f"{server_url.rstrip('/')}/metrics", timeout=METRICS_TIMEOUT_S) as response:
        return parse_metrics(response.read().decode("utf-8", errors="replace"))


def prefix_counters(samples: Sequence[tuple[str, dict[str, str], float]]) -> PrefixCounters:
    """``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total`` from parsed samples."""
    def total(name: str) -> float:
        return sum(value for sample, _, value in samples if sample == name)

    return PrefixCounters(total("vllm:prefix_cache_queries_total"), total("vllm:prefix_cache_hits_total"))


def num_gpu_blocks(samples: Sequence[tuple[str, dict[str, str], float]]) -> int | None:
    """The pool size vLLM reports in ``vllm:cache_config_info`` (label ``num_gpu_blocks``), if any."""
    for name, labels, _ in samples:
        if name == "vllm:cache_config_info" and labels.get("num_gpu_blocks", "None").isdigit():
            return int(labels["num_gpu_blocks"])
    return None


def post_json(url: str, payload: dict | None = None, timeout_s: float = METRICS_TIMEOUT_S) -> int:
    """POST ``payload`` as JSON; returns the HTTP status (``OSError`` when unreachable)."""
    data = json.dumps(payload or {}).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
