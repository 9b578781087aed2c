"""Trace-forced mode (backends/forced.py, sim/forced.py) on synthetic "real" models that
record every call: the wrapper performs each call the engine makes on the real backend (same
sequences, positions, token counts and rows wanted; a batched call as one batched call; every
rollback), returns the replay's rows, and on a real machine the profile describes exactly a
forced run times what the simulator predicts, choice for choice."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specrouter.backends.forced import FILLER, ForcedBackend
from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.sampling import SamplingParams
from specrouter.engine import generate
from specrouter.errors import BackendError, InvalidParameterError
from specrouter.ops.rows import NUMPY
from specrouter.router.estimates.costs import CostProfile
from specrouter.sim.batched import copies_for, serve
from specrouter.sim.forced import ForcedReplay, compare, measure_profile
from specrouter.sim.simulate import ALONE, AUTO, ChainChoice, Replay
from specrouter.sim.trace import record
from tests.unit.sim.test_simulate import CHEAP, models, profile, prompts

#: The real models' rows are wider than the replay's compact vocabulary (13 ids).
WIDTH = 40
THREE = ChainChoice(("suffix", "draft", "target"), (2, 6))


class LogsSlots:
    """Logs remove, new_sequence and free_sequence in `calls` (a mixin ahead of a Backend)."""

    calls: list[tuple]

    def remove(self, seq, start):
        self.calls.append(("remove", seq, start))
        super().remove(seq, start)

    def new_sequence(self):
        seq = super().new_sequence()
        self.calls.append(("new", seq))
        return seq

    def free_sequence(self, seq):
        self.calls.append(("free", seq))
        super().free_sequence(seq)


class Recording(LogsSlots, SyntheticBackend):
    """A real model that logs every call, priced by the profile (its clock: simulated_seconds)."""

    def __init__(self, name: str, p: CostProfile) -> None:
        super().__init__(name, vocab=WIDTH, latency=lambda n: p.seconds(name, n))
        self.calls: list[tuple] = []

    def decode(self, seq, tokens, pos, n_logits):
        self.calls.append(("decode", seq, list(tokens), pos, n_logits))
        return super().decode(seq, tokens, pos, n_logits)

    def decode_batch(self, items):
        if len(items) == 1:  # SyntheticBackend: a call of one sequence is a decode
            self.calls.append(("batch", [(s, list(t), p, n) for s, t, p, n in items]))
            return [SyntheticBackend.decode(self, *items[0])]
        self.calls.append(("batch", [(s, list(t), p, n) for s, t, p, n in items]))
        return super().decode_batch(items)


class Asked(LogsSlots, ForcedBackend):
    """A forced model that logs what the engine asks of it (its tokens as the real model is
    fed them) and checks every row it returns against its replay's row for that context."""

    def __init__(self, real, replay) -> None:
        super().__init__(real, replay)
        self.calls: list[tuple] = []

    def decode(self, seq, tokens, pos, n_logits):
        self.calls.append(("decode", seq, self._real(tokens), pos, n_logits))
        rows = super().decode(seq, tokens, pos, n_logits)
        self.check(seq, n_logits, rows)
        return rows

    def decode_batch(self, items):
        self.calls.append(("batch", [(s, self._real(t), p, n) for s, t, p, n in items]))
        out = super().decode_batch(items)
        for (seq, _, _, n), rows in zip(items, out, strict=True):
            self.check(seq, n, rows)
        return out

    def check(self, seq, n_logits, rows):
        context = self.kv_tokens(seq)
        assert rows.shape == (n_logits, WIDTH)
        for i, row in enumerate(rows):
            expected = self.replay.logits_for(context[: len(context) - n_logits + 1 + i])
            assert int(np.argmax(row)) == int(np.argmax(expected))
            assert NUMPY.confidence(row) == pytest.approx(NUMPY.confidence(expected), rel=1e-12)


def forced_replay(trace, p):
    """A ForcedReplay over Recording models (by name) whose forced models are Asked, timed on
    the real models' clock."""
    real = {m: Recording(m, p) for m in ("target", "draft")}
    forced = ForcedReplay(trace, p, real, clock=lambda: sum(m.simulated_seconds for m in real.values()))
    forced.target = Asked(real["target"], forced.target.replay)
    forced.drafts = [Asked(real["draft"], forced.drafts[0].replay)]
    forced.models = [*forced.drafts, forced.target]
    return forced, real


def labels(r):
    return [r.chains_used[i] for i in r.chains_per_cycle]


@pytest.fixture(scope="module")
def trace():
    target, draft = models(profile(CHEAP), eos=11)
    return record(target, [draft], prompts(5), max_tokens=40, branch_tokens=32)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("method", ["alone", "three", "auto"])
