"""kvbench: measure what prefix caching buys an LLM server."""

__version__ = "0.1.0"
