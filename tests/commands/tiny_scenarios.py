"""Small scenario files the command tests share."""

# Rendered: 3 + 64 + 2 (system) + 3 + 16 + 2 (user) + 3 = 93 tokens; the first 3 + 64 + 2 + 3 = 72
# tokens are shared (system message + the user header), i.e. 4 full blocks of 16 = 64 cached tokens.
SHARED_PREFIX = """
[workload]
kind = "shared-prefix"
num_requests = 4
system_tokens = 64
question_tokens = 16
max_tokens = 3
seed = 1

[cache]
block_size = 16

[run]
cache_size = "64"
"""
PROMPT_TOKENS = 93
SHARED_BLOCK_TOKENS = 64
