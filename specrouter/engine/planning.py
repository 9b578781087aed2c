"""How a server turns a request's speculation into what generates it: a fixed chain, or a
router session (a live one, or one routed from frozen state for a reproducible request)."""

from __future__ import annotations

from specrouter.cascade.chain import Chain
from specrouter.engine.chain_router import ChainRouter
from specrouter.engine.requests import Planner, SeqRequest
from specrouter.engine.speculation import Speculation, check_chain
from specrouter.router.frozen import FrozenRoutes


def pool_planner(pool, target: str, router=None, default: Speculation = Speculation()) -> Planner:
    """The planner a server uses: requests name `auto` (a session of `router`), `off`
    (the target alone) or a chain of pool models that must end at the served target
    (check_chain; the HTTP API has checked it against the served levels already)."""

    frozen = FrozenRoutes(router) if router is not None else None

    def plan(request: SeqRequest) -> Chain | ChainRouter:
        spec = request.speculation or default
        if spec.mode == "off":
            return pool.chain([target], [])
        if spec.mode == "chain":
            check_chain(spec.chain, spec.draft_lengths or None, target=target)
            return pool.chain(list(spec.chain), list(spec.draft_lengths) or None)
        if router is None:
            return pool.chain([target], [])  # no router configured: auto means the target alone
        if request.reproducible:
            return frozen.session()
        return router.session(request.memory)

    return plan
