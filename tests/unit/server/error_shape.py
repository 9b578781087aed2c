"""OpenAI's error body, as the fuzz tests hold every 4xx to: a JSON object with exactly one key,
`error`, holding exactly `message` (a non-empty string), `type` (a non-empty string), `param`
and `code` (each a string or null, both present)."""

from __future__ import annotations

import json

import jsonschema

_NULLABLE_TEXT = {"type": ["string", "null"]}
ERROR_BODY = {
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "additionalProperties": False,
        "properties": {"message": {"type": "string", "minLength": 1}, "type": {"type": "string", "minLength": 1},
                       "param": _NULLABLE_TEXT, "code": _NULLABLE_TEXT},
    }},
}
_VALIDATOR = jsonschema.Draft202012Validator(ERROR_BODY)


def assert_openai_error(status: int, content_type: str | None, content: bytes) -> dict:
    """A 4xx answer's error object; an AssertionError saying what is wrong unless the answer
    is a 4xx with a JSON body of OpenAI's error shape."""
    assert 400 <= status < 500, f"expected a 4xx, got {status}: {content[:300]!r}"
    assert (content_type or "").split(";")[0].strip() == "application/json", \
        f"a {status} of content type {content_type!r}: {content[:300]!r}"
    try:
        body = json.loads(content)
    except ValueError:
        raise AssertionError(f"a {status} whose body is not JSON: {content[:300]!r}") from None
    return assert_error_body(body, f"a {status}")


def assert_error_body(body: object, what: str = "an error") -> dict:
    """The error object of an error body (a 4xx's, or a stream's error event); an
    AssertionError saying what is wrong unless it is OpenAI's error shape."""
    problems = [f"{'.'.join(map(str, e.absolute_path)) or 'body'}: {e.message}" for e in _VALIDATOR.iter_errors(body)]
    assert not problems, f"{what} whose body is not OpenAI's error shape ({'; '.join(problems)}): {body!r}"
    return body["error"]
