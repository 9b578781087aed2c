"""The engine: requests, cycles, stop conditions, streaming, batching.

request.py is one request's state machine (stop rules, text, result; a fixed chain is a
router that always returns it); generate.py runs one request alone (library and CLI);
batch.py advances many requests together, one backend call per model per step, for the server.
"""

from specrouter.engine.generate import generate, generate_stream
from specrouter.engine.request import ChainRouter, GenerationResult, check_prompt

__all__ = ["ChainRouter", "GenerationResult", "check_prompt", "generate", "generate_stream"]