def test_every_call_the_engine_makes_is_made_on_the_real_model_and_rows_are_the_replays(trace, method, batch):
    p = profile(CHEAP)
    forced, real = forced_replay(trace, p)
    plan = {"alone": lambda: forced.chain(ChainChoice(("target",), ())), "three": lambda: forced.chain(THREE),
            "auto": forced.router("suffix").session}[method]
    run = serve(forced, plan, batch)  # SimulationError unless every request committed its recorded answer
    assert run.complete and run.tokens == copies_for(batch, 5) * sum(len(r.answer) for r in trace.requests)
    for m in forced.models:
        assert m.calls == real[m.name].calls  # one for one, in order: the same sequences, positions, ids, rows
        assert m.live_sequences == real[m.name].live_sequences == 0
    target_calls = real["target"].calls
    if batch > 1:
        assert any(c[0] == "batch" and len(c[1]) > 1 for c in target_calls)
    if method != "alone":
        assert any(c[0] == "remove" for c in target_calls)  # rejected proposals rolled back


@pytest.mark.parametrize("method", ["alone", "three", "auto"])
def test_on_the_machine_its_profile_describes_a_forced_run_is_the_simulated_run(trace, method):
    # The real models cost what the profile says, on the forced run's clock: each request's
    # cycles, choices and seconds are the simulator's (which prices every token fed).
    p = profile(CHEAP)
    forced, _ = forced_replay(trace, p)
    simulated = Replay(trace, p, price_prompt=True)
    runs = []
    for replay in (forced, simulated):
        make = {"alone": lambda: replay.chain(ChainChoice(("target",), ())), "three": lambda: replay.chain(THREE),
                "auto": lambda: replay.router("suffix")}[method]
        method_obj = make()
        out = []
        for i in range(len(trace.requests)):
            prompt, answer = replay.play(i)
            start = replay.clock()
            r = generate(method_obj, prompt, SamplingParams(), trace.max_tokens, clock=replay.clock)
            assert r.token_ids == answer
            out.append((labels(r), replay.clock() - start))
        runs.append(out)
    assert [c for c, _ in runs[0]] == [c for c, _ in runs[1]]
    assert [s for _, s in runs[0]] == pytest.approx([s for _, s in runs[1]], rel=1e-12)
    if method == "auto":
        assert {tuple(chain) for choices, _ in runs[0] for chain, _ in choices} > {("target",)}


def test_compare_measures_each_role_and_predicts_the_same_steps_when_a_run_is_cut(trace):
    p = profile(CHEAP)
    real = {m: Recording(m, p) for m in ("target", "draft")}
    clock = lambda: sum(m.simulated_seconds for m in real.values())  # noqa: E731
    chains = [ChainChoice(("draft", "target"), (3,)), THREE]
    saved = []
    whole = compare(trace, p, real, batches=(1, 3), chains=chains, clock=clock,
                    done=lambda c: saved.append(len(c.runs)))
    assert [(r.batch, r.role) for r in whole.runs] == [(b, role) for b in (1, 3) for role in
                                                       (ALONE, "best 2-level", "best 3-level", AUTO)]
    assert saved == list(range(1, 9))
    for r in whole.runs:
        assert r.measured.complete and r.measured.tokens == r.predicted.tokens
        if r.role != AUTO:  # auto chooses from its own timings, on either side the same here
            assert (r.measured.cycles, r.measured.steps) == (r.predicted.cycles, r.predicted.steps)
        assert r.ratio == pytest.approx(1.0, rel=1e-9)
    assert whole.runs[1].method == "draft -> target [3]" and whole.runs[2].method == THREE.label
    cut = compare(trace, p, real, batches=(3,), chains=chains, clock=clock, time_limit=0.5, warmup_steps=1)
    for r in cut.runs:
        assert not r.measured.complete and r.measured.steps == r.predicted.steps > 0
        assert r.measured.tokens == r.predicted.tokens > 0 and r.ratio == pytest.approx(1.0, rel=1e-9)
        assert r.measured.seconds >= 0.5
    data = cut.as_dict()
    assert data["runs"][0]["complete"] is False and data["runs"][0]["ratio"] == 1.0
    assert set(data["prediction"]["best"]["3"]) == {"best 2-level", "best 3-level"}


def test_the_real_model_is_fed_original_ids_and_off_the_record_gets_the_replays_off_row(trace):
    p = profile(CHEAP)
    forced, real = forced_replay(trace, p)
    model = forced.target
    vocabulary = model.replay.vocabulary
    assert model.real_ids[: len(vocabulary.ids)] == [t % WIDTH for t in vocabulary.ids]
    assert model.real_ids[vocabulary.off] == FILLER and model.n_vocab == WIDTH
    prompt, answer = model.play(0)
    seq = model.new_sequence()
    rows = model.decode(seq, prompt + [vocabulary.off], 0, 2)
    assert real["target"].calls[-1] == ("decode", seq, [model.real_ids[t] for t in prompt] + [FILLER],
                                        0, 2)
    assert [int(np.argmax(r)) for r in rows] == [answer[0], vocabulary.off]
    # The replay's probability at this width: its logit shifted by log((40 - 1) / (n - 1)).
    n = model.replay.n_vocab
    assert rows[1].max() == pytest.approx(10.0 + math.log(39 / (n - 1)), rel=1e-12)
    off_row = model.replay.logits_for(prompt + [vocabulary.off])
    assert NUMPY.confidence(rows[1]) == pytest.approx(NUMPY.confidence(off_row), rel=1e-12)
    model.remove(seq, len(prompt))
    assert real["target"].calls[-1] == ("remove", seq, len(prompt))
    other = model.new_sequence()
    assert model.share_prefix(seq, other, len(prompt) - 1)
    assert model.kv_tokens(other) == prompt[:-1] == real["target"].kv_tokens(other)
    row = model.decode(other, prompt[-1:], len(prompt) - 1, 1)
    assert int(np.argmax(row[0])) == answer[0]
    with pytest.raises(BackendError, match="decode at position 3 but sequence"):
        model.decode(seq, [0], 3, 1)
    model.play(None)


