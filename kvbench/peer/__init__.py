"""The peer harness: kvbench against real servers on this machine (``kvbench peer vllm``).

* ``server.py``: vLLM's own virtual environment and a server process group on 127.0.0.1.
* ``driver.py``: a comparison's trace as kvbench Requests, sent one at a time through a backend
  (``kvbench.backends``) and the one send loop (``kvbench.run.loop``).
* ``comparisons.py``: the traces (shared_2k, chat, zipf) and kvbench's per-request predictions
  (``kvbench.sim.vllm_pool``); ``inprocess.py``: the same trace on kvbench's in-process engine (TTFT).
* ``report.py``: summaries and the Markdown report; ``vllm_peer.py``: the whole run.
"""
