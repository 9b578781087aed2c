"""The engine: requests, cycles, stop conditions, streaming, batching.

generate.py runs one request over a chain or a router (library and CLI); batch.py
advances many requests together, one backend call per model per step, for the server.
"""

from specrouter.engine.generate import ChainRouter, GenerationResult, check_prompt, generate, generate_stream

__all__ = ["ChainRouter", "GenerationResult", "check_prompt", "generate", "generate_stream"]