def test_a_failing_real_call_leaves_the_mirror_as_it_was_and_a_narrow_model_is_refused(trace):
    p = profile(CHEAP)
    forced, real = forced_replay(trace, p)
    model = forced.target
    prompt, _ = model.play(0)
    seq = model.new_sequence()
    real["target"].n_ctx = len(prompt) - 1  # the synthetic model overflows
    with pytest.raises(AssertionError, match="context overflow"):
        model.decode(seq, prompt, 0, 1)
    assert model.kv_tokens(seq) == []
    with pytest.raises(InvalidParameterError, match="do not fit the rows"):
        ForcedBackend(SyntheticBackend("narrow", vocab=8), model.replay)


def test_a_measured_profile_times_the_models_it_is_given(trace):
    p = profile(CHEAP)
    real = Recording("target", p)
    measured = measure_profile([real], batches=(1, 2), repeats=1, batch_ns=(1, 2))
    assert set(measured.tables) == {"target"} and set(measured.batch_tables["target"]) == {2}
    assert max(measured.tables["target"]) == 512


class Checked(ForcedBackend):
    """A forced model that checks after every call that its real model's cache holds as many
    positions as the replay's mirror (rollbacks included)."""

    def decode_batch(self, items):
        out = super().decode_batch(items)
        assert all(self.real.kv_length(seq) == len(self.kv_tokens(seq)) for seq, *_ in items)
        return out

    def decode(self, seq, tokens, pos, n_logits):
        return self.decode_batch([(seq, tokens, pos, n_logits)])[0]


@pytest.mark.parametrize(("method", "batch"), [("three", 3), ("auto", 2)])
def test_tiny_torch_models_run_every_forward_of_a_forced_batch(trace, method, batch):
    pytest.importorskip("torch")
    from tests.unit.tiny_torch import host_backend

    p = profile(CHEAP)
    real = {"target": host_backend(3, "target", vocab=26), "draft": host_backend(4, "draft", vocab=26)}
    forced = ForcedReplay(trace, p, real)
    forced.target = Checked(real["target"], forced.target.replay)
    forced.drafts = [Checked(real["draft"], forced.drafts[0].replay)]
    forced.models = [*forced.drafts, forced.target]
    plan = forced.router("suffix").session if method == "auto" else (lambda: forced.chain(THREE))
    run = serve(forced, plan, batch)
    assert run.complete and run.tokens == copies_for(batch, 5) * sum(len(r.answer) for r in trace.requests)
    assert run.drafted_cycles > 0 and all(m.live_sequences == 0 for m in forced.models)


def test_a_trace_cut_to_n_requests_takes_them_in_turn_from_each_group(trace):
    groups = {r.id: r.group for r in trace.requests}
    assert [r.id for r in trace.requests] == ["p0", "p1", "p2", "p3", "p4"]
    assert [r.id for r in trace.take(3).requests] == ["p0", "p1", "p2"]  # even, odd, even
    assert [groups[r.id] for r in trace.take(2).requests] == ["even", "odd"]
    assert trace.take(9).requests == trace.requests and trace.take(0).requests == []


def test_the_device_script_runs_every_role_at_every_batch_on_tiny_models(tmp_path):
    """scripts/forced_run.py as a device check runs it, cut down to tiny models on the CPU,
    one request of the committed first-turn trace, each run cut at 1 second."""
    pytest.importorskip("torch")
    import json
    from pathlib import Path

    from tests.unit.backends.test_torch import run_script

    out = tmp_path / "forced.json"
    trace = Path(__file__).resolve().parents[3] / "benchmarks/results/simulation-2026-12-03-epyc-trace.json"
    run_script("forced_run", [str(trace), "--device", "cpu", "--dtype", "float32", "--tiny", "--requests", "1",
                              "--batches", "1,2", "--time-limit", "1", "--repeats", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["settings"]["requests"] == 1 and set(result["profile"]["models"]) == {"qwen2.5-coder-1.5b",
                                                                                       "qwen2.5-coder-0.5b"}
    assert [(r["batch"], r["role"]) for r in result["runs"]] == [(b, role) for b in (1, 2) for role in
                                                                 (ALONE, "best 2-level", "best 3-level", AUTO)]
    for r in result["runs"]:
        assert r["measured"]["tokens"] > 0 and r["measured"]["ms_per_token"] > 0 and r["ratio"] > 0
        assert r["complete"] or r["measured"]["steps"] == r["predicted"]["steps"]
