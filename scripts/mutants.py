"""Mutation check of the exactness tests: deliberate cascade bugs, one at a time, each caught.

Each mutant is a small edit of the package (the bugs public cascades have shipped, the subtle
ones an audit of this suite found, and bugs in request features: logprobs, stop strings,
choices, the memory's scope, penalties, grammars, exact mode). For each, the package is
copied to a temporary folder, the edit applied (it must match exactly once: a mutant that no
longer applies is an error, not a pass), and the exactness suite run against the copy:

- the fast tier (`pytest -m "not real and not slow"` over EXACTNESS_TESTS) for every mutant
  but the `real` ones;
- also the slow tier (`-m slow` over SLOW_TESTS) for the mutants marked `slow`: a bug too rare
  for the fast tier (the 5% mixture of full-p resampling is the slow tier's power calibration);
- only the real tier (`-m real` over REAL_TESTS, the pulled models) for the mutants marked
  `real`: a bug in how llama.cpp's kernels are driven, which synthetic models cannot show
  (without the pulled models its test skips, which counts as a failure: `--tiers fast slow`).

A control mutant (`lossless`) changes the cascade in a way that keeps it exact (a draft may
propose from any q, as long as the q it hands up is the one it sampled from): the suite must
pass it, or the tests reject correct cascades.

The script prints a markdown table (mutant, the test that caught it in each tier, seconds) and
exits 0 only when every mutant is caught by every tier it must be caught by, the controls pass,
and the unmutated package passes every tier it ran. It takes about 25 minutes on 2 idle cores
(a third of it the unmutated slow tier); CI does not run it.

    python scripts/mutants.py [--only NAME ...] [--tiers fast slow real] [--out docs/mutants.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from specrouter.router.estimates.profiler import cpu_model

ROOT = Path(__file__).resolve().parent.parent
#: The exact block laws, the long-horizon laws and the rejection-path sentinel.
LAW_TESTS = ["tests/unit/cascade/test_block_closed_form.py", "tests/unit/cascade/test_chain_law.py",
             "tests/unit/cascade/test_rejection_power.py"]
#: Quick files first: pytest runs them in this order, and a mutant's run stops at its first failure.
EXACTNESS_TESTS = [
    "tests/unit/cascade/test_verify.py",
    "tests/unit/test_state.py",
    "tests/unit/engine/test_generate.py",
    "tests/unit/engine/test_stops.py",
    "tests/unit/drafters/test_ngram.py",
    "tests/unit/drafters/test_memory.py",
    "tests/unit/router/test_draft_stop.py",
    "tests/unit/engine/test_batch.py",
    "tests/unit/cascade/test_penalties.py",
    "tests/unit/cascade/test_logprobs.py",
    "tests/unit/cascade/test_grammar.py",
    "tests/unit/server/test_memory_api.py",
    *LAW_TESTS,
    "tests/unit/cascade/test_sampling_exactness.py",
    "tests/unit/cascade/test_torch_rows.py",
    "tests/unit/cascade/test_device_rows.py",
]
#: The slow tier's long-horizon laws and its sentinel (the 3-token joint tests of
#: test_sampling_exactness.py and the batched one are weaker, and would add 4 minutes).
SLOW_TESTS = [*LAW_TESTS, "tests/unit/cascade/test_device_rows.py"]
#: The real tier: exact mode's padding on the pulled target, under a minute (the whole real
#: suite would take twenty).
REAL_TESTS = ["tests/real/test_exact_padding_real.py"]
TIERS = ("fast", "slow", "real")


@dataclass(frozen=True)
class Edit:
    file: str  # under the repository root
    old: str  # must occur exactly once
    new: str


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str
    edits: tuple[Edit, ...]
    #: Tiers that must catch it: every mutant the fast tier; `slow` ones the slow tier too.
    slow: bool = False
    #: A control: an edit that keeps the output exact, which no test may fail.
    lossless: bool = False
    #: Caught by the real tier only (how llama.cpp's kernels are driven: no synthetic model shows it).
    real: bool = False

    @property
    def tiers(self) -> tuple[str, ...]:
        """The tiers that must catch it (a control: the fast tier, which it must pass)."""
        return ("real",) if self.real else ("fast", "slow") if self.slow else ("fast",)


VERIFY, CHAIN = "specrouter/cascade/verify.py", "specrouter/cascade/chain.py"
TORCH_ROWS, NUMPY_ROWS = "specrouter/ops/rows_torch.py", "specrouter/ops/rows_numpy.py"
DRAFTER = "specrouter/cascade/model_drafter.py"
REQUEST, BATCH = "specrouter/engine/request.py", "specrouter/engine/batch.py"
TEXT, REQUESTS = "specrouter/engine/text.py", "specrouter/engine/requests.py"
PENALTIES, GRAMMAR = "specrouter/cascade/penalties.py", "specrouter/cascade/grammar.py"
LLAMACPP = "specrouter/backends/llamacpp.py"
UNWARPED = "ops_of(row).warp([row], SamplingParams(temperature=1.0))[0]"

MUTANTS = [
    Mutant("residual-full-p", "after a rejection, sample from the full p instead of the residual (a published cascade)",
           (Edit(VERIFY, "return i, sample(residual_fn(p, q_row, token), rng)", "return i, sample(p, rng)"),)),
    Mutant("residual-5pct-full-p", "5% of rejections sample from the full p instead of the residual",
           (Edit(VERIFY, "from specrouter.cascade.sampling import sample\n",
                 "from specrouter.cascade.sampling import sample\n_MUTANT = np.random.default_rng(12345)\n"),
            Edit(VERIFY, "return i, sample(residual_fn(p, q_row, token), rng)",
                 "return i, sample(p if _MUTANT.random() < 0.05 else residual_fn(p, q_row, token), rng)")),
           slow=True),
    Mutant("inverted-ratio", "accept with min(1, q/p) instead of min(1, p/q)",
           (Edit(VERIFY, "rng.random() * q_x < p_x", "rng.random() * p_x < q_x"),)),
    Mutant("argmax-acceptance", "under sampling, accept only the verifier's argmax (several engines)",
           (Edit(VERIFY, "if q_x > 0 and rng.random() * q_x < p_x:",
                 "if q_x > 0 and rng.random() >= 0 and token == int(np.argmax(p)):"),)),
    Mutant("bonus-wrong-row", "the bonus token sampled from the verifier's row n - 1 instead of n",
           (Edit(VERIFY, "sample(verifier_probs[len(proposals)], rng)",
                 "sample(verifier_probs[len(proposals) - 1], rng)"),)),
    Mutant("deterministic-residual-keeps-x", "an n-gram draft's residual keeps the rejected token",
           (Edit(NUMPY_ROWS, "r[proposed] = 0.0", "r[proposed] = r[proposed]"),)),
    Mutant("padded-residual-truncated", "the residual drops the verifier's mass beyond the draft's vocabulary",
           (Edit(NUMPY_ROWS, "n = max(p.shape[0], q.shape[0])\n        r = _pad(p, n) - _pad(q, n)",
                 "n = min(p.shape[0], q.shape[0])\n        r = _pad(p[:n], n) - _pad(q[:n], n)"),)),
    Mutant("greedy-bonus-wrong-row", "greedy: after a fully accepted draft, the argmax of the row before",
           (Edit(VERIFY, "return len(proposals), int(verifier_argmax[len(proposals)])",
                 "return len(proposals), int(verifier_argmax[len(proposals) - 1])"),)),
    Mutant("q-passed-upward", "a level hands its proposer's q upward for accepted tokens instead of its own p",
           (Edit(CHAIN, "return proposals[:n_acc] + [nxt], p[: n_acc + 1]",
                 "return proposals[:n_acc] + [nxt], (list(q[:n_acc]) if q else p[:n_acc]) + p[n_acc : n_acc + 1]"),)),
    Mutant("residual-passed-upward", "a level hands the residual upward for its corrected token instead of its p",
           (Edit(CHAIN, "return proposals[:n_acc] + [nxt], p[: n_acc + 1]",
                 "return proposals[:n_acc] + [nxt], p[:n_acc] + [residual(p[n_acc], q[n_acc] if q else None, "
                 "proposals[n_acc]) if not self.params.greedy and n_acc < len(proposals) else p[n_acc]]"),)),
    Mutant("unwarped-verifier", "verifying levels score with the unwarped softmax (temperature, top-k, top-p skipped)",
           (Edit(CHAIN, "p = self._dists(rows)",
                 f"p = self._dists(rows) if self.params.greedy or i == 0 else [{UNWARPED} for row in rows]"),)),
    Mutant("unwarped-draft", "the drafting model samples from its unwarped softmax but hands up its warped q",
           (Edit(CHAIN, "token = d if self.params.greedy else sample(d, self.rng)",
                 f"token = d if self.params.greedy else sample({UNWARPED}, self.rng)"),)),
    Mutant("draft-unwarped-consistently", "control: the draft samples from and hands up its unwarped softmax "
           "(another q, verified exactly: lossless)",
           (Edit(CHAIN, "d = self._dist(row)\n", f"d = self._dist(row) if self.params.greedy else {UNWARPED}\n"),),
           lossless=True),
    Mutant("residual-on-unwarped-p", "the residual is taken from the verifier's unwarped softmax",
           (Edit(CHAIN, "n_acc, nxt = verify_sampled(proposals, q, p, self.rng, self._residual)",
                 "n_acc, nxt = verify_sampled(proposals, q, p, self.rng, lambda pp, qq, x: self._residual("
                 f"{UNWARPED.replace('row', 'rows[next(j for j, r in enumerate(p) if r is pp)]')}, qq, x))"),)),
    Mutant("stop-after-seeing-token", "a draft stop decided on the token just drawn, which is then dropped",
           (Edit(DRAFTER, "            tokens.append(token)\n            dists.append(dist)\n",
                 "            if policy is not None and not policy.more([*confidences, conf]):\n"
                 "                return Draft(tokens, dists, confidences=tuple(confidences), stopped=True)\n"
                 "            tokens.append(token)\n            dists.append(dist)\n"),)),
    Mutant("intermediate-stops-after-correction", "control: a middle level ends its proposal after its first "
           "correction (decided by tokens already drawn: lossless)",
           (Edit(CHAIN, "            out += tokens\n            dists += d\n",
                 "            out += tokens\n            dists += d\n            if len(tokens) <= below:\n"
                 "                break\n"),), lossless=True),
    Mutant("no-rollback-after-commit", "rejected positions stay cached until the model is next used",
           (Edit("specrouter/engine/request.py", "        self.context += new\n        self.state.rollback_to(self.context)\n",
                 "        self.context += new\n"),)),
    Mutant("prepare-keeps-mismatch", "catch-up keeps the first mismatching cached token",
           (Edit("specrouter/state.py", "return min(common_prefix(cached, tokens), len(tokens) - n_logits)",
                 "return min(common_prefix(cached, tokens) + 1, len(cached), len(tokens) - n_logits)"),)),
    Mutant("penalties-committed-only", "a row's penalties count the committed text only, not the tokens drafted "
           "before it in its block",
           (Edit("specrouter/cascade/penalties.py", "extra = prefix[self.committed:]", "extra = ()"),)),
    Mutant("grammar-committed-only", "a row is restricted by the grammar after the committed output only, not the "
           "tokens drafted before it",
           (Edit("specrouter/cascade/chain.py",
                 "rows = self.constraint.restrict(rows, tokens[self.committed:], first - self.committed)",
                 "rows = [self.constraint.restrict([row], [], 0)[0] for row in rows]"),)),
    Mutant("grammar-draft-uncut", "a model-free draft is verified whole, past its first token outside the grammar",
           (Edit("specrouter/cascade/chain.py",
                 "draft = draft.cut(self.constraint.valid_prefix(context[self.committed:], draft.tokens))",
                 "draft = draft"),)),
    Mutant("batch-logits-swapped", "a batched call hands each sequence another sequence's logits",
           (Edit("specrouter/engine/batch.py", "in zip(group, outputs):", "in zip(group, outputs[::-1]):"),)),
    Mutant("torch-residual-keeps-x", "rows on a device: an n-gram draft's residual keeps the rejected token",
           (Edit(TORCH_ROWS, "r[token] = 0.0", "r[token] = r[token]"),)),
    Mutant("torch-top-p-one-short", "rows on a device: top-p keeps one token fewer than the smallest set reaching top_p",
           (Edit(TORCH_ROWS, "cut = (cumulative < top_p - TOP_P_MARGIN).sum(dim=-1, keepdim=True) + 1",
                 "cut = (cumulative < top_p - TOP_P_MARGIN).sum(dim=-1, keepdim=True).clamp(min=1)"),)),
    Mutant("torch-acceptance-wrong-row", "rows on a device: the acceptance test reads p(x) of the next position's row",
           (Edit(TORCH_ROWS, "for row, t, ok in zip(rows, tokens, inside)])",
                 "for row, t, ok in zip(rows[1:] + rows[:1], tokens, inside)])"),), slow=True),
    Mutant("top-p-one-short", "top-p keeps one token fewer than the smallest set reaching top_p",
           (Edit(NUMPY_ROWS, "cut = int(cumulative.searchsorted(top_p - TOP_P_MARGIN)) + 1",
                 "cut = max(1, int(cumulative.searchsorted(top_p - TOP_P_MARGIN)))"),)),
    # Request features: logprobs, stop strings, choices, memory scope, penalties, grammar, exact mode.
    Mutant("logprobs-before-penalties", "logprob entries from the target's rows before the bias, the penalties and "
           "the grammar's mask",
           (Edit(CHAIN, "        rows = self._processed(rows, context + proposals)\n",
                 "        raw, rows = rows, self._processed(rows, context + proposals)\n"),
            Edit(CHAIN, "self.emitted = emitted_logprobs(host(rows),", "self.emitted = emitted_logprobs(host(raw),"))),
    Mutant("stop-entry-after-check", "the logprob entry of the token that completes a stop string is appended after "
           "the stop check (a kept token without its entry)",
           (Edit(REQUEST, "            if entries:\n                self._logprobs.append(entries[j])\n"
                          "            if self._text.add(token):\n"
                          "                self.finish_reason, self.finished = \"stop\", True\n"
                          "                return \"\"\n",
                 "            if self._text.add(token):\n"
                 "                self.finish_reason, self.finished = \"stop\", True\n"
                 "                return \"\"\n"
                 "            if entries:\n                self._logprobs.append(entries[j])\n"),)),
    Mutant("stop-window-shortest", "the text searched for stop strings is sized by the shortest stop string, not "
           "the longest",
           (Edit(TEXT, "before - max(len(s) for s in self._stop) + 1",
                 "before - min(len(s) for s in self._stop) + 1"),)),
    Mutant("stop-first-listed", "two stop strings completing in one token: the text is cut at the first listed, "
           "not the earliest",
           (Edit(TEXT, "            cut = min(hits)\n", "            cut = hits[0]\n"),)),
    Mutant("stop-holdback-first-only", "a stream holds back a tail that may become the first stop string only",
           (Edit(TEXT, "        for s in self._stop:\n            for n in range(",
                 "        for s in self._stop[:1]:\n            for n in range("),)),
    Mutant("choice-seed-plus-index", "choice i of a request with seed s draws from the stream of seed s + i",
           (Edit(REQUESTS, "np.random.default_rng(seed if self.choice == 0 else [seed, self.choice])",
                 "np.random.default_rng(seed + self.choice)"),)),
    Mutant("keyed-memory-reads-shared", "a request scoped to an API key drafts from the memory's shared partition "
           "(and writes its key's)",
           (Edit("specrouter/router/session.py", "self.lookup_drafter.with_memory(memory, scope)",
                 "self.lookup_drafter.with_memory(memory, MemoryScope())"),)),
    Mutant("memory-lookup-shared-scope", "the suffix drafter asks the memory in the shared partition, whatever its "
           "request's key",
           (Edit("specrouter/drafters/suffix.py", "recalled = self.memory.propose(context, n, self.scope)",
                 "recalled = self.memory.propose(context, n, MemoryScope())"),)),
    Mutant("penalties-bias-after-repetition", "the logit bias is added after the repetition penalty (vLLM's order "
           "is bias first)",
           (Edit(PENALTIES, "        values = out[seen]\n",
                 "        values, biased = np.asarray(row)[seen], out[seen] - np.asarray(row)[seen]\n"),
            Edit(PENALTIES, "out[seen] = np.where(values > 0, values / r, values * r)",
                 "out[seen] = np.where(values > 0, values / r, values * r) + biased"))),
    Mutant("penalties-presence-per-occurrence", "the presence penalty is charged per occurrence, as the frequency "
           "penalty",
           (Edit(PENALTIES, "(params.frequency_penalty * n[keep] + params.presence_penalty)",
                 "((params.frequency_penalty + params.presence_penalty) * n[keep])"),)),
    Mutant("grammar-end-anywhere", "the grammar allows the end of generation after every prefix, not only after a "
           "whole sentence",
           (Edit(GRAMMAR, "        if self._end < len(bits) * 8 and (bits[self._end // 8] >> (self._end % 8)) & 1:\n",
                 "        if True:\n"),)),
    Mutant("exact-catchup-unpadded", "exact mode: a call with a catch-up head is not padded to a multiple of 4 rows",
           (Edit(LLAMACPP, "pad = -len(tokens) % EXACT_ROWS if self.exact else 0",
                 "pad = -len(tokens) % EXACT_ROWS if self.exact and len(tokens) == n_logits else 0"),), real=True),
    Mutant("exact-logit-rows-unpadded", "exact mode: in a call with a catch-up head, the rows with logits are not a "
           "multiple of 4",
           (Edit(LLAMACPP, "before = (len(tokens) - n_logits) % EXACT_ROWS if self.exact else 0",
                 "before = (len(tokens) - n_logits) % EXACT_ROWS if self.exact and len(tokens) == n_logits else 0"),),
           real=True),
]


def copy_repo(dest: Path) -> None:
    for name in ("specrouter", "tests"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")


def apply(dest: Path, mutant: Mutant) -> None:
    for edit in mutant.edits:
        path = dest / edit.file
        text = path.read_text()
        count = text.count(edit.old)
        if count != 1:
            raise SystemExit(f"mutant {mutant.name}: {edit.file} has the text to change {count} times, not once")
        path.write_text(text.replace(edit.old, edit.new))


#: Per tier: its test files, its marker, and whether its tests run in parallel (the real ones
#: use both cores each, and must find the pulled models where the user keeps them).
TIER_RUNS = {
    "fast": (EXACTNESS_TESTS, "not real and not slow", True),
    "slow": (SLOW_TESTS, "slow", True),
    "real": (REAL_TESTS, "real", False),
}


def run_tier(dest: Path, tier: str, workers: int, stop_at_first: bool = False) -> tuple[list[str], float, int]:
    """Failed test ids, seconds, and how many tests ran; `stop_at_first`: the run ends at the
    first failure (pytest --maxfail=1), which is all a mutant needs. A skipped test counts as
    failed (a real test skips without the pulled models: it then checks nothing)."""
    paths, marker, parallel = TIER_RUNS[tier]
    report = dest / f"report-{tier}.xml"
    env = {**os.environ, "PYTHONPATH": str(dest), "PYTHONDONTWRITEBYTECODE": "1"}
    if tier != "real":  # the real tests' private cache links the user's models (tests/conftest.py)
        env["SPECROUTER_CACHE"] = str(dest / "cache")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marker, f"--junitxml={report}",
           *(["-n", str(workers)] if workers > 1 and parallel else []), *(["--maxfail=1"] if stop_at_first else []),
           *paths]
    start = time.perf_counter()
    subprocess.run(cmd, cwd=dest, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    if not report.exists():
        return ["<pytest did not run: collection error>"], seconds, 0
    failed, total = [], 0
    for case in ET.parse(report).getroot().iter("testcase"):
        total += 1
        if case.find("failure") is not None or case.find("error") is not None or case.find("skipped") is not None:
            failed.append(f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}")
    report.unlink()
    return failed, seconds, total


def check_imports_copy(dest: Path) -> None:
    """specrouter is a namespace package installed in editable mode: PYTHONPATH must put the copy first."""
    env = {**os.environ, "PYTHONPATH": str(dest)}
    where = subprocess.run([sys.executable, "-c", "import specrouter.state as m; print(m.__file__)"], cwd=dest, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    if not where.startswith(str(dest)):
        raise SystemExit(f"the tests would import {where}, not the mutated copy in {dest}")


def summary(failed: list[str], limit: int = 3) -> str:
    if not failed:
        return "**not caught**"
    shown = ", ".join(f"`{f}`" for f in failed[:limit])
    return shown + (f" (+{len(failed) - limit})" if len(failed) > limit else "")


def run_mutant(tmp: Path, mutant: Mutant, tiers: tuple[str, ...], workers: int) -> tuple[list[str], bool]:
    """The table cells of one mutant (one per tier of TIERS) and whether it did what it must:
    caught by every tier it must be caught by (a control: passed the fast tier)."""
    dest = tmp / mutant.name
    copy_repo(dest)
    apply(dest, mutant)
    must = ("fast",) if mutant.lossless else mutant.tiers
    cells, ok = [], True
    for tier in TIERS:
        if tier not in must:
            cells.append("(control: fast tier)" if mutant.lossless else "(synthetic: cannot show it)"
                         if mutant.real else "(fast tier suffices)" if tier == "slow" else "")
            continue
        if tier not in tiers:
            cells.append("not run")
            ok = False
            continue
        failed, seconds, _ = run_tier(dest, tier, workers, stop_at_first=not mutant.lossless)
        ok &= bool(failed) != mutant.lossless
        shown = ("passes, as it must" if not failed else "**failed a lossless control:** " + summary(failed)) \
            if mutant.lossless else summary(failed)
        cells.append(f"{shown} ({seconds:.0f} s)")
    shutil.rmtree(dest)
    return cells, ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="run only these mutants (by name)")
    ap.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (default 2)")
    ap.add_argument("--out", type=Path, help="also write the markdown table to this file")
    ap.add_argument("--tiers", nargs="+", choices=TIERS, default=list(TIERS),
                    help="the tiers to run (default all; a mutant a missing tier must catch is not run: exits 1)")
    ap.add_argument("--fast-only", action="store_true", help="the fast tier only (--tiers fast: a quick look)")
    args = ap.parse_args()
    tiers = ("fast",) if args.fast_only else tuple(t for t in TIERS if t in args.tiers)
    mutants = [m for m in MUTANTS if not args.only or m.name in args.only]
    unknown = sorted(set(args.only or ()) - {m.name for m in MUTANTS})
    if unknown:
        raise SystemExit(f"no such mutants: {unknown}")
    rows, baseline, ok = [], [], True
    with tempfile.TemporaryDirectory(prefix="specrouter-mutants-") as tmp:
        base = Path(tmp) / "clean"
        copy_repo(base)
        check_imports_copy(base)
        for tier in (t for t in tiers if any(t in m.tiers for m in mutants)):  # the tiers its mutants need
            failed, seconds, total = run_tier(base, tier, args.workers)
            baseline.append(f"{tier} tier {total} tests in {seconds:.0f} s")
            print(f"unmutated, {tier} tier: {total} tests, {len(failed)} failed, {seconds:.0f} s", flush=True)
            if failed or not total:
                print("  the unmutated package must pass: " + ", ".join(failed))
                return 1
        for mutant in mutants:
            cells, caught = run_mutant(Path(tmp), mutant, tiers, args.workers)
            ok &= caught
            rows.append(f"| `{mutant.name}` | {mutant.what} | " + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
    table = "\n".join([
        f"# Mutation check of the exactness tests ({datetime.date.today()}, {cpu_model()}, {os.cpu_count()} cores)",
        "",
        f"Command: `python scripts/mutants.py{' --only ' + ' '.join(args.only) if args.only else ''}"
        f"{' --tiers ' + ' '.join(tiers) if tiers != TIERS else ''}`. "
        "Fast tier: `pytest -m \"not real and not slow\"` over " + ", ".join(EXACTNESS_TESTS) +
        ". Slow tier: `pytest -m slow` over " + ", ".join(SLOW_TESTS) + ". Real tier (the pulled models, one "
        "worker): `pytest -m real` over " + ", ".join(REAL_TESTS) + ". A cell lists the first failing test "
        "(the run stops there: `--maxfail=1`, 2 workers, so another may be listed too) and the seconds to it; "
        "a control runs its tier in full. The unmutated package passed the " + " and the ".join(baseline) + ".",
        "",
        "| mutant | the bug | fast tier | slow tier | real tier |",
        "|---|---|---|---|---|",
        *rows,
        "",
        "Every mutant caught, every control passed." if ok else "SOME MUTANT WAS NOT CAUGHT, OR A CONTROL FAILED.",
    ])
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
