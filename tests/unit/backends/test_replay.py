"""The replay backend: any greedy chain over a recorded answer commits exactly that answer,
and the simulated time is the engine's own forwards priced by the latency."""

import numpy as np
import pytest

from benchmarks.copy_ceiling import Costs, cycle_counts, replay, router_replay, rows, validation
from specrouter.backends.replay import ReplayBackend, Script
from specrouter.cascade.chain import Chain
from specrouter.cascade.sampling import SamplingParams
from specrouter.drafters.suffix import SuffixDrafter
from specrouter.engine import generate

from ..router_synth import make_router


def scripts():
    """Answers that copy stretches of their prompts with edits (original ids in the 1000s)."""
    rng = np.random.default_rng(5)
    out = []
    for n in range(3):
        prompt = [int(t) for t in rng.integers(1000, 1040, 60)]
        answer = prompt[10:30] + [int(t) for t in rng.integers(1000, 1040, 7)] + prompt[35:55]
        out.append(Script(prompt, answer, eos=n != 1))
    return out


def model(latency=lambda n: 0.04 + 0.01 * n):
    return ReplayBackend("t", scripts(), latency=latency)


def run(chain_or_router, target, index):
    prompt, answer = target.play(index)
    start = target.simulated_seconds
    r = generate(chain_or_router, prompt, SamplingParams(), len(answer) + target.scripts[index].eos,
                 clock=lambda: target.simulated_seconds)
    return r, answer, target.simulated_seconds - start


@pytest.mark.parametrize("index", [0, 1, 2])
def test_every_greedy_chain_commits_the_recorded_answer_and_stops_where_it_did(index):
    target = model()
    for method in (Chain([target], []), Chain([SuffixDrafter(), target], [16]), Chain([SuffixDrafter(), target], [3]),
                   make_router(target, [], lookup="suffix")):
        r, answer, _ = run(method, target, index)
        assert r.token_ids == answer
        assert r.finish_reason == ("stop" if target.scripts[index].eos else "length")


def test_ids_are_compact_and_the_off_path_row_is_a_token_no_answer_uses():
    target = model()
    prompt, answer = target.play(0)
    assert target.compact(target.scripts[0].answer) == answer and max(prompt + answer) < target.n_vocab - 2
    assert int(np.argmax(target.logits_for(prompt))) == answer[0]
    assert int(np.argmax(target.logits_for(prompt + [answer[0] + 1]))) == target.off
    assert int(np.argmax(target.logits_for(prompt + answer))) == min(target.eos_ids)


def test_the_prompt_is_priced_as_one_token_and_each_fed_token_after_it_counts():
    target = model(latency=lambda n: float(n))
    _, answer, seconds = run(Chain([target], []), target, 0)
    assert seconds == len(answer) + 1  # the prompt's last token, then each answer token (the last asks for EOS)


@pytest.mark.parametrize("k", [1, 4, 16])
def test_a_fixed_suffix_chain_costs_what_the_ceilings_replay_counts(k):
    # The engine's forwards over the replay, priced by a forward-cost table, equal the copy
    # ceiling's accounting from the suffix index alone: one t(k + 1) per block (its first
    # feeds the prompt's last token with the proposals; the prefill before it is not priced).
    table = {1: 0.044, 2: 0.075, 4: 0.14, 8: 0.32, 17: 0.42, 33: 0.84, 65: 1.1}
    t = Costs({n: v * 1e3 for n, v in table.items()})
    target = model(latency=lambda n: t(n) / 1e3)
    index = 1  # ends at max_tokens: no EOS forward
    _, answer, seconds = run(Chain([SuffixDrafter(), target], [k]), target, index)
    prompt = target.compact(target.scripts[index].prompt)
    expected = replay(rows(prompt, answer), lambda r: k, t, lookup_ms=0.0) / 1e3
    assert seconds == pytest.approx(expected)


