"""kvbench's paged engine on a GPU beside a vLLM GPU server, the same model, the same client (not a test).

The engine table of ``kvbench peer vllm``, on CUDA: both servers serve the same checkpoint
(``kvbench model export``), in the same dtype (``--dtype``, bfloat16 by default: the paged-KV kernels
compute in it) and block size (32, as in that table), one after the other on the same GPU (each gets
the whole device), and the same client measures both: ``kvbench run --backend openai`` (per-run
``cache_salt``, so each run starts cold), on

* ``scenarios/shared_2k.toml``, 8 requests of 32 tokens at concurrency 1: cold TTFT (the first
  request), warm TTFT p50 (the others: 2,000-token prefix hits), TPOT p50;
* ``scenarios/chat.toml``, 24 requests of 32 tokens at concurrency 8: output tok/s;
* cached prompt tokens of both runs (the servers' ``cached_tokens``).

Prints one Markdown table, each row with the ratio ``kvbench vs vLLM`` (>= 1: kvbench at or above
vLLM: latencies vLLM / kvbench, throughput kvbench / vLLM), and writes it with the runs' Parquet
files under ``--out``. The header names kvbench's attention kernel (what ``run.engine.attention_kernel``
records for an in-process run: :func:`kvbench.engine.paged.kernels.choose_kernel` in this environment).

vLLM: a Python that imports ``vllm`` (``--vllm-python``, default this one). If none does, the script
tries ``pip install vllm`` into ``--vllm-venv`` within ``--install-timeout-s``; if that fails too (the
device machines reach no network), or with ``--skip-vllm``, only kvbench's column is measured.

Run, one command with a deadline (everything, installs included, stops at ``--timeout-s``; the
servers are stopped on every exit path)::

    python benchmarks/gpu_side_by_side.py --timeout-s 420 --out results/gpu-side-by-side

Without a CUDA device it fails at once with one line and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from kvbench.peer.server import PeerError, VllmServer, VllmServerConfig, has_vllm

REPO = Path(__file__).resolve().parents[1]
BLOCK_SIZE = 32  # the CPU engine table's; a multiple of 32 also suits VllmServerConfig's check
SERVED_NAME = "kvbench-default"
RUNS = {  # name -> (scenario, kvbench run flags)
    "shared": (
        "scenarios/shared_2k.toml",
        ["--num-requests", "8", "--max-tokens", "32", "--concurrency", "1"],
    ),
    "chat": ("scenarios/chat.toml", ["--num-requests", "24", "--max-tokens", "32", "--concurrency", "8"]),
}
_URL = re.compile(r"http://127\.0\.0\.1:(\d+)/v1")


class Deadline:
    """``--timeout-s`` for the whole script: what each step may still take."""

    def __init__(self, total_s: float) -> None:
        self.end_s = time.monotonic() + total_s

    def left_s(self) -> float:
        left = self.end_s - time.monotonic()
        if left <= 0:
            raise TimeoutError("the --timeout-s deadline passed")
        return left


class GpuVllm(VllmServer):
    """vLLM's GPU server: the peer harness's process handling, in ``dtype`` instead of float32."""

    def __init__(self, config: VllmServerConfig, dtype: str) -> None:
        super().__init__(config)
        self.dtype = dtype

    def command(self) -> list[str]:
        command = super().command()
        command[command.index("--dtype") + 1] = self.dtype
        return command


class KvbenchServe(VllmServer):
    """``kvbench serve --device cuda --engine paged`` on ``--port 0``, through the same process handling
    (its own process group, ``/health``, stop); the port is read from the line serve prints."""

    def __init__(self, config: VllmServerConfig, dtype: str, device: str = "cuda") -> None:
        super().__init__(config, port=1)  # replaced by the port serve prints
        self.dtype, self.device = dtype, device

    def command(self) -> list[str]:
        return [
            str(Path(sys.executable).parent / "kvbench"),
            "serve",
            "--port",
            "0",
            "--device",
            self.device,
            "--dtype",
            self.dtype,
            "--engine",
            "paged",
            "--block-size",
            str(BLOCK_SIZE),
            "--model",
            str(self.config.model_dir),
            "--served-model-name",
            SERVED_NAME,
        ]

    def wait_healthy(self) -> float:
        start_s = time.monotonic()
        while not (match := _URL.search(self.config.log_path.read_text(errors="replace"))):
            if self._process.poll() is not None or time.monotonic() - start_s > self.config.startup_timeout_s:
                raise PeerError(
                    f"kvbench serve did not start; last lines of {self.config.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.5)
        self.port = int(match.group(1))
        return super().wait_healthy() + time.monotonic() - start_s


def run_client(base_url: str, name: str, out: Path, deadline: Deadline) -> dict:
    """One ``kvbench run --backend openai`` of ``RUNS[name]``; the measured rows and summary."""
    scenario, flags = RUNS[name]
    parquet, summary = out.with_suffix(".parquet"), out.with_suffix(".json")
    command = [
        str(Path(sys.executable).parent / "kvbench"),
        "run",
        scenario,
        "--backend",
        "openai",
        "--base-url",
        base_url,
        "--model",
        SERVED_NAME,
        "--ignore-eos",
        *flags,
        "--out",
        str(parquet),
        "--save-result",
        str(summary),
    ]
    subprocess.run(command, cwd=REPO, check=True, capture_output=True, timeout=deadline.left_s())
    rows = [r for r in pq.read_table(parquet).to_pylist() if r["status"] == "ok"]
    return {"rows": rows, "summary": json.loads(summary.read_text())}


def measure(server: VllmServer, label: str, out_dir: Path, deadline: Deadline) -> dict[str, float]:
    """Start ``server``, run both client runs, stop it; the table's numbers for one column."""
    with server:
        started_s = server.wait_healthy()
        shared = run_client(server.base_url, "shared", out_dir / f"{label}-shared", deadline)
        chat = run_client(server.base_url, "chat", out_dir / f"{label}-chat", deadline)
    ttfts = [r["ttft_ms"] for r in sorted(shared["rows"], key=lambda r: r["sent_ms"])]
    return {
        "startup_s": started_s,
        "cold_ttft_ms": ttfts[0],
        "warm_ttft_p50_ms": statistics.median(ttfts[1:]),
        "tpot_p50_ms": shared["summary"]["median_tpot_ms"],
        "output_tok_s_c8": chat["summary"]["output_throughput"],
        "cached_prompt_tokens": sum(r["cached_prompt_tokens"] or 0 for r in shared["rows"] + chat["rows"]),
    }


