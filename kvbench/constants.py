"""Numbers and names that several folders share, each with its source. Imports nothing of kvbench."""

DEFAULT_BLOCK_SIZE = 16  # tokens per KV block: vLLM's default (--block-size)
MOONCAKE_BLOCK_TOKENS = 512  # the Mooncake traces' hash_ids name 512-token blocks (FAST'25 README)

# tiktoken's cl100k_base from kvbench's own ranks file (name kept: traces record it)
DEFAULT_TOKENIZER = "cl100k_base_offline"
CL100K_VOCAB_SIZE = 100_277  # tiktoken cl100k_base n_vocab: 100,256 BPE ranks + special tokens
CL100K_ENDOFTEXT_ID = 100_257  # tiktoken cl100k_base <|endoftext|>
CL100K_IM_START_ID, CL100K_IM_END_ID = 100_264, 100_265  # tiktoken README, "Extending tiktoken": cl100k_im
CHATML = "chatml"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CHATML_EOS_TOKEN_IDS = (CL100K_ENDOFTEXT_ID, CL100K_IM_END_ID)  # a ChatML reply ends at either

# The response header in which `kvbench serve` names the replica that answered (`--replica-id`); a client
# behind a router reads it into the row's `replica_id` (routers pass a worker's response headers through).
REPLICA_HEADER = "X-Kvbench-Replica"
