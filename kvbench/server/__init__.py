"""``kvbench serve``: an OpenAI-compatible HTTP server over the in-process engine and its prefix cache.

* :mod:`kvbench.server.app`: the FastAPI routes (completions, chat completions, models, health,
  reset, metrics) and the SSE stream.
* :mod:`kvbench.server.service`: one request at a time through the engine, in a worker thread.
* :mod:`kvbench.server.engine_stream`: the engine, reporting each output token as it exists.
* :mod:`kvbench.server.schemas`: OpenAI request and response shapes, error objects.
* :mod:`kvbench.server.metrics`: Prometheus counters (``kvbench:prefix_cache_queries_total``, ...).
"""
