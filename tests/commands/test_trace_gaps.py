"""``--schedule trace`` refuses a gap no replay should wait out (``timestamp: 1e308``)
before sending anything, and says how long the replay will take (a real ``kvbench serve``)."""

import json

import pyarrow.parquet as pq
import pytest
from cli_and_rows import openai_args

pytestmark = [pytest.mark.server]


def mooncake(tmp_path, timestamps_ms):
    path = tmp_path / "mooncake.jsonl"
    path.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": 20, "output_length": 1, "hash_ids": [i]}) + "\n"
            for i, t in enumerate(timestamps_ms)
        )
    )
    return path


def run(kvbench, server, trace, out, *flags):
    return kvbench(
        *openai_args("run", trace, server.url),
        "--schedule",
        "trace",
        "--no-preflight",
        "--out",
        out,
        *flags,
    )


def test_a_far_future_timestamp_is_refused_before_anything_is_sent(kvbench, server, tmp_path):
    out = tmp_path / "r.parquet"
    code, _, err = run(kvbench, server, mooncake(tmp_path, [0, 500, 1e308]), out)
    assert code == 2 and not out.exists()
    line = " ".join(err[err.index("error: ") :].split())  # after the preflight and server-cache status lines
    assert (
        line.startswith("error: --schedule trace: request ")
        and "gaps over 86,400 s (a day) are refused" in line
    )


def test_a_replay_says_how_long_it_takes(kvbench, server, tmp_path):
    out = tmp_path / "r.parquet"
    code, _, err = run(kvbench, server, mooncake(tmp_path, [0, 500, 1500]), out, "--time-scale", "2")
    assert code == 0, err
    assert "--schedule trace: 3 requests at their own times over 0.8 s of replay (time scale 2)" in " ".join(
        err.split()
    )
    assert len(pq.read_table(out)) == 3
