"""The engine: requests, cycles, stop conditions, streaming, batching.

request.py is one request's state machine (stop rules, result), its input checked once
(checks.py), its text and stop strings (text.py), its chain asked of a router before every
cycle (chain_router.py: a fixed chain is a router that always returns it); generate.py runs
one request alone (library and CLI); batch.py advances many requests together, one backend
call per model per step, for the server.
"""

from specrouter.engine.chain_router import ChainRouter
from specrouter.engine.checks import check_prompt
from specrouter.engine.generate import generate, generate_stream
from specrouter.engine.request import GenerationResult

__all__ = ["ChainRouter", "GenerationResult", "check_prompt", "generate", "generate_stream"]
