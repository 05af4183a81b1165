"""Small scenario files the command tests share, and the flags of the paged engine at concurrency 4."""

from tiny_workloads import tiny_shared_prefix

# Rendered: 3 + 64 + 2 (system) + 3 + 16 + 2 (user) + 3 = 93 tokens; the first 3 + 64 + 2 + 3 = 72
# tokens are shared (system message + the user header), i.e. 4 full blocks of 16 = 64 cached tokens.
SHARED_PREFIX = (
    tiny_shared_prefix(4)
    + """
[cache]
block_size = 16

[run]
cache_size = "64"
"""
)
PROMPT_TOKENS = 93
SHARED_BLOCK_TOKENS = 64
# The paged engine with four requests in flight (all of SHARED_PREFIX's at once).
PAGED_AT_4 = ("--engine", "paged", "--concurrency", "4")
# The same, 400 requests of 30 output tokens: minutes of work, for runs cut part-way.
LONG_SHARED_PREFIX = SHARED_PREFIX.replace("num_requests = 4", "num_requests = 400").replace(
    "max_tokens = 3", "max_tokens = 30"
)
