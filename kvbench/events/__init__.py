"""KV cache events: what a server's prefix cache stores and drops, published and read in vLLM's wire
format (ZMQ PUB frames of msgpack batches, a ROUTER socket that replays), so one subscriber reads
kvbench serve, vLLM and SGLang alike (``docs/events.md``)."""
