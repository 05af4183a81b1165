"""A fleet behind a real router: replicas, the router per policy, one run each (``kvbench fleet``)."""
