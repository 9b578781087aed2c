"""The horizon of one-time costs: what recent answers wrote beyond the current length, and
a draft's prefill priced against it."""

from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.sampling import SamplingParams
from specrouter.router.config import DEFAULT_CONFIG
from specrouter.router.estimates.lengths import AnswerLengths

from ..router_synth import PROMPT, linear
from .test_scheduler import seeded_router

DEFAULT = DEFAULT_CONFIG.default_horizon


def test_the_horizon_is_the_median_of_what_longer_answers_wrote_beyond_the_current_length():
    lengths = AnswerLengths(window=4)
    assert lengths.horizon(0, 1000) == DEFAULT and lengths.horizon(0, 100) == 100
    for n in (10, 12, 300, 14):
        lengths.record(n)
    assert lengths.horizon(0, 1000) == 12  # median_low of 10, 12, 14, 300
    assert lengths.horizon(11, 1000) == 3  # of 1, 289, 3 beyond 11
    assert lengths.horizon(20, 1000) == 280  # only the long answer ran past 20
    assert lengths.horizon(20, 50) == 50
    assert lengths.horizon(400, 1000) == DEFAULT  # no answer ran this long
    lengths.record(16)  # the window keeps the last 4: 12, 300, 14, 16
    assert lengths.horizon(0, 1000) == 14


def test_a_short_answer_to_a_long_prompt_never_pays_a_drafts_prefill():
    """A draft that pays once it has the context (0.8 acceptance, a tenth of the target's
    cost) but has not seen a 2,000-token prompt (~2 s to feed): worth it over 256 tokens,
    not when the answers of this deployment run ~12 tokens."""
    target = SyntheticBackend("t", latency=linear(0.05, 0.004), params_b=7)
    draft = SyntheticBackend("d", latency=linear(0.002, 0.001), params_b=1)
    router = seeded_router(target, [draft], {("d", "t"): 0.8})
    assert router.choose(2000, 256, {"t": 2000, "d": 0}, PROMPT).names == ["d", "t"]
    for n in (11, 12, 14, 9, 12):
        router.lengths.record(n)
    router.start(SamplingParams())
    assert router.choose(2000, 256, {"t": 2000, "d": 0}, PROMPT).names == ["t"]
    # a session shares the lengths: its first choice is as informed
    session = router.session()
    assert session.choose(2000, 256, {"t": 2000, "d": 0}, PROMPT).names == ["t"]
