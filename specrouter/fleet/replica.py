"""What a fleet builds on its nodes: the engine of each replica, and the vocabulary the
ingress tokenizes with. An EngineBuild is sent (pickled) to every replica, so it holds
configuration, never loaded models."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from specrouter.backends.base import Backend
from specrouter.pool import Pool
from specrouter.server.config import ServeConfig
from specrouter.server.run import Engine, build_engine


class EngineBuild(Protocol):
    config: ServeConfig

    def engine(self) -> AbstractContextManager[Engine]:
        """A replica's engine (its models close when the context exits)."""

    def vocabulary(self) -> Backend:
        """The served target as the ingress needs it: tokenizer, chat template, context size."""


@dataclass
class PoolBuild:
    """The pool the configuration names, loaded from each node's model folder (sha256-checked
    when pulled there: a node without the files fails to start, naming itself and the file)."""

    config: ServeConfig

    def engine(self) -> AbstractContextManager[Engine]:
        return build_engine(self.config)

    def vocabulary(self) -> Backend:
        # One sequence slot and one thread: the ingress only tokenizes (a torch target without
        # its weights; llama.cpp maps them from the page cache the node's replicas share).
        pool = Pool(cache_dir=self.config.cache_dir, n_ctx=self.config.n_ctx, n_threads=1, n_seq_max=1,
                    device="cpu", exact=self.config.exact)
        return pool.vocabulary(self.config.served)
