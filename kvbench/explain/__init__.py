"""``kvbench explain``: why a prefix cache is not buying more.

* :mod:`~kvbench.explain.waterfall`: the bars from all prompt tokens down to the hit (they sum exactly);
* :mod:`~kvbench.explain.prefixes`: each prompt's longest shared prefix with anything sent before;
* :mod:`~kvbench.explain.replay`: the bounded replay, with when a missing block was last used;
* :mod:`~kvbench.explain.causes` and :mod:`~kvbench.explain.content`: the cause of every miss;
* :mod:`~kvbench.explain.volatile`: dates, times, UUIDs, ids and counters in text;
* :mod:`~kvbench.explain.api`: :func:`explain_requests`; :mod:`~kvbench.explain.lint`: ``--lint``.

Pure Python over token ids (no torch), like sim/.
"""
