"""The peer harness: kvbench against real servers on this machine (``kvbench peer vllm``).

* ``server.py``: vLLM's own virtual environment; a server process group on 127.0.0.1, of vLLM or of
  ``kvbench serve`` on the same checkpoint.
* ``driver.py``: a comparison's trace as kvbench Requests, sent through a backend
  (``kvbench.backends``) and the one send loop (``kvbench.run.loop``).
* ``comparisons.py``: the traces (shared_2k, chat, zipf; kv_events on request) and kvbench's
  per-request predictions (``kvbench.sim.vllm_pool``).
* ``vllm_events.py``: vLLM's KV cache events against kvbench's block map, after every request.
* ``engines.py``: the engine comparison: vLLM, kvbench serve copy and paged, rounds interleaved.
* ``report.py``: summaries and the Markdown report; ``vllm_peer.py``: the whole run.
"""
