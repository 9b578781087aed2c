"""Every error a user can cause has its own type and a message that names the problem.

The CLI and (later) the server catch SpecRouterError and print/return the message:
no traceback ever reaches a user for bad input.
"""


class SpecRouterError(Exception):
    """Base class of every error specrouter raises on purpose."""


class InvalidParameterError(SpecRouterError, ValueError):
    """A sampling or generation parameter is outside its valid range."""


class InvalidChainError(InvalidParameterError):
    """A chain names a level that is not served, or names one level twice."""


class UnknownModelError(SpecRouterError, KeyError):
    """A chain names a model that is neither in the pool nor an existing file."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class ModelFileError(SpecRouterError):
    """A model file is missing, unreadable, corrupt or fails its checksum."""


class RegistryError(SpecRouterError):
    """The package registry that carries the default models could not be reached."""


class TokenizerMismatchError(SpecRouterError):
    """Two models in one chain do not share a tokenizer."""


class PromptTooLongError(SpecRouterError):
    """The prompt does not fit in a model's context window."""


class ChatTemplateError(SpecRouterError):
    """The model's chat template refused the messages (a role or an order it cannot render)."""


class EmptyPromptError(SpecRouterError):
    """The prompt has no tokens."""


class InvalidTokenIdError(SpecRouterError):
    """A prompt token id is outside the target's vocabulary."""


class InvalidLogitBiasError(InvalidTokenIdError):
    """A logit_bias token id is outside the target's vocabulary."""


class BackendError(SpecRouterError):
    """A backend failed while computing (e.g. llama_decode returned an error)."""


class InvalidGrammarError(InvalidParameterError):
    """A structured-output grammar (JSON schema, regex, GBNF, Lark) that cannot be compiled."""
