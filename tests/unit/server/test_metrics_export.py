"""The server's Prometheus exporter over the speculation counts of known runs: synthetic
models, greedy, with every count derived apart from the cascade from the models' own greedy
continuations (a draft of n tokens keeps the prefix that agrees with the target's)."""

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.engine import generate
from specrouter.engine.batch import BatchScheduler, SeqRequest
from specrouter.engine.requests import Finished
from specrouter.metrics import SpecStats
from specrouter.server.metrics import Metrics

K = 4  # the small model's draft length
PROMPTS = [[0, 1, 2], [3, 1, 4, 1, 5], [7, 7, 2]]


def models():
    return (SyntheticBackend("target", vocab=32, order=3),
            SyntheticBackend("small", vocab=32, order=3, model_seed=3, noise=0.8))


def greedy(model, context, n):
    context, out = list(context), []
    for _ in range(n):
        out.append(int(np.argmax(model.logits_for(context))))
        context.append(out[-1])
    return out


def blocks(small, target, prompt, max_tokens):
    """Per cycle: (tokens the small model proposed, tokens the target accepted)."""
    context, emitted, out = list(prompt), 0, []
    while emitted < max_tokens:
        n = min(K, max_tokens - emitted - 1)
        draft, truth = greedy(small, context, n), greedy(target, context, n + 1)
        accepted = next((j for j in range(n) if draft[j] != truth[j]), n)
        out.append((n, accepted))
        context += truth[: accepted + 1]
        emitted += accepted + 1
    return out


def expected(runs):
    """The spec_decode samples of these runs' blocks (each run: one request's)."""
    every = [b for run in runs for b in run]
    small, drafted = (("level", "small"),), [b for b in every if b[0]]
    samples = {
        ("specrouter:spec_decode_num_drafts_total", small): len(drafted),
        ("specrouter:spec_decode_num_draft_tokens_total", small): sum(n for n, _ in every),
        ("specrouter:spec_decode_num_accepted_tokens_total", small): sum(a for _, a in every),
        ("specrouter:spec_decode_num_forwards_total", small): sum(n for n, _ in every),
        ("specrouter:spec_decode_num_forwards_total", (("level", "target"),)): len(every),
        ("specrouter:spec_decode_chain_cycles_total", (("chain", "small,target"),)): len(every),
    }
    for j in range(K):
        if any(a > j for _, a in every):
            samples[("specrouter:spec_decode_num_accepted_tokens_per_pos_total",
                     (("level", "small"), ("position", str(j))))] = sum(a > j for _, a in every)
    return samples


def spec_samples(metrics: Metrics) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(metrics.exposition().decode()) for s in fam.samples
            if s.name.startswith("specrouter:spec_decode") and not s.name.endswith("_created")}


def test_one_request_exports_its_counts_per_level_and_position():
    target, small = models()
    result = generate(Chain([small, target], [K]), PROMPTS[0], SamplingParams(), 40)
    metrics = Metrics()
    metrics.spec(SpecStats.of(result.levels))
    metrics.finished(result)
    want = expected([blocks(small, target, PROMPTS[0], 40)])
    assert spec_samples(metrics) == want
    positions = [want.get(("specrouter:spec_decode_num_accepted_tokens_per_pos_total",
                           (("level", "small"), ("position", str(j)))), 0) for j in range(K)]
    assert positions == [11, 6, 4, 1]  # of 18 drafts: rejections at every position


def test_a_batch_counted_step_by_step_exports_the_sum_of_its_requests():
    target, small = models()
    scheduler = BatchScheduler(lambda r: Chain([small, target], [K]), max_batch=2)
    for i, prompt in enumerate(PROMPTS):
        scheduler.add(str(i), SeqRequest(prompt, SamplingParams(), 30))
    metrics = Metrics()
    steps = 0
    while scheduler.n_active or scheduler.n_waiting:
        for event in scheduler.step():
            if isinstance(event, Finished):
                metrics.finished(event.result)
        metrics.spec(scheduler.take_spec_counts())
        steps += 1
    assert steps > 3 * len(PROMPTS)  # counted in many increments, not once at the end
    assert spec_samples(metrics) == expected([blocks(small, target, p, 30) for p in PROMPTS])
