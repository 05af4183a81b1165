"""Leaving the interpreter while the paged engine's worker is mid-step exits cleanly.

Before the atexit hook (engine/paged/engine.py, ``_stop_workers_at_exit``) this aborted the process
with ``terminate called without an active exception`` and exit status 134, every time: the daemon
worker was still inside torch when the interpreter finalized (a server, benchmark or interrupted run
leaving with requests in flight).
"""

import subprocess
import sys
import textwrap
from readiness import LIMIT_S

LEAVE = textwrap.dedent("""
    import time
    from kvbench.cache.base import CacheConfig
    from kvbench.engine.model import default_llama_config, random_model
    from kvbench.engine.paged.engine import PagedConfig, PagedEngine
    from kvbench.engine.sampling import SamplingParams

    loaded = random_model(default_llama_config(vocab_size=1000, hidden_size=128, intermediate_size=256,
                                               num_hidden_layers=2, num_attention_heads=2, bos_token_id=1,
                                               eos_token_id=2, max_position_embeddings=4096), seed=1)
    engine = PagedEngine(loaded, PagedConfig(CacheConfig(capacity_blocks=512, block_size=16)))
    futures = [engine.submit(list(range(3, 900)), SamplingParams(max_tokens=2000, ignore_eos=True))
               for _ in range(4)]
    while not engine.scheduler.running:
        time.sleep(0.01)
    time.sleep(0.2)
    print("leaving with", sum(not f.done() for f in futures), "requests in flight", flush=True)
""")


def test_exit_while_the_worker_is_mid_step_is_clean():
    done = subprocess.run([sys.executable, "-c", LEAVE], capture_output=True, text=True, timeout=LIMIT_S)
    assert "terminate called" not in done.stderr
    assert done.returncode == 0, done.stderr[-2000:]
    assert "leaving with 4 requests in flight" in done.stdout
