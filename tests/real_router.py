"""A real router (sglang-router or vllm-router from the ``[fleet]`` extra) in a child process on a free
loopback port, over given worker URLs, stopped by its PID: the one way tests start a real router.

Imported by its bare name (``from real_router import ...``): tests/ is on ``sys.path`` through
tests/conftest.py."""

import contextlib
import importlib.util
import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from readiness import process_ended, wait_until

# the chat trace the fleet tests send through a router: 4 conversations, 11 requests, a shared
# 64-token system prompt (4 blocks of 16)
CHAT = """
[workload]
kind = "chat"
num_conversations = 4
turns = "uniform:2,3"
system_tokens = 64
user_tokens = "lognormal:20,0.3"
reply_tokens = "lognormal:4,0.3"
conversation_rate_per_s = 100.0
think_time_s = 0.01
seed = 3

[cache]
block_size = 16
"""

ROUTERS = {  # name -> (importable module, command line before the flags)
    "sglang": ("sglang_router", [sys.executable, "-m", "sglang_router.launch_router"]),
    "vllm": ("vllm_router", [sys.executable, "-m", "vllm_router.launch_router"]),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listed_models(url: str) -> list[str] | None:
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=5) as response:
            return [entry["id"] for entry in json.loads(response.read())["data"]] or None
    except (OSError, ValueError, KeyError):
        return None


@contextlib.contextmanager
def real_router(name: str, policy: str, workers: list[str], log_dir: Path):
    """Yields the router's root URL once it lists a model; skips when the router is not installed."""
    module, command = ROUTERS[name]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[fleet]')")
    port, log_path = free_port(), log_dir / f"{name}-router.log"
    log = log_path.open("w")
    flags = ["--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(free_port())]
    process = subprocess.Popen(
        [*command, *flags, "--policy", policy, "--worker-urls", *workers],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: listed_models(url),
            f"{name}-router on {url}",
            ended=process_ended(process),
            log=log_path.read_text,
        )
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