def vllm_python(args: argparse.Namespace, deadline: Deadline, log) -> Path | None:
    """A Python that imports vllm: ``--vllm-python``, this one, or ``--vllm-venv`` after ``pip install
    vllm`` (bounded by ``--install-timeout-s``); ``None`` when there is none (the vLLM column is skipped)."""
    for python in filter(None, (args.vllm_python, Path(sys.executable))):
        # .../bin/python -> the environment (not resolved: a venv's python is a link)
        venv = Path(python).parent.parent
        if has_vllm(venv):
            return venv
    venv = args.vllm_venv
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=60)
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "vllm"],
            check=True,
            capture_output=True,
            timeout=min(args.install_timeout_s, deadline.left_s()),
        )
    except (subprocess.SubprocessError, OSError) as error:
        log(f"vLLM: not importable here and `pip install vllm` failed ({type(error).__name__}); kvbench only")
        return None
    return venv if has_vllm(venv) else None


def attention_kernel(device: str, dtype: str) -> str:
    """The kernel kvbench serve's paged engine chose: the engine's own rule (:func:`choose_kernel`) for
    the default model's pool (head_dim 64) in this environment, which is kvbench serve's."""
    import torch

    from kvbench.engine.paged.kernels import choose_kernel

    choice = choose_kernel(torch.device(device), getattr(torch, dtype), BLOCK_SIZE, 64)
    return f"{choice.kernel.value} ({choice.reason})"


