"""A schemathesis check (loaded through SCHEMATHESIS_HOOKS): every 4xx/5xx answer has its route's
error shape: Anthropic's on the Messages routes (``{"type": "error", "error": {"type",
"message"}}``), OpenAI's everywhere else (``{"error": {"message", "type", "param", "code"}}``),
with a message."""

import schemathesis


@schemathesis.check
def openai_error_shape(ctx, response, case):
    if response.status_code < 400:
        return
    anthropic = case.path.startswith("/v1/messages")
    try:
        body = response.json()
        err = body["error"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"HTTP {response.status_code} without an error body: {response.text[:200]}")
    if anthropic and body.get("type") != "error":
        raise AssertionError(f"HTTP {response.status_code} on a Messages route not in Anthropic's shape: {response.text[:200]}")
    missing = ({"type", "message"} if anthropic else {"message", "type", "param", "code"}) - set(err)
    if missing or not err["message"]:
        raise AssertionError(f"HTTP {response.status_code} error body lacks {sorted(missing)}: {response.text[:200]}")
