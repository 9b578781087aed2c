"""Every error a user can cause has its own type and a message that names the problem.

Client text and engine text quoted in a message or a log line are clipped (`clip`), and an
unexpected exception is logged as one bounded record (`log_failure`).

The CLI and the server catch SpecRouterError and print or return the message: no
traceback ever reaches a user for bad input.
"""

import logging
import traceback


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


def clip(text: str, limit: int = 200) -> str:
    """Client-supplied or engine text as an error message or a log line quotes it: at most
    `limit` characters (the rest counted), and encodable (a lone surrogate shown escaped)."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit:,} more characters)"


def log_failure(logger: logging.Logger, what: str, exc: BaseException) -> None:
    """One log record of an unexpected exception: its type, its message clipped, and its
    traceback's frames (never a client's whole prompt or grammar quoted in a message)."""
    frames = "".join(traceback.format_tb(exc.__traceback__))
    logger.error("%s: %s: %s\n%s", what, type(exc).__name__, clip(str(exc), 500), frames)
