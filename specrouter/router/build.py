"""Building a Router over a pool: which models may draft for the target (a shared
tokenizer, smaller), and what the user is told about the ones left out."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specrouter.backends.base import Backend
from specrouter.errors import TokenizerMismatchError
from specrouter.router.estimates.acceptance import AcceptanceEstimator
from specrouter.router.estimates.costs import OnlineCosts
from specrouter.router.session import Router
from specrouter.vocab import check_shared_tokenizer


def sharing_drafts(target: Backend, models: Sequence[Backend]) -> tuple[list[Backend], list[str]]:
    """The models smaller than the target that share its tokenizer, and why others were left out."""
    drafts, skipped = [], []
    for model in models:
        if model is target or model.name == target.name:
            continue
        if model.params_b >= target.params_b:
            skipped.append(f"{model.name} (not smaller than the target)")
            continue
        try:
            check_shared_tokenizer([model, target])
        except TokenizerMismatchError:
            skipped.append(f"{model.name} (another tokenizer)")
            continue
        drafts.append(model)
    return drafts, skipped


def build_router(target: Backend, models: Sequence[Backend],
                 costs: OnlineCosts | Callable[[list[Backend]], OnlineCosts],
                 acceptance: AcceptanceEstimator | None = None, **kw) -> Router:
    """A Router over the target, the given models that can draft for it, and the model-free level.
    `costs` may be a function of the models kept (so only those get profiled).
    With no model sharing the target's tokenizer it says so: only the target alone and
    the model-free level (it shares any tokenizer) remain."""
    drafts, skipped = sharing_drafts(target, models)
    if not isinstance(costs, OnlineCosts):
        costs = costs([*drafts, target])
    message = None
    if not drafts:
        message = (f"no draft model shares the tokenizer of {target.name}"
                   + (f" (left out: {', '.join(skipped)})" if skipped else "")
                   + f": falling back to {target.name} alone (and the n-gram drafter where it pays)")
    elif skipped:
        message = f"left out of routing: {', '.join(skipped)}"
    return Router(target, drafts, costs, acceptance, message=message, **kw)