def table(columns: dict[str, dict[str, float]], header: str) -> str:
    rows = [
        ("cold TTFT (ms), shared_2k", "cold_ttft_ms", False),
        ("warm TTFT p50 (ms)", "warm_ttft_p50_ms", False),
        ("TPOT p50 (ms)", "tpot_p50_ms", False),
        ("output tok/s, chat, concurrency 8", "output_tok_s_c8", True),
        ("cached prompt tokens (both runs)", "cached_prompt_tokens", None),
        ("server start (s)", "startup_s", False),
    ]
    names = list(columns)
    lines = [
        header,
        "",
        "| measure | " + " | ".join(names) + " | kvbench vs vLLM |",
        "|---" + "|---:" * (len(names) + 1) + "|",
    ]
    for title, key, higher_is_better in rows:
        values = [columns[name][key] for name in names]
        ratio = ""
        if "vLLM" in columns and higher_is_better is not None:
            ours, theirs = columns["kvbench paged"][key], columns["vLLM"][key]
            ratio = f"{(ours / theirs if higher_is_better else theirs / ours):.2f}x"
        digits = 0 if key == "cached_prompt_tokens" else 1
        lines.append(f"| {title} | " + " | ".join(f"{v:,.{digits}f}" for v in values) + f" | {ratio} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "results" / "gpu-side-by-side")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--timeout-s", type=float, default=420.0, help="deadline for the whole script")
    parser.add_argument("--skip-vllm", action="store_true", help="measure kvbench's column only")
    parser.add_argument("--vllm-python", type=Path, help="a Python whose environment imports vllm")
    parser.add_argument(
        "--vllm-venv", type=Path, default=Path("/tmp/kvbench-vllm-gpu"), help="where to pip install vllm"
    )
    parser.add_argument("--install-timeout-s", type=float, default=180.0)
    # cpu: a dry run of the script's steps
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "error: no CUDA device here (torch.cuda.is_available() is False); this benchmark needs a GPU",
            file=sys.stderr,
        )
        return 2
    deadline, out = Deadline(args.timeout_s), args.out
    out.mkdir(parents=True, exist_ok=True)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    model_dir = out / "model"
    subprocess.run(
        [str(Path(sys.executable).parent / "kvbench"), "model", "export", str(model_dir), "--overwrite"],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=deadline.left_s(),
    )
    columns: dict[str, dict[str, float]] = {}
    venv = None if args.skip_vllm else vllm_python(args, deadline, log)
    if venv is not None:
        config = VllmServerConfig(
            venv, model_dir, out / "vllm.log", SERVED_NAME, BLOCK_SIZE, startup_timeout_s=deadline.left_s()
        )
        columns["vLLM"] = measure(GpuVllm(config, args.dtype), "vllm", out, deadline)
    config = VllmServerConfig(
        Path(sys.prefix),
        model_dir,
        out / "kvbench-serve.log",
        SERVED_NAME,
        BLOCK_SIZE,
        startup_timeout_s=deadline.left_s(),
    )
    columns["kvbench paged"] = measure(
        KvbenchServe(config, args.dtype, args.device), "kvbench", out, deadline
    )
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else args.device
    header = (
        f"GPU side by side, {name}, {args.dtype}, {BLOCK_SIZE}-token blocks, "
        f"kvbench attention kernel: {attention_kernel(args.device, args.dtype)}"
    )
    text = table(columns, header)
    (out / "gpu_side_by_side.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (PeerError, TimeoutError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        detail = getattr(error, "stderr", None)
        tail = detail.decode(errors="replace").strip().splitlines()[-1:] if isinstance(detail, bytes) else []
        print(f"error: {str(error).splitlines()[0]}{': ' + tail[0] if tail else ''}", file=sys.stderr)
        sys.exit(1)
