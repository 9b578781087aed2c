"""The methods a comparison runs: the target alone (the reference), `auto` (the router), and
the fixed chains of `--chain LEVELS[:DRAFT_LENGTHS]`.

LEVELS: comma-separated, cheapest first, as `generate --chain` takes them (pool names, .gguf
paths, transformers folders, `ngram` or `suffix` first); the target may end them or be left
off (it is appended: every method ends at the same target). DRAFT_LENGTHS: comma-separated,
one per level below the target (default DEFAULT_DRAFT_LENGTH each). The text after the last
`:` is read as draft lengths unless it holds a path separator (a Windows drive letter).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specrouter.cascade.chain import Chain, check_chain
from specrouter.engine.chain_router import ChainRouter
from specrouter.errors import InvalidParameterError
from specrouter.pool import DEFAULT_DRAFT_LENGTH, Pool, parse_chain

ALONE, AUTO = "target alone", "auto"


@dataclass(frozen=True)
class ChainSpec:
    """A fixed chain of --chain: its levels below the target, cheapest first, and each one's
    draft length. Its label ("suffix,qwen2.5-coder-0.5b:16,4") names it in every output."""

    drafts: tuple[str, ...]
    draft_lengths: tuple[int, ...]

    @property
    def label(self) -> str:
        return f"{','.join(self.drafts)}:{','.join(map(str, self.draft_lengths))}"


@dataclass(frozen=True)
class Method:
    """A label and what generate runs for it."""

    label: str
    runner: Chain | ChainRouter


def parse_chain_spec(text: str, target: str) -> ChainSpec:
    """One --chain value (module docstring), checked against `target` (the compared target's
    spec) before any model loads."""
    levels_text, lengths_text = text, None
    head, colon, tail = text.rpartition(":")
    if colon and "/" not in tail and "\\" not in tail:
        levels_text, lengths_text = head, tail
    levels = parse_chain(levels_text)
    if levels in (["auto"], ["off"]):
        raise InvalidParameterError(f"--chain {text!r}: the target alone and auto always run; --chain adds a "
                                    f"fixed chain, LEVELS[:DRAFT_LENGTHS]")
    if levels[-1] == target:
        levels = levels[:-1]
    if not levels:
        raise InvalidParameterError(f"--chain {text!r} is the target alone, which always runs")
    if lengths_text is None:
        lengths = [DEFAULT_DRAFT_LENGTH] * len(levels)
    else:
        try:
            lengths = [int(s) for s in lengths_text.split(",")]
        except ValueError:
            raise InvalidParameterError(f"--chain {text!r}: the draft lengths after ':' must be comma-separated "
                                        f"integers, got {lengths_text!r}") from None
    try:
        check_chain([*levels, target], lengths)
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"--chain {text!r}: {exc}") from None
    return ChainSpec(tuple(levels), tuple(lengths))


def parse_chain_specs(texts: Sequence[str], target: str) -> list[ChainSpec]:
    """Every --chain value, in order; two that name the same chain are an error."""
    specs: list[ChainSpec] = []
    for text in texts:
        spec = parse_chain_spec(text, target)
        if spec in specs:
            raise InvalidParameterError(f"--chain {text!r} names {spec.label} a second time")
        specs.append(spec)
    return specs


def build_methods(pool: Pool, target: str, router: ChainRouter, chains: Sequence[ChainSpec]) -> list[Method]:
    """The target alone (first: the reference), auto, then each fixed chain, from `pool`."""
    return [Method(ALONE, pool.chain([target])), Method(AUTO, router),
            *(Method(c.label, pool.chain([*c.drafts, target], list(c.draft_lengths))) for c in chains)]
