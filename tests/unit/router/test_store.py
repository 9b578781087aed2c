"""Learned state merged, not overwritten: the estimates file pools what every process learned
(router/estimates/learned.py), under an inter-process lock, written atomically; profile tables are
replaced whole, atomically (router/estimates/persist.py)."""

import json
import multiprocessing
import time

import pytest

from specrouter.router.estimates.acceptance import AcceptanceEstimator
from specrouter.router.config import DEFAULT_CONFIG
from specrouter.router.estimates.learned import PairEstimate, read_estimates
from specrouter.router.estimates.profile_cache import _write

PERSIST_CAP = DEFAULT_CONFIG.persist_cap

SEEDED = {"format": 2, "estimates": {"greedy|small|target": [0.5, 8]}}


def on_disk(file):
    return json.loads(file.read_text())["estimates"]


def loaded(file):
    estimator = AcceptanceEstimator()
    estimator.load(file)
    estimator.start_request(greedy=True)
    return estimator


@pytest.mark.parametrize("order", ["a first", "b first"])
def test_two_estimators_that_loaded_one_file_both_keep_what_they_learned(tmp_path, order):
    file = tmp_path / "acceptance.json"
    file.write_text(json.dumps(SEEDED))
    a, b = loaded(file), loaded(file)
    a.observe_scores("small", "target", [1.0, 1.0, 1.0, 1.0])
    a.observe_scores("mid", "target", [1.0, 1.0, 0.0, 1.0])
    b.observe_scores("small", "target", [0.0, 0.0, 0.0, 0.0])
    b.observe_scores("ngram#4", "target", [0.25, 0.75])
    for estimator in (a, b) if order == "a first" else (b, a):
        estimator.save(file)
    # The common pair: the 8 loaded scores (mean 0.5), a's 4 ones and b's 4 zeros, each once.
    assert on_disk(file) == {"greedy|small|target": [0.5, 16.0], "greedy|mid|target": [0.75, 4.0],
                             "greedy|ngram#4|target": [0.5, 2.0]}


def test_a_second_save_adds_only_what_was_observed_since_the_first(tmp_path):
    file = tmp_path / "acceptance.json"
    file.write_text(json.dumps(SEEDED))
    a = loaded(file)
    a.observe_scores("small", "target", [1.0, 1.0, 1.0, 1.0])
    a.save(file)
    a.save(file)  # nothing new: the file stays
    assert on_disk(file) == {"greedy|small|target": [(0.5 * 8 + 4) / 12, 12.0]}
    a.observe_scores("small", "target", [0.0, 0.0, 0.0, 0.0])
    a.save(file)
    assert on_disk(file) == {"greedy|small|target": [0.5, 16.0]}


def test_a_merged_count_is_capped_and_the_cap_weighs_the_file_as_that_many_scores(tmp_path):
    file = tmp_path / "acceptance.json"
    file.write_text(json.dumps({"format": 2, "estimates": {"greedy|small|target": [0.5, 600]}}))
    a = loaded(file)
    a.observe_scores("small", "target", [1.0] * 200)
    a.save(file)
    assert on_disk(file) == {"greedy|small|target": [0.75, PERSIST_CAP]}  # (0.5 * 200 + 200) / 400


def test_what_was_seeded_from_a_fleet_is_not_merged_as_learned(tmp_path):
    file = tmp_path / "acceptance.json"
    file.write_text(json.dumps(SEEDED))
    a = loaded(file)
    a.seed([PairEstimate("greedy", "mid", "target", 0.9, 50)])
    a.observe_scores("small", "target", [0.0] * 8)
    a.save(file)
    assert on_disk(file) == {"greedy|small|target": [0.25, 16.0]}


@pytest.mark.parametrize("text", ["{broken", "[1, 2]", '{"format": 1, "estimates": {"greedy|small|target": [0.9, 9]}}',
                                  '{"format": 2, "estimates": {"greedy|small": [0.9, 9]}}'])
def test_a_damaged_or_foreign_file_is_replaced_by_what_the_process_knows(tmp_path, text):
    file = tmp_path / "acceptance.json"
    file.write_text(json.dumps(SEEDED))
    a = loaded(file)
    a.observe_scores("small", "target", [1.0, 1.0, 1.0, 1.0])
    file.write_text(text)  # damaged after it was loaded
    a.save(file)
    # Its whole table: the loaded 8 scores at 0.5 and its own 4 ones (a plain mean while so few).
    assert on_disk(file) == {"greedy|small|target": [(0.5 * 8 + 4) / 12, 12.0]}


