"""Leaving the interpreter while an engine's worker is mid-step (paged) or mid-request (copy) exits cleanly.

Before the atexit hook (now engine/worker.py, ``_stop_workers_at_exit``) this aborted the process
with ``terminate called without an active exception`` and exit status 134, every time: the daemon
worker was still inside torch when the interpreter finalized (a server, benchmark or interrupted run
leaving with requests in flight).
"""

import subprocess
import sys
import textwrap

import pytest
from readiness import LIMIT_S

LEAVE = textwrap.dedent("""
    import time
    from kvbench.cache.base import CacheConfig
    from kvbench.engine.model import default_llama_config, random_model
    from kvbench.engine.factory import EngineConfig, make_engine
    from kvbench.engine.sampling import SamplingParams

    loaded = random_model(default_llama_config(vocab_size=1000, hidden_size=128, intermediate_size=256,
                                               num_hidden_layers=2, num_attention_heads=2, bos_token_id=1,
                                               eos_token_id=2, max_position_embeddings=4096), seed=1)
    engine = make_engine(loaded, EngineConfig(KIND, cache=CacheConfig(capacity_blocks=512, block_size=16)))
    futures = [engine.submit(list(range(3, 900)), SamplingParams(max_tokens=2000, ignore_eos=True))
               for _ in range(4)]
    while engine.num_sequences()[0] == 0:
        time.sleep(0.01)
    time.sleep(0.2)
    print("leaving with", sum(not f.done() for f in futures), "requests in flight", flush=True)
""")


@pytest.mark.parametrize("kind", ["paged", "copy"])
def test_exit_while_the_worker_is_mid_step_is_clean(kind):
    code = LEAVE.replace("KIND", repr(kind))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=LIMIT_S)
    assert "terminate called" not in done.stderr
    assert done.returncode == 0, done.stderr[-2000:]
    assert "leaving with 4 requests in flight" in done.stdout
