"""The router's behaviour as one JSON document, to compare two versions of the package.

Runs routed generations on the synthetic family of tests/unit/router_synth.py (simulated time
only, so every number is deterministic) and prints, per run, the tokens, the chain of every
cycle, the chains used and every recorded decision whole (chosen chain, reason, candidates and
their scores, the inputs --explain shows). The runs:

- the six single-request runs (greedy and T=0.8, three prompts) with the n-gram lookup;
- a stream of requests through one router's sessions with the suffix lookup and a
  cross-request memory (later requests draft from earlier ones);
- a batch of sequences through BatchScheduler, greedy and seeded sampling;
- seeded sessions of FrozenRoutes (what a server gives a request with a seed);
- a stream of sessions whose every choice costs simulated time (sim/host.py's PricedChoices),
  so that the pacing reuses recent decisions; with the pacing's counters.

A refactor that claims "behaviour unchanged" prints the same document before and after:

    python scripts/router_equivalence.py OLD_TREE > old.json
    python scripts/router_equivalence.py NEW_TREE > new.json
    cmp old.json new.json

TREE is a checkout of the repository (its root); it goes first on sys.path, so the package and
the test helpers are that tree's.
"""

from __future__ import annotations

import json
import sys


def main(root: str) -> None:
    sys.path.insert(0, root)
    import numpy as np

    from specrouter.cascade.sampling import SamplingParams
    from specrouter.drafters.memory import SuffixMemory
    from specrouter.engine import generate
    from specrouter.engine.batch import BatchScheduler, Finished, SeqRequest
    from specrouter.router.frozen import FrozenRoutes
    from specrouter.sim.host import PricedChoices
    from tests.unit.router_synth import PROMPT, family, make_router, simulated_clock

    prompts = [PROMPT, [3, 1, 4, 1, 5, 9, 2, 6] * 3, [7, 7, 7, 2]]
    modes = (SamplingParams(), SamplingParams(temperature=0.8))

    def shown(result) -> list:
        decisions = [d if isinstance(d, dict) else d.as_dict() for d in result.decisions]
        return [result.token_ids, result.chains_per_cycle, [[list(n), list(k)] for n, k in result.chains_used],
                decisions]

    out: dict[str, list] = {"single": [], "suffix_memory": [], "batch": [], "frozen": [], "paced": []}
    for params in modes:
        target, mid, small = family()
        router = make_router(target, [mid, small])
        clock = simulated_clock([target, mid, small])
        for seed, prompt in enumerate(prompts):
            r = generate(router, prompt, params, 120, rng=np.random.default_rng(seed), clock=clock)
            out["single"].append(shown(r))
    for params in modes:
        target, mid, small = family()
        router = make_router(target, [mid, small], lookup="suffix", memory=SuffixMemory(4096))
        clock = simulated_clock([target, mid, small])
        for seed, prompt in enumerate(prompts * 2):
            r = generate(router.session(), prompt, params, 80, rng=np.random.default_rng(seed), clock=clock)
            out["suffix_memory"].append(shown(r))
    for params in (SamplingParams(), SamplingParams(temperature=0.8, seed=11)):
        target, mid, small = family()
        router = make_router(target, [mid, small], lookup="suffix")
        scheduler = BatchScheduler(lambda r: router.session(), max_batch=4, clock=simulated_clock([target, mid, small]))
        for i, prompt in enumerate(prompts + [[2, 4, 6, 8] * 4]):
            scheduler.add(str(i), SeqRequest(prompt, params, 60))
        results = {}
        while scheduler.n_active or scheduler.n_waiting:
            for event in scheduler.step():
                if isinstance(event, Finished):
                    results[event.request_id] = shown(event.result)
        out["batch"].append([results[k] for k in sorted(results)])
    target, mid, small = family()
    router = make_router(target, [mid, small], lookup="suffix")
    clock = simulated_clock([target, mid, small])
    generate(router, PROMPT, SamplingParams(), 60, clock=clock)  # something learned before the freeze
    frozen = FrozenRoutes(router)
    for seed, prompt in enumerate(prompts):
        r = generate(frozen.session(), prompt, SamplingParams(temperature=0.8), 60, rng=np.random.default_rng(seed),
                     clock=clock)
        out["frozen"].append(shown(r))
    for params in modes:
        target, mid, small = family()
        router = make_router(target, [mid, small], lookup="suffix")
        clock = simulated_clock([target, mid, small])

        def charge(seconds: float, target=target) -> None:
            target.simulated_seconds += seconds

        for seed, prompt in enumerate(prompts * 2):
            priced = PricedChoices(router.session(), 0.004, charge, 0.0005)
            r = generate(priced, prompt, params, 80, rng=np.random.default_rng(seed), clock=clock)
            out["paced"].append(shown(r))
        out["paced"].append([router.pacing.choices, router.pacing.deliberated, router.pacing.reused])
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/router_equivalence.py TREE")
    main(sys.argv[1])
