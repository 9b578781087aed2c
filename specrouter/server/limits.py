"""What a request may ask for, in tokens: the longest prompt (checked on characters before
tokenizing where that already tells) and the longest answer the context leaves room for."""

from __future__ import annotations

from dataclasses import dataclass

from specrouter.errors import PromptTooLongError
from specrouter.server.api_errors import APIError


@dataclass(frozen=True)
class PromptLimit:
    """The longest prompt a request may send, in tokens, and the bound on its characters that
    already tells, before tokenizing: no token of the vocabulary spells more than
    `chars_per_token` characters (its longest text in bytes, which is at least its
    characters), so a text of more than tokens x chars_per_token characters has more than
    `tokens` tokens, whatever it says: a huge text is refused without the CPU time of
    tokenizing it."""

    tokens: int
    chars_per_token: int
    #: The target's context: a prompt and its answer together.
    context: int

    @classmethod
    def of(cls, target, max_prompt_tokens: int | None) -> PromptLimit:
        """max_prompt_tokens, or the target's context less the one position generation needs."""
        longest = max((len(text) for text in target.vocab_texts()), default=1)
        return cls(max_prompt_tokens or target.n_ctx - 1, max(1, longest), target.n_ctx)

    def check_text(self, texts: list[str]) -> None:
        chars = sum(len(t) for t in texts)
        if chars > self.tokens * self.chars_per_token:
            raise PromptTooLongError(f"the prompt has {chars} characters: more than the {self.tokens} tokens a prompt "
                                     f"may have, whatever they are (no token spells more than "
                                     f"{self.chars_per_token}); shorten it")

    def check_tokens(self, tokens: list[int]) -> None:
        if len(tokens) > self.tokens:
            raise PromptTooLongError(f"the prompt has {len(tokens)} tokens; at most {self.tokens} are accepted")



    def answer_tokens(self, prompt_tokens: int, asked: int | None, default: int) -> int:
        """A request's max_tokens: what it asked for, which the context must hold after its
        prompt (else a 400, as OpenAI's API answers), or the server's default clamped to
        what the context leaves."""
        room = self.context - prompt_tokens
        if asked is None:
            return max(1, min(default, room))
        if asked > room:
            raise APIError(400, f"the context holds {self.context} tokens: the prompt's {prompt_tokens} leave room for "
                                f"{room}, and max_tokens asks for {asked:,}; ask for fewer", param="max_tokens",
                           code="context_length_exceeded")
        return asked
