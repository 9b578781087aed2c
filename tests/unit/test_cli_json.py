"""`specrouter generate --json`: the object it prints, over synthetic models standing in for
the pool (a draft that is a copy of the target, so every count follows from arithmetic)."""

import json

from click.testing import CliRunner

from specrouter import cli
from specrouter.backends.synthetic import SyntheticBackend
from specrouter.cascade.chain import Chain


class _SyntheticPool:
    """What `generate` asks of its Pool: a chain by names, and close()."""

    def __init__(self, **_options) -> None:
        self.models = {"copy": SyntheticBackend("copy", vocab=32, model_seed=5),
                       "target": SyntheticBackend("target", vocab=32)}

    def chain(self, specs, draft_lengths=None) -> Chain:
        return Chain([self.models[s] for s in specs], list(draft_lengths))

    def close(self) -> None:
        pass


def test_json_reports_the_run_and_each_levels_counts_per_draft_position(monkeypatch):
    monkeypatch.setattr(cli, "Pool", _SyntheticPool)
    result = CliRunner().invoke(cli.main, ["generate", "--prompt", "abc", "--chain", "copy,target",
                                           "--draft-lengths", "3", "--max-tokens", "12", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) == {"text", "token_ids", "finish_reason", "chain", "draft_lengths", "levels", "cycles",
                         "prompt_tokens", "completion_tokens", "mean_tokens_per_cycle", "wall_seconds",
                         "tokens_per_second", "evaluated_tokens", "cached_tokens", "chains_used",
                         "chains_per_cycle"}
    # 12 tokens in cycles of 3 accepted proposals and the target's next token: 3 cycles.
    assert (data["chain"], data["draft_lengths"], data["cycles"], data["completion_tokens"]) == (
        ["copy", "target"], [3], 3, 12)
    assert data["mean_tokens_per_cycle"] == 4.0 and data["finish_reason"] == "length"
    levels = [{k: v for k, v in level.items() if k != "seconds"} for level in data["levels"]]
    assert levels == [
        {"name": "copy", "proposed": 9, "accepted": 9, "acceptance": 1.0, "forwards": 9, "drafts": 3,
         "accepted_per_position": [3, 3, 3]},
        {"name": "target", "proposed": 0, "accepted": 0, "acceptance": None, "forwards": 3, "drafts": 0,
         "accepted_per_position": []},
    ]
    assert all(isinstance(level["seconds"], float) for level in data["levels"])
