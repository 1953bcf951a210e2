"""A schemathesis check (loaded through SCHEMATHESIS_HOOKS): every 4xx/5xx answer has the OpenAI
error shape, ``{"error": {"message", "type", "param", "code"}}`` with a message."""

import schemathesis


@schemathesis.check
def openai_error_shape(ctx, response, case):
    if response.status_code < 400:
        return
    try:
        err = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"HTTP {response.status_code} without an OpenAI error body: {response.text[:200]}")
    missing = {"message", "type", "param", "code"} - set(err)
    if missing or not err["message"]:
        raise AssertionError(f"HTTP {response.status_code} error body lacks {sorted(missing)}: {response.text[:200]}")
