"""The draft-length sweep: every static method on a small grid of draft lengths, over a
few prompts, greedy, configurations interleaved per prompt; the fastest per method
(tokens over seconds, summed over the prompts) is what the main comparison runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tqdm import tqdm

from specrouter.cascade.sampling import SamplingParams

#: (prompt tokens, params, max new tokens) -> (run record, generated ids)
Runner = Callable[[list[int], SamplingParams, int], tuple[dict, list[int]]]


def sweep(factories: dict[str, Callable[[tuple[int, ...]], Runner]], grid: dict[str, Sequence[tuple[int, ...]]],
          prompts: Sequence[list[int]], max_tokens: int) -> tuple[list[dict], dict[str, tuple[int, ...]]]:
    """Rows (method, draft lengths, tokens, seconds, tokens/s) and the best lengths per method."""
    configs = [(method, lengths) for method in factories for lengths in grid[method]]
    runners = {c: factories[c[0]](c[1]) for c in configs}
    totals = {c: [0, 0.0] for c in configs}
    with tqdm(total=len(prompts) * len(configs), desc="sweep", unit="run") as bar:
        for tokens in prompts:
            for config in configs:
                record, _ = runners[config](tokens, SamplingParams(), max_tokens)
                totals[config][0] += record["tokens"]
                totals[config][1] += record["seconds"]
                bar.update(1)
    rows = [{"method": m, "draft_lengths": list(k), "tokens": n, "seconds": round(s, 3),
             "tokens_per_second": round(n / s, 3) if s else 0.0}
            for (m, k), (n, s) in totals.items()]
    return rows, best_lengths(rows)


def best_lengths(rows: list[dict]) -> dict[str, tuple[int, ...]]:
    best: dict[str, dict] = {}
    for row in rows:
        if row["method"] not in best or row["tokens_per_second"] > best[row["method"]]["tokens_per_second"]:
            best[row["method"]] = row
    return {m: tuple(r["draft_lengths"]) for m, r in best.items()}
