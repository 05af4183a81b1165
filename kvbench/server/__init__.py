"""``kvbench serve``: an OpenAI-compatible HTTP server over the in-process engine and its prefix cache.

* :mod:`kvbench.server.app`: the FastAPI routes (completions, chat completions, models, health,
  reset, metrics).
* :mod:`kvbench.server.streaming`: the SSE events of a streamed response, one choice or ``n``.
* :mod:`kvbench.server.service`: requests through :class:`kvbench.backends.inprocess.InProcessBackend`
  (one at a time, in a worker thread), each output token as an event as soon as it exists.
* :mod:`kvbench.server.schemas`: OpenAI request and response shapes, error objects.
* :mod:`kvbench.server.metrics`: Prometheus counters (``kvbench:prefix_cache_queries_total``, ...).
"""
