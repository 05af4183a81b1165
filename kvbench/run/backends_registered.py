"""The modules whose planners register the ``--backend`` values with :mod:`kvbench.run.plan`.

Imported by :func:`kvbench.run.plan.planner_for` before it looks a backend up; a new backend is a
module with one ``@register_backend`` planner, named here. Each module imports its heavy libraries
(torch, the provider SDKs) inside the planner, so importing them all is cheap.
"""

from kvbench.run import anthropic_plan, inprocess_plan, openai_plan

__all__ = ["anthropic_plan", "inprocess_plan", "openai_plan"]