def test_cycle_counts_count_the_cycles_whose_chain_drafted():
    target = model()
    alone, _, _ = run(Chain([target], []), target, 0)
    assert cycle_counts(alone) == {"cycles": alone.cycles, "drafted": 0}
    drafted, _, _ = run(Chain([SuffixDrafter(), target], [16]), target, 0)
    assert cycle_counts(drafted) == {"cycles": drafted.cycles, "drafted": drafted.cycles}
    routed, _, _ = run(make_router(target, [], lookup="suffix"), target, 0)
    counts = cycle_counts(routed)
    # the answer copies stretches of its prompt (drafted) between edits (the target alone)
    assert counts["cycles"] == routed.cycles and 0 < counts["drafted"] < routed.cycles


def test_validation_sets_the_measured_speedup_and_choices_beside_the_replayed_ones():
    tasks = [{"workload": "code-edit", "id": str(i), "prompt": s.prompt, "answer": s.answer, "eos": s.eos}
             for i, s in enumerate(scripts())]
    costs = {str(n): 40.0 + 10.0 * n for n in (1, 2, 4, 8, 16, 32, 65)}
    runs = [{"workload": "code-edit", "id": str(i), "alone": [2.0, 3.0],
             "auto": [{"seconds": 1.0, "cycles": 10, "drafted": 4, "same": i != 0},
                      {"seconds": 1.5, "cycles": 10, "drafted": 6, "same": True}]} for i in range(3)]
    v = validation({"tasks": tasks, "measured": {"costs_ms": costs, "runs": runs}})
    replayed, replayed_cycles = router_replay(tasks, Costs(costs))
    drafted, total = replayed_cycles["code-edit"]
    assert 0 < drafted < total  # the router drafted where the answer copies, and not everywhere
    for group in ("code-edit", "all"):
        assert v[group] == {"measured": 2.0, "replayed": replayed[group], "error": round(replayed[group] / 2.0 - 1, 3),
                            "drafted_measured": 0.5, "drafted_replayed": round(drafted / total, 3), "same_text": "5/6"}
    # a run recorded before repeats: one auto time per task, no cycles
    old = [{"workload": "code-edit", "id": str(i), "alone": [2.0, 3.0], "auto": 1.25} for i in range(3)]
    assert validation({"tasks": tasks, "measured": {"costs_ms": costs, "runs": old}})["all"] == \
        {"measured": 2.0, "replayed": replayed["all"], "error": round(replayed["all"] / 2.0 - 1, 3)}


def test_sessions_replay_reports_each_turn_the_later_turns_together_and_all():
    from benchmarks.sessions_replay import evaluate

    made = scripts()  # three turns of one session
    tasks = [{"workload": "doc-qa", "turn": i + 1, "id": f"doc/{i + 1}", "prompt": s.prompt, "answer": s.answer,
              "eos": s.eos} for i, s in enumerate(made)]
    costs = {str(n): 40.0 + 10.0 * n for n in (1, 2, 4, 8, 16, 32, 64, 65)}
    ev = evaluate({"costs_ms": costs, "tasks": tasks})
    assert list(ev) == ["all", "doc-qa turn 1", "doc-qa turn 2", "doc-qa turn 3", "doc-qa turns 2+"]
    assert [ev[f"doc-qa turn {i + 1}"]["tokens"] for i in range(3)] == [len(s.answer) for s in made]
    assert ev["doc-qa turns 2+"]["tokens"] == len(made[1].answer) + len(made[2].answer)
    assert ev["all"]["tokens"] == sum(len(s.answer) for s in made)
    # the later turns' ratio and cycles are their sums', between those of its two turns
    second, third, later = ev["doc-qa turn 2"], ev["doc-qa turn 3"], ev["doc-qa turns 2+"]
    assert min(second["auto"], third["auto"]) <= later["auto"] <= max(second["auto"], third["auto"])
    assert later["drafted"] == [a + b for a, b in zip(second["drafted"], third["drafted"])]
    assert all(row["oracle"] >= 1.0 and row["auto"] > 0 for row in ev.values())