def test_a_folder_that_cannot_be_written_loses_the_estimates_without_an_error(tmp_path):
    (tmp_path / "not-a-folder").write_text("")
    file = tmp_path / "not-a-folder" / "acceptance.json"
    a = loaded(file)
    a.observe_scores("small", "target", [1.0])
    a.save(file)
    assert a.learned() == [PairEstimate("greedy", "small", "target", 1.0, 1.0)]  # kept: nothing was written


def test_save_then_load_round_trips(tmp_path):
    file = tmp_path / "profiles" / "acceptance.json"
    a = loaded(file)  # no file yet: the priors
    a.observe_scores("small", "target", [1.0, 0.0, 1.0, 1.0])
    a.start_request(greedy=False)
    a.observe_scores("ngram#4", "target", [0.5] * 300)
    a.save(file)
    expected = [PairEstimate("greedy", "small", "target", 0.75, 4.0),
                PairEstimate("sampled", "ngram#4", "target", 0.5, PERSIST_CAP)]
    assert read_estimates(file) == expected
    again = AcceptanceEstimator()
    again.load(file)
    assert sorted(again.snapshot(), key=lambda e: e.key) == expected and again.learned() == []


# Two real processes ---------------------------------------------------------------------
ROUNDS = 40


def _learn_and_save(file, me: int, start) -> None:
    """One process: ROUNDS times a fresh estimator that loads the file, observes its own pair,
    a pair of this round alone and the pair both processes share, and saves."""
    start.wait()
    for round_ in range(ROUNDS):
        estimator = loaded(file)
        estimator.observe_scores(f"own{me}", "target", [1.0])
        estimator.observe_scores(f"round{me}-{round_}", "target", [0.5, 0.5])
        estimator.observe_scores("shared", "target", [float(me)])
        estimator.save(file)


def _write_tables(file, me: int, start) -> None:
    start.wait()
    for _ in range(ROUNDS * 5):
        _write(file, {"format": 1, "writer": me, "table": {str(n): float(me + 1) for n in range(200)}})


def _run_two(target, file, check) -> None:
    """Runs target(file, 0) and target(file, 1) in two processes at once; `check` reads the
    file (without the lock, as a starting process does) until both ended."""
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(2)
    workers = [context.Process(target=target, args=(file, me, start)) for me in (0, 1)]
    for w in workers:
        w.start()
    reads = 0
    while any(w.is_alive() for w in workers):
        if file.exists():
            check(file.read_text())
            reads += 1
        time.sleep(0.001)
    for w in workers:
        w.join()
        assert w.exitcode == 0
    assert reads > 0


def test_two_processes_saving_at_once_lose_nothing_and_the_file_is_always_valid(tmp_path):
    file = tmp_path / "acceptance.json"

    def valid(text: str) -> None:
        assert json.loads(text)["format"] == 2

    _run_two(_learn_and_save, file, valid)
    estimates = on_disk(file)
    expected = {f"greedy|round{me}-{r}|target": [0.5, 2.0] for me in (0, 1) for r in range(ROUNDS)}
    expected.update({"greedy|own0|target": [1.0, ROUNDS], "greedy|own1|target": [1.0, ROUNDS]})
    shared = estimates.pop("greedy|shared|target")
    assert estimates == expected
    assert shared[1] == 2 * ROUNDS and shared[0] == pytest.approx(0.5, abs=1e-12)  # 40 zeros and 40 ones
    assert {p.name for p in tmp_path.iterdir()} - {"acceptance.json.lock"} == {"acceptance.json"}  # no temp file left


def test_two_processes_writing_one_profile_leave_one_whole_table(tmp_path):
    file = tmp_path / "target.json"
    tables = [{str(n): float(me + 1) for n in range(200)} for me in (0, 1)]

    def whole(text: str) -> None:
        assert json.loads(text)["table"] in tables

    _run_two(_write_tables, file, whole)
    whole(file.read_text())
    assert {p.name for p in tmp_path.iterdir()} - {"target.json.lock"} == {"target.json"}
