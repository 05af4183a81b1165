#!/usr/bin/env bash
# A CI gate for a prefix cache: start `kvbench serve` on loopback, replay a short scenario over HTTP,
# fail the job when a number misses its threshold, and write the results and a report for upload.
#
#   examples/ci/gate.sh [OUT_DIR]          (default results/ci)
#
# Exit codes are kvbench run's: 0 ok, 1 requests failed, 2 bad input, 3 an assertion failed,
# 130 interrupted. Point --base-url at your own server (vLLM, SGLang) to gate it instead; drop the
# serve step then. Needs the [serve] extra (plus [plots] for the report's PNGs): from a checkout,
# pip install -c constraints-cpu.txt -e '.[serve,plots]'.
set -euo pipefail
out=${1:-results/ci}
port=${KVBENCH_CI_PORT:-8765}
mkdir -p "$out"

kvbench serve --port "$port" >"$out/serve.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
python - "$port" <<'PY'   # wait for /health (the model builds in a few seconds)
import sys, time, urllib.request
deadline = time.monotonic() + 180
while True:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=5)
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit("kvbench serve did not answer /health within 180 s")
        time.sleep(0.5)
PY

kvbench run scenarios/shared_2k.toml --backend openai --base-url "http://127.0.0.1:$port/v1" \
    --requests 8 --warmup 1 --max-tokens 4 --ignore-eos --out "$out/run.parquet" --save-result "$out/run.json" \
    --goodput ttft:10000 \
    --assert 'failed==0' --assert 'hit_rate>=0.85' --assert 'reported_hit_rate>=0.8' \
    --assert 'median_ttft_ms<=10000'
kvbench report "$out/run.parquet" --format csv --out "$out"
if python -c "import matplotlib" 2>/dev/null; then
    kvbench report "$out/run.parquet" --out "$out/report"
fi
